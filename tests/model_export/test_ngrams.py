"""Hashed byte n-gram embeddings: exact codes (no int64 wrap), context from the document only, bad orders refused."""

from __future__ import annotations

import pytest
import torch

from model_export.text import _BASE, _ORDER_SALT, MAX_ORDER, NgramEmbedding


def reference_buckets(ids: list[int], order: int, buckets: int) -> list[int]:
    """Python integers (arbitrary precision): the n-gram ending at i over ids i-n+1..i, pad 0 before the start."""
    padded = [0] * (order - 1) + ids
    out = []
    for i in range(len(ids)):
        gram = padded[i : i + order]  # oldest first; the newest id has weight 257**0
        code = sum(t * _BASE**back for back, t in enumerate(reversed(gram)))
        out.append((code + order * _ORDER_SALT) % buckets)
    return out


@pytest.mark.parametrize("order", [2, 4, 6, MAX_ORDER])
def test_bucket_codes_are_exact_up_to_the_longest_order(order: int) -> None:
    buckets = 16381
    emb = NgramEmbedding(buckets, (order,), 4)
    with torch.no_grad():  # row b of the table holds b, so the output reads back the bucket index
        emb.table.weight.copy_(torch.arange(buckets, dtype=torch.float32)[:, None].expand(-1, 4))
    ids = [256] * 12 + list(range(1, 30))  # the largest id repeated: the largest codes
    got = emb(torch.tensor([ids]))[0, :, 0].round().long().tolist()
    assert got == reference_buckets(ids, order, buckets)


def test_a_documents_ngrams_ignore_padding_and_batch_neighbours() -> None:
    torch.manual_seed(0)
    emb = NgramEmbedding(1009, (2, 3, 5, 6), 8)
    doc = torch.randint(1, 257, (1, 40))
    other = torch.randint(1, 257, (1, 50))
    batch = torch.zeros(2, 50, dtype=torch.long)
    batch[0, :40], batch[1] = doc[0], other[0]
    torch.testing.assert_close(emb(batch)[0, :40], emb(doc)[0], rtol=0, atol=0)


@pytest.mark.parametrize("orders", [(), (2, 8), (0, 3)])
def test_orders_out_of_range_are_refused(orders: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"ngram_orders must be integers in 1\.\.7"):
        NgramEmbedding(1009, orders, 8)
