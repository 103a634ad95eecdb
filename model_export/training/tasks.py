"""Tasks bind a dataset to a model family: training batches (with augmentation) and eval batches.

Each task yields (inputs: dict of named tensors for model(**inputs), labels [B]).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lara_serve.model_export.training import data
from lara_serve.model_export.training.long_docs import LengthMixTask

Batch = tuple[dict[str, Tensor], Tensor]


def _augment_images(x: Tensor, g: torch.Generator, pad: int = 2) -> Tensor:
    """Random crop with zero padding and horizontal flip, per example. x: uint8 [B, 1, H, W]."""
    b, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))  # [B, 1, H+2p, W+2p]
    off = torch.randint(0, 2 * pad + 1, (b, 2), generator=g)
    out = torch.stack([padded[i, :, oy : oy + h, ox : ox + w] for i, (oy, ox) in enumerate(off.tolist())])
    flip = torch.rand(b, generator=g) < 0.5
    return torch.where(flip[:, None, None, None], out.flip(-1), out)


def _rotate_images(x: Tensor, g: torch.Generator, max_deg: float) -> Tensor:
    """Each image rotated about its centre by an angle uniform in [-max_deg, max_deg] (bilinear, zero fill,
    as a photo taken slightly askew). x: uint8 [B, 1, H, W] -> uint8, same shape."""
    b = x.shape[0]
    theta = (torch.rand(b, generator=g) * 2 - 1) * max_deg * torch.pi / 180  # [B]
    cos, sin = theta.cos(), theta.sin()
    affine = torch.stack([torch.stack([cos, -sin, torch.zeros(b)], -1), torch.stack([sin, cos, torch.zeros(b)], -1)], 1)
    grid = torch.nn.functional.affine_grid(affine, list(x.shape), align_corners=False)  # [B, H, W, 2]
    out = torch.nn.functional.grid_sample(x.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.round().clamp(0, 255).to(torch.uint8)


@dataclass
class ImageTask:
    """Fashion-MNIST: uint8 images are normalized with the config's mean/std (the server's preprocessing)."""

    images: Tensor
    labels: Tensor
    mean: float
    std: float
    augment: bool = True
    shift: int = 2  # random crop: shifts of up to this many pixels each way
    rotate_deg: float = 0.0  # > 0: also a random rotation of up to this many degrees
    # brightness, contrast, gamma, blur, noise, JPEG after the geometry (augment_image.ImagePhotometric)
    photometric: Callable[[Tensor, torch.Generator], Tensor] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def train_batches(self, batch_size: int, g: torch.Generator) -> Iterator[Batch]:
        perm = torch.randperm(len(self), generator=g)
        for i in range(0, len(perm) - batch_size + 1, batch_size):  # drop the ragged last batch
            idx = perm[i : i + batch_size]
            x = self.images[idx]
            if self.augment:
                x = _augment_images(x, g, pad=self.shift)
                if self.rotate_deg > 0:
                    x = _rotate_images(x, g, self.rotate_deg)
                if self.photometric is not None:
                    x = self.photometric(x, g)
            yield {"pixel_values": data.normalize_images(x, self.mean, self.std)}, self.labels[idx]

    def eval_batches(self, batch_size: int) -> Iterator[Batch]:
        for i in range(0, len(self), batch_size):
            x = data.normalize_images(self.images[i : i + batch_size], self.mean, self.std)
            yield {"pixel_values": x}, self.labels[i : i + batch_size]

    def steps_per_epoch(self, batch_size: int) -> int:
        return len(self) // batch_size


@dataclass
class SequenceTask:
    """Token sequences (byte ids): length-bucketed batches, right padding, attention_mask."""

    seqs: list[list[int]]
    labels: Tensor
    train_length: int  # truncation for training
    eval_length: int  # truncation for evaluation (the model's max_length)

    def __len__(self) -> int:
        return len(self.labels)

    def train_batches(self, batch_size: int, g: torch.Generator) -> Iterator[Batch]:
        perm = torch.randperm(len(self), generator=g).tolist()
        # Sort within windows of 32 batches to cut padding while keeping batches random.
        win = batch_size * 32
        batches: list[list[int]] = []
        for s in range(0, len(perm), win):
            chunk = sorted(perm[s : s + win], key=lambda i: len(self.seqs[i]))
            batches += [chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size)]
        order = torch.randperm(len(batches), generator=g).tolist()
        for b in order:
            idx = batches[b]
            ids, mask = data.pad_batch([self.seqs[i][: self.train_length] for i in idx])
            yield {"input_ids": ids, "attention_mask": mask}, self.labels[idx]

    def eval_batches(self, batch_size: int) -> Iterator[Batch]:
        for i in range(0, len(self), batch_size):
            ids, mask = data.pad_batch([s[: self.eval_length] for s in self.seqs[i : i + batch_size]])
            yield {"input_ids": ids, "attention_mask": mask}, self.labels[i : i + batch_size]

    def steps_per_epoch(self, batch_size: int) -> int:
        return math.ceil(len(self) / batch_size)


Task = ImageTask | SequenceTask | LengthMixTask
HOLDOUT = {"fashion": 2000, "news": 150, "brown": 40}  # seeded per-epoch validation docs (seed 1234)


FOLD_SEED = 1234


def fold_split(fold: int, n_folds: int, part: str) -> str:
    """The split name of k-fold cross-validation over ALL of a text dataset (its test split included):
    part "train" is every fold but `fold`, part "test" is fold `fold`."""
    if not 0 <= fold < n_folds or part not in ("train", "test"):
        raise ValueError(f"fold must be in 0..{n_folds - 1} and part train|test, got {fold}, {part!r}")
    return f"fold:{fold}/{n_folds}:{part}"


def is_train_split(split: str) -> bool:
    return split in ("train", "trainval") or split.endswith(":train")


def text_docs(dataset: str, split: str) -> tuple[list[str], list[int]]:
    """(texts, labels) of a text dataset's split: "train" | "val" | "test" | "trainval" (train + holdout),
    or a k-fold part over all documents (`fold_split`; stratified by label, seed FOLD_SEED)."""
    fold = re.fullmatch(r"fold:(\d+)/(\d+):(train|test)", split)
    pick = "all" if fold else "test" if split == "test" else "train"
    if dataset == "news":
        docs = data.load_news("train") + data.load_news("test") if pick == "all" else data.load_news(pick)
        texts, labels = [d.text for d in docs], [d.label for d in docs]
    elif dataset == "brown":
        from lara_serve.model_export.training.brown import load_brown

        bdocs = load_brown(pick)
        texts, labels = [d.text for d in bdocs], [d.label for d in bdocs]
    else:
        raise ValueError(f"{dataset!r} is not a text-document dataset (news, brown)")
    if fold:
        k, n_folds, part = int(fold[1]), int(fold[2]), fold[3]
        of = data.stratified_folds(labels, n_folds, FOLD_SEED)
        keep = [i for i, f in enumerate(of) if (f == k) == (part == "test")]
        if part == "test":
            # Classes interleaved (the first of each class, then the second of each, ...): a prefix, as
            # --eval-limit takes for per-epoch progress, holds every class. The documents are the same.
            turn: dict[int, int] = {}
            count: dict[int, int] = {}
            for i in keep:
                turn[i] = count.get(labels[i], 0)
                count[labels[i]] = turn[i] + 1
            keep.sort(key=lambda i: (turn[i], labels[i]))
        return [texts[i] for i in keep], [labels[i] for i in keep]
    if split in ("train", "val"):
        tr, va = data.holdout_split(len(texts), HOLDOUT[dataset], seed=1234)
        keep = (tr if split == "train" else va).tolist()
        texts, labels = [texts[i] for i in keep], [labels[i] for i in keep]
    return texts, labels


def document_ids(task: Task) -> list[Tensor]:
    """Each whole training document of a text task as a 1-D tensor of ids (byte + 1)."""
    if isinstance(task, LengthMixTask):
        return [torch.tensor([b + 1 for b in raw], dtype=torch.int64) for raw in task.docs]
    if isinstance(task, SequenceTask):
        return [torch.tensor(seq, dtype=torch.int64) for seq in task.seqs]
    raise TypeError(f"document_ids needs a text task, got {type(task).__name__}")


def _subset(task: Task, idx: Tensor) -> Task:
    if isinstance(task, LengthMixTask):
        return dataclasses.replace(task, docs=[task.docs[i] for i in idx.tolist()], labels=task.labels[idx])
    if isinstance(task, ImageTask):
        return dataclasses.replace(task, images=task.images[idx], labels=task.labels[idx])
    return SequenceTask([task.seqs[i] for i in idx.tolist()], task.labels[idx], task.train_length, task.eval_length)


def load_task(
    dataset: str,
    split: str,
    cfg: Any,
    train_length: int | None = None,
    limit: int | None = None,
    length_mix: dict[str, Any] | None = None,
) -> Task:
    """split: "train" | "val" | "test" | "trainval". val is a seeded holdout of the train split.

    length_mix (text datasets, training): LengthMixTask settings for mixed-length windows and composites.
    """
    if split.startswith("fold:") and dataset not in ("news", "brown"):
        raise ValueError(f"k-fold splits are for the text-document datasets (news, brown), not {dataset!r}")
    base = "test" if split == "test" else "train"
    if dataset in ("news", "brown") and (length_mix is not None or dataset == "brown" or split.startswith("fold:")):
        texts, labels = text_docs(dataset, split)
        raws = [t.encode("utf-8") for t in texts]
        y = torch.tensor(labels, dtype=torch.int64)
        if is_train_split(split) and length_mix is not None:
            task: Task = LengthMixTask(raws, y, cfg.max_length, **length_mix)
        else:
            task = SequenceTask([[b + 1 for b in r[: cfg.max_length]] for r in raws], y, cfg.max_length, cfg.max_length)
        if limit is not None and limit < len(task):
            task = _subset(task, torch.arange(limit))
        return task
    if dataset == "fashion":
        images, labels = data.load_fashion(base)
        task = ImageTask(images, labels, cfg.mean, cfg.std, augment=split == "train")
        n_val = HOLDOUT["fashion"]
    elif dataset == "news":
        docs = data.load_news(base)
        seqs = [data.encode_bytes(d.text, cfg.max_length) for d in docs]
        labels = torch.tensor([d.label for d in docs], dtype=torch.int64)
        task = SequenceTask(seqs, labels, train_length or cfg.max_length, cfg.max_length)
        n_val = HOLDOUT["news"]
    else:
        raise ValueError(f"unknown dataset {dataset!r}")
    if split in ("train", "val") and n_val:
        tr, va = data.holdout_split(len(task), n_val, seed=1234)
        task = _subset(task, tr if split == "train" else va)
    if limit is not None and limit < len(task):
        task = _subset(task, torch.arange(limit))
    return task
