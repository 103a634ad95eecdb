"""Hashed whole-word embeddings: word boundaries, case folding, exact codes, padding independence."""

from __future__ import annotations

import pytest
import torch

from lara_serve.model_export.models.text_embeddings import _BASE, _WORD_MOD, WORD_MAX_BYTES, WordEmbedding

BUCKETS = 1009


def reference_rows(data: bytes) -> list[int | None]:
    """Per byte: the bucket of the word ending there (Python integers), None where no word ends."""
    out: list[int | None] = []
    for i, byte in enumerate(data):
        is_word = chr(byte).isascii() and chr(byte).isalnum()
        nxt = data[i + 1] if i + 1 < len(data) else None
        if not is_word or (nxt is not None and chr(nxt).isascii() and chr(nxt).isalnum()):
            out.append(None)
            continue
        start = i
        while start > 0 and chr(data[start - 1]).isascii() and chr(data[start - 1]).isalnum():
            start -= 1
        word = data[max(start, i - WORD_MAX_BYTES + 1) : i + 1].lower()  # the last 16 bytes of a long word
        code = sum((b + 1) * _BASE**back for back, b in enumerate(reversed(word)))
        out.append(code % _WORD_MOD % BUCKETS)
    return out


def bucket_reader() -> WordEmbedding:
    """Row b of the table holds b + 1, so the output reads back the bucket (+1; 0 = no word ends here)."""
    emb = WordEmbedding(BUCKETS, 4)
    with torch.no_grad():
        emb.table.weight.copy_(torch.arange(1, BUCKETS + 1, dtype=torch.float32)[:, None].expand(-1, 4))
    return emb


def read_buckets(emb: WordEmbedding, data: bytes) -> list[int | None]:
    got = emb(torch.tensor([[b + 1 for b in data]]))[0, :, 0].round().long().tolist()
    return [g - 1 if g else None for g in got]


TEXT = "Honda's COPYRIGHT ruling: honda won 2-1 in 2004; Überraschung! antidisestablishmentarianism x".encode()


def test_buckets_match_a_plain_python_reference() -> None:
    assert read_buckets(bucket_reader(), TEXT) == reference_rows(TEXT)


def test_case_is_folded_and_words_end_at_non_word_bytes() -> None:
    rows = read_buckets(bucket_reader(), b"Honda honda HONDA hondas")
    ends = [i for i, r in enumerate(rows) if r is not None]
    assert ends == [4, 10, 16, 23]  # one row per word, at its last byte
    assert rows[4] == rows[10] == rows[16] != rows[23]


def test_a_words_row_depends_only_on_its_own_bytes() -> None:
    """Padding after a document or a neighbour in the batch changes nothing; a word cut by the end of
    the text is hashed as the part kept (what truncation gives)."""
    torch.manual_seed(0)
    emb = WordEmbedding(BUCKETS, 8, table_dim=3)
    emb.reset_parameters(std=0.02)
    doc = torch.tensor([[b + 1 for b in b"Market shares rose sharply"]])
    other = torch.tensor([[b + 1 for b in b"Chelsea beat Arsenal at home, two-nil!!"]])
    batch = torch.zeros(2, other.shape[1], dtype=torch.long)
    batch[0, : doc.shape[1]], batch[1] = doc[0], other[0]
    torch.testing.assert_close(emb(batch)[0, : doc.shape[1]], emb(doc)[0], rtol=0, atol=0)
    cut = read_buckets(bucket_reader(), b"Market sha")
    assert cut[-1] == reference_rows(b"sha")[-1]


@pytest.mark.parametrize(
    ("buckets", "table_dim", "message"), [(0, 0, "word_buckets must be positive"), (97, -1, "word_dim")]
)
def test_bad_sizes_are_refused(buckets: int, table_dim: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WordEmbedding(buckets, 8, table_dim=table_dim)
