"""Long-document data: mixed-length training windows, same-label composites, accuracy vs length.

A model that only ever sees documents of one length learns that length. Training here draws, per example,
a target length (log-uniform) and either a random window of one document or a window of a *composite*:
same-label documents joined end to end. Batches are packed to a token budget (padded length x count), so a
batch holds many short windows or a few long ones at about the same cost.

Composites for evaluation are seeded and defined here once (`make_composites`): the README's accuracy-vs-
length table, the benchmark and the regression test all build the same documents.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lara_serve.model_export.training import data

SEPARATOR = b"\n\n"
COMPOSITE_SEED = 2022


def make_composites(
    texts: Sequence[str], labels: Sequence[int], length: int, per_class: int, seed: int = COMPOSITE_SEED
) -> list[tuple[bytes, int]]:
    """`per_class` documents of exactly `length` bytes per label: shuffled same-label texts joined by a blank
    line, cut at `length`. Seeded by (seed, length, label), so adding a length does not change the others."""
    by_label: dict[int, list[bytes]] = {}
    for t, y in zip(texts, labels, strict=True):
        by_label.setdefault(int(y), []).append(t.encode("utf-8"))
    out = []
    for y in sorted(by_label):
        pool = by_label[y]
        rng = random.Random(f"{seed}:{length}:{y}")
        for _ in range(per_class):
            order = rng.sample(range(len(pool)), len(pool))
            parts, size, i = [], 0, 0
            while size < length:
                doc = pool[order[i % len(order)]]
                parts.append(doc)
                size += len(doc) + len(SEPARATOR)
                i += 1
            out.append((SEPARATOR.join(parts)[:length], y))
    return out


def to_ids(raw: bytes) -> list[int]:
    """Bytes -> byte ids (+1; 0 is pad), the server's preprocessing."""
    return [b + 1 for b in raw]


@dataclass
class LengthMixTask:
    """Training on mixed lengths; evaluation on whole documents (up to eval_length).

    min_length..max_length: log-uniform window length; composite_prob: chance that an example is a window
    of a same-label composite of length composite_min..composite_max; head_prob: chance
    that a plain window starts at the document's head; tokens_per_batch: the batch budget; teacher:
    optional soft targets (window bytes, document indices) -> class probabilities (lara_serve.model_export.training.distill),
    yielded as a third batch element.
    """

    docs: list[bytes]
    labels: Tensor
    eval_length: int
    min_length: int = 256
    max_length: int = 8192
    composite_prob: float = 0.0
    head_prob: float = 0.0
    composite_min: int = 4096
    composite_max: int = 16384
    tokens_per_batch: int = 24576
    # A batch closes only once it holds this many examples, even past the token budget: a long window gets a
    # partner of similar length (the plan is sorted by length), so each process of a 2-process data-parallel
    # run has an example to compute every step instead of idling through the all-reduce. 1 replays the
    # shipped models' epochs exactly.
    min_examples: int = 1
    teacher: Callable[[Sequence[bytes], Sequence[int]], Tensor] | None = None
    # Label-preserving noise and unrelated filler applied to each window (lara_serve.model_export.training.augment.TextAugment);
    # None draws nothing, so runs without it replay the same epochs as before it existed.
    text_augment: Callable[[bytes, random.Random], bytes] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def _example(self, rng: random.Random, by_label: dict[int, list[int]]) -> tuple[bytes, int, int]:
        """(window bytes, label, index of the window's (first) document)."""
        i = rng.randrange(len(self.docs))
        y = int(self.labels[i])
        if rng.random() < self.composite_prob:
            length = int(math.exp(rng.uniform(math.log(self.composite_min), math.log(self.composite_max))))
            parts, size = [], 0
            while size < length + length // 2:  # enough for a window that does not always start at a doc
                doc = self.docs[rng.choice(by_label[y])] if parts else self.docs[i]
                parts.append(doc)
                size += len(doc) + len(SEPARATOR)
            raw = SEPARATOR.join(parts)
        else:
            length = int(math.exp(rng.uniform(math.log(self.min_length), math.log(self.max_length))))
            raw = self.docs[i]
        if len(raw) > length:
            # head_prob: the window starts at the document's first byte, as a head-truncated request does
            # (the server's default); 0 draws nothing extra, so earlier seeds give the same epochs.
            head = self.head_prob > 0.0 and rng.random() < self.head_prob
            start = 0 if head else rng.randrange(len(raw) - length + 1)
            raw = raw[start : start + length]
        if self.text_augment is not None:
            raw = self.text_augment(raw, rng)
        return raw, y, i

    def _plan(self, seed: int) -> list[list[tuple[bytes, int, int]]]:
        """One epoch (len(self) examples) packed into token-budget batches, in a seeded random order."""
        rng = random.Random(seed)
        by_label: dict[int, list[int]] = {}
        for j, y in enumerate(self.labels.tolist()):
            by_label.setdefault(y, []).append(j)
        examples = sorted((self._example(rng, by_label) for _ in range(len(self))), key=lambda e: len(e[0]))
        batches: list[list[tuple[bytes, int, int]]] = [[]]
        for ex in examples:  # ascending length: the newest member is the longest, so cost = len x count
            count = len(batches[-1])
            if count >= self.min_examples and len(ex[0]) * (count + 1) > self.tokens_per_batch:
                batches.append([])
            batches[-1].append(ex)
        if len(batches) > 1 and len(batches[-1]) < self.min_examples:
            batches[-2].extend(batches.pop())  # the longest leftovers join the batch before them
        rng.shuffle(batches)
        return batches

    def train_batches(self, batch_size: int, g: torch.Generator) -> Iterator[tuple[Any, ...]]:
        """(inputs, labels) per batch, or (inputs, labels, teacher probabilities) with a teacher."""
        del batch_size  # the token budget decides the batch size
        for batch in self._plan(int(torch.randint(0, 2**31 - 1, (1,), generator=g))):
            raws = [raw for raw, _, _ in batch]
            ids, mask = data.pad_batch([to_ids(raw) for raw in raws])
            inputs, labels = {"input_ids": ids, "attention_mask": mask}, torch.tensor([y for _, y, _ in batch])
            if self.teacher is None:
                yield inputs, labels
            else:
                yield inputs, labels, self.teacher(raws, [i for _, _, i in batch])

    def steps_per_epoch(self, batch_size: int) -> int:
        del batch_size
        return len(self._plan(0))

    def eval_batches(self, batch_size: int) -> Iterator[tuple[dict[str, Tensor], Tensor]]:
        yield from length_batches([d[: self.eval_length] for d in self.docs], self.labels.tolist(), batch_size)


