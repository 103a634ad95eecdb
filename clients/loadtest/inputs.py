"""What the load tester sends: synthetic texts of exact byte lengths, real files, or a built-in test set.

An `InputGroup` is one point on the x-axis of the charts: a set of payloads of one kind (text or image)
whose mean size in bytes is the group's length.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

InputKind = Literal["text", "image"]
T = TypeVar("T")

SYNTHETIC_DOCS = 16  # distinct documents per synthetic length, so no cache sees one body repeated
BUILTIN_LIMIT = 512  # items taken from a built-in set (the sets are larger than any test needs)
_WORDS = ["the", "of", "market", "team", "match", "election", "chip", "price", "goal", "vote", "launch",
          "league", "bank", "orbit"]  # fmt: skip
# Magic numbers of the image formats the server decodes -> Content-Type for `:classify`.
_IMAGE_MAGIC: list[tuple[bytes, str]] = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
]
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"


class InputError(ValueError):
    """The inputs cannot be used (unreadable file, unknown set, kind mismatch): a usage error."""


@dataclass(frozen=True)
class Payload:
    kind: InputKind
    data: bytes
    content_type: str  # what `:classify` sends as Content-Type


@dataclass(frozen=True)
class InputGroup:
    name: str  # "4096 B", "bbc-test", "files"
    kind: InputKind
    payloads: tuple[Payload, ...]
    synthetic_bytes: int | None = None  # the requested length for synthetic texts

    @property
    def mean_bytes(self) -> float:
        return sum(len(p.data) for p in self.payloads) / len(self.payloads)


def make_doc(n_bytes: int, seed: int) -> str:
    """Deterministic ASCII text of exactly n_bytes bytes (word salad: the model's speed, not its accuracy)."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < n_bytes:
        words.append(rng.choice(_WORDS))
        size += len(words[-1]) + 1
    return " ".join(words)[:n_bytes].ljust(n_bytes, "x")


def synthetic_text(n_bytes: int, count: int = SYNTHETIC_DOCS) -> InputGroup:
    if n_bytes < 1:
        raise InputError(f"text lengths must be at least 1 byte, got {n_bytes}")
    docs = tuple(Payload("text", make_doc(n_bytes, seed).encode(), TEXT_CONTENT_TYPE) for seed in range(count))
    return InputGroup(f"{n_bytes} B", "text", docs, synthetic_bytes=n_bytes)


def synthetic_images(count: int = SYNTHETIC_DOCS, size: int = 28, seed: int = 0) -> InputGroup:
    """Seeded grayscale noise PNGs: the server decodes and resizes them like any photo."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    payloads = []
    for _ in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8)).save(buffer, format="PNG")
        payloads.append(Payload("image", buffer.getvalue(), "image/png"))
    return InputGroup("synthetic-png", "image", tuple(payloads))


def sniff(data: bytes, origin: str) -> Payload:
    """Image if the bytes start like one the server decodes, else UTF-8 text, else a usage error."""
    for magic, content_type in _IMAGE_MAGIC:
        if data.startswith(magic):
            return Payload("image", data, content_type)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return Payload("image", data, "image/webp")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{origin}: neither an image (PNG, JPEG, GIF, BMP, WebP) nor UTF-8 text") from None
    if not data:
        raise InputError(f"{origin}: empty file")
    return Payload("text", data, TEXT_CONTENT_TYPE)


def from_paths(paths: Sequence[Path]) -> InputGroup:
    """Files, and folders read recursively (hidden files skipped); all must be of one kind."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")))
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"{path}: no such file or folder")
    if not files:
        raise InputError(f"no files under {[str(p) for p in paths]}")
    payloads = []
    for f in files:
        try:
            payloads.append(sniff(f.read_bytes(), str(f)))
        except OSError as exc:
            raise InputError(f"{f}: {exc.strerror}") from None
    kinds = sorted({p.kind for p in payloads})
    if len(kinds) > 1:
        raise InputError(f"the files mix {' and '.join(kinds)}; give one kind per run (a model takes one)")
    return InputGroup("files", payloads[0].kind, tuple(payloads))


