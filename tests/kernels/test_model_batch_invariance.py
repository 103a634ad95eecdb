"""Batch invariance at the model level: the shipped text model on the torch backend (CPU kernel).

Measured: every encoder output row of a document is bitwise the same alone and padded inside a batch
(the CPU kernel is batch invariant, and so are the model's embeddings, LayerNorms and Linears on these
shapes). The logits are not bitwise: the masked-mean pooling and the classifier head round
differently with the batch (see the second test).
"""

from __future__ import annotations

from pathlib import Path

import torch

from model_export import load_pretrained

TEXT_MODEL = Path(__file__).resolve().parents[2] / "model_repository" / "lara-text-news"


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


def test_logits_alone_and_batched_agree_to_1e_6():
    """What holds for the logits today: the masked-mean pooling (a sum whose reduction order depends on
    the padded length) and the head (gemv for one row, gemm for several) round differently, by ~2e-7."""
    model = load_pretrained(TEXT_MODEL)
    lengths = [300, 1_000, 5]
    ids, mask = _batch(lengths, seed=1)
    with torch.inference_mode():
        batched = model(ids, mask)
        for i, n in enumerate(lengths):
            alone = model(ids[i : i + 1, :n], mask[i : i + 1, :n])
            assert (alone[0] - batched[i]).abs().max().item() <= 1e-6