def length_groups(raws: Sequence[bytes], batch_size: int, tokens_per_batch: int = 65536) -> Iterator[list[int]]:
    """Indices of `raws` in evaluation batches sorted by length (little padding), at most batch_size items or
    the token budget (padded length x count) each."""
    order = sorted(range(len(raws)), key=lambda i: len(raws[i]))
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) >= batch_size or len(raws[i]) * (len(batch) + 1) > tokens_per_batch):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def length_batches(
    raws: Sequence[bytes], labels: Sequence[int], batch_size: int, tokens_per_batch: int = 65536
) -> Iterator[tuple[dict[str, Tensor], Tensor]]:
    """Evaluation batches (inputs, labels) of `length_groups`."""
    for idx in length_groups(raws, batch_size, tokens_per_batch):
        yield _collate(raws, labels, idx)


def _collate(raws: Sequence[bytes], labels: Sequence[int], idx: list[int]) -> tuple[dict[str, Tensor], Tensor]:
    ids, mask = data.pad_batch([to_ids(raws[i]) for i in idx])
    return {"input_ids": ids, "attention_mask": mask}, torch.tensor([labels[i] for i in idx])


@torch.inference_mode()
def correct_on(
    model: torch.nn.Module, raws: Sequence[bytes], labels: Sequence[int], batch_size: int = 16
) -> list[bool]:
    """Whether `model` (eval mode) classifies each raw byte document right, in the order given (batched by
    length). Per-document results let a benchmark compare two lengths on the same documents (paired)."""
    was_training = model.training
    model.eval()
    right = [False] * len(raws)
    for idx in length_groups(raws, batch_size):
        inputs, y = _collate(raws, labels, idx)
        for i, hit in zip(idx, (model(**inputs).argmax(-1) == y).tolist(), strict=True):
            right[i] = bool(hit)
    model.train(was_training)
    return right


def accuracy_on(model: torch.nn.Module, raws: Sequence[bytes], labels: Sequence[int], batch_size: int = 16) -> float:
    """Accuracy of `model` (eval mode) on raw byte documents, batched by length."""
    right = correct_on(model, raws, labels, batch_size)
    return sum(right) / max(len(right), 1)


def length_report(
    model: torch.nn.Module,
    texts: Sequence[str],
    labels: Sequence[int],
    truncations: Sequence[int],
    composite_lengths: Sequence[int] = (),
    per_class: int = 2,
) -> dict[str, float]:
    """{"first_<n>": acc of the first n bytes, "full": whole docs, "composite_<n>": acc on composites}."""
    raws = [t.encode("utf-8") for t in texts]
    out = {f"first_{n}": accuracy_on(model, [r[:n] for r in raws], labels) for n in truncations}
    out["full"] = accuracy_on(model, raws, labels)
    for n in composite_lengths:
        comp = make_composites(texts, labels, n, per_class)
        out[f"composite_{n}"] = accuracy_on(model, [c for c, _ in comp], [y for _, y in comp], batch_size=4)
    return out
