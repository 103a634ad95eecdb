"""Batch invariance at the model level: the shipped text model on the torch backend (CPU kernel).

Measured: every encoder output row of a document is bitwise the same alone and padded inside a batch
(the CPU kernel is batch invariant, and so are the model's embeddings, LayerNorms and Linears on these
shapes). So are the logits: the landmarks, the pooling and the classifier head run per document in
eager mode, and very short inputs are padded to 16 rows (see model_export/models/text.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lara_serve.model_export import load_pretrained

TEXT_MODEL = Path(__file__).resolve().parents[2] / "model_repository" / "lara-text-news-bytes"


def _batch(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    mask = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).long()  # [B, N]
    return torch.randint(1, 257, (len(lengths), n), generator=g) * mask, mask


def test_text_encoder_rows_are_bitwise_the_same_alone_and_batched():
    assert TEXT_MODEL.is_dir(), f"shipped model missing: {TEXT_MODEL}"
    model = load_pretrained(TEXT_MODEL)
    lengths = [2_500, 4_100, 37, 2_500]  # 4,100 tokens = 3 key chunks of the kernel
    ids, mask = _batch(lengths, seed=0)
    with torch.inference_mode():
        batched = model.forward_features(ids, mask)
        for i in (0, 2):
            n = lengths[i]
            alone = model.forward_features(ids[i : i + 1, :n], mask[i : i + 1, :n])
            assert torch.equal(alone[0], batched[i, :n]), f"document {i} ({n} tokens) changed in the batch"


# Lengths around the kernel's key chunk (4,096), below the landmark count (16) and below the row count
# where CPU GEMM switches micro-kernel (~12), in seeded random batches with right and left padding.
CASES = [[5, 300, 1_000], [1, 11, 12, 17], [4_100, 3, 2_048], [33, 33, 33, 700]]


@pytest.mark.parametrize("lengths", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("side", ["right", "left"])
def test_logits_are_bitwise_the_same_alone_and_in_any_batch(lengths: list[int], side: str) -> None:
    model = load_pretrained(TEXT_MODEL)
    ids, mask = _batch(lengths, seed=len(lengths))
    if side == "left":  # move each row's tokens to the end: left padding
        n = ids.shape[1]
        ids = torch.stack(
            [torch.cat([r[m > 0].new_zeros(n - int(m.sum())), r[m > 0]]) for r, m in zip(ids, mask, strict=True)]
        )
        mask = torch.stack([torch.cat([m.new_zeros(n - int(m.sum())), m.new_ones(int(m.sum()))]) for m in mask])
    with torch.inference_mode():
        batched = model(ids, mask)
        for i, n in enumerate(lengths):
            own = mask[i] > 0
            alone = model(ids[i : i + 1, own], mask[i : i + 1, own])
            assert torch.equal(alone[0], batched[i]), (
                f"document {i} ({n} tokens, {side} padding) differs by {(alone[0] - batched[i]).abs().max().item():.2e}"
            )
