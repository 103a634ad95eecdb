"""Hashed byte n-gram embeddings: exact codes (no int64 wrap), context from the document only, bad orders refused."""

from __future__ import annotations

import pytest
import torch

from lara_serve.model_export.models.text_embeddings import _BASE, _ORDER_SALT, MAX_ORDER, NgramEmbedding
from tests.model_export.conftest import export_round_trip


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


def test_a_factorized_table_projects_the_sum_of_its_narrow_rows() -> None:
    torch.manual_seed(1)
    wide, narrow = 32, 8
    emb = NgramEmbedding(1009, (2, 3), wide, table_dim=narrow)
    emb.reset_parameters(std=0.02)
    ids = torch.randint(1, 257, (2, 300))
    # The same table read as a plain (unprojected) embedding gives the narrow sums; the projection maps them.
    plain = NgramEmbedding(1009, (2, 3), narrow)
    plain.table.weight = emb.table.weight
    torch.testing.assert_close(emb(ids), plain(ids) @ emb.proj.weight.T, rtol=1e-6, atol=1e-7)
    assert emb.table.weight.shape == (1009, narrow) and emb(ids).shape == (2, 300, wide)
    # Init keeps the output at the unfactorized table's scale (two orders of N(0, 0.02) rows: std 0.028).
    assert 0.02 < emb(ids).std().item() < 0.04


def test_a_negative_table_width_is_refused() -> None:
    with pytest.raises(ValueError, match="ngram_dim must be 0"):
        NgramEmbedding(1009, (2, 3), 8, table_dim=-1)


def test_a_factorized_model_round_trips_through_save_export_and_load(tmp_path) -> None:
    """config.json carries ngram_dim and the word table's sizes; the loaded torch model and the ONNX graph
    (word boundaries and hashes computed in the graph) match the trained one."""
    from lara_serve.model_export import create_model

    model = create_model(
        "tiny-text", ngram_buckets=211, ngram_dim=6, word_buckets=101, word_dim=5, attention={"eval_noise": "fixed"}
    ).eval()
    loaded = export_round_trip(model, tmp_path / "tiny-text")
    assert loaded.cfg.ngram_dim == 6 and loaded.ngrams.table.weight.shape == (211, 6)
    assert loaded.words is not None and loaded.words.table.weight.shape == (101, 5)