# -- built-in sets: the projects' own test splits, loaded lazily (they need model_export and its data) ------


def _test_split(name: str, load: Callable[[str], T], unavailable: type[Exception]) -> T:
    """The built-in set's test split; its loader's "data missing" error becomes an InputError naming the set."""
    try:
        return load("test")
    except unavailable as exc:
        raise InputError(f"built-in set {name!r} is unavailable: {exc}") from None


def _texts(name: str, docs: Sequence[Any]) -> InputGroup:
    payloads = tuple(Payload("text", d.text.encode(), TEXT_CONTENT_TYPE) for d in docs[:BUILTIN_LIMIT])
    return InputGroup(f"{name}-test", "text", payloads)


def _bbc() -> InputGroup:
    from lara_serve.model_export.training.data import DataUnavailable, load_news

    return _texts("bbc", _test_split("bbc", load_news, DataUnavailable))


def _brown() -> InputGroup:
    try:
        from lara_serve.model_export.training.brown import BrownUnavailable, load_brown
    except ImportError:
        raise InputError(
            "built-in set 'brown' needs lara_serve.model_export.training.brown, which this checkout lacks"
        ) from None
    return _texts("brown", _test_split("brown", load_brown, BrownUnavailable))


def _fashion() -> InputGroup:
    from PIL import Image

    from lara_serve.model_export.training.data import DataUnavailable, load_fashion

    images, _ = _test_split("fashion", load_fashion, DataUnavailable)
    payloads = []
    for image in images[:BUILTIN_LIMIT].numpy():  # uint8 [1, 28, 28] each
        buffer = io.BytesIO()
        Image.fromarray(image[0]).save(buffer, format="PNG")  # 2-D uint8 -> mode "L"
        payloads.append(Payload("image", buffer.getvalue(), "image/png"))
    return InputGroup("fashion-test", "image", tuple(payloads))


# -- examples shipped inside this package (clients/loadtest/examples/, package data): every install has them ----

EXAMPLES = Path(__file__).resolve().parent / "examples"


def _examples(kind: InputKind) -> InputGroup:
    suffixes = {"text": (".txt",), "image": (".png",)}[kind]
    files = sorted(p for p in EXAMPLES.glob("*") if p.suffix in suffixes) if EXAMPLES.is_dir() else []
    if not files:
        # Only an install built without the package data gets here.
        raise InputError(f"built-in set 'examples-{kind}' reads {EXAMPLES}, which holds no {'/'.join(suffixes)} "
                         "files (an install without the package's data); use --lengths or --files")  # fmt: skip
    group = from_paths(files)
    return InputGroup(f"examples-{kind}", kind, group.payloads)


BUILTIN_SETS: dict[str, Callable[[], InputGroup]] = {
    "bbc": _bbc,
    "brown": _brown,
    "fashion": _fashion,
    "examples-text": lambda: _examples("text"),
    "examples-image": lambda: _examples("image"),
}
BUILTIN_KINDS: dict[str, InputKind] = {  # known before loading
    "bbc": "text",
    "brown": "text",
    "fashion": "image",
    "examples-text": "text",
    "examples-image": "image",
}


def kind_hint(task: str) -> str:
    """What to give a model of this task instead."""
    if task == "text":
        return "--lengths, text files or --set examples-text/bbc/brown"
    return "image files or --set examples-image/fashion"


def builtin(name: str) -> InputGroup:
    if name not in BUILTIN_SETS:
        raise InputError(f"unknown built-in set {name!r}; choose from {sorted(BUILTIN_SETS)}")
    try:
        return BUILTIN_SETS[name]()
    except ImportError as exc:
        # The lean install (make serve) has no torch: say what works there instead.
        raise InputError(f"built-in set {name!r} needs the full install with its data ({exc}); without it use "
                         "--set examples-text or examples-image (shipped with the client), --lengths or --files") from None  # fmt: skip
