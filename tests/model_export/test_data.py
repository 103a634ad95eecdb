"""Loaders on small slices, fixed splits, the ListOps generator rules, and the missing-package error."""

from __future__ import annotations

import hashlib

import pytest
import torch

from model_export import data, listops
from model_export.registry import get_config
from model_export.tasks import load_task


def test_fashion_slice(fashion_test):
    images, labels = fashion_test
    assert images.shape == (10_000, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (10_000,) and set(labels[:1000].tolist()) == set(range(10))


def test_fashion_missing_package_says_how_to_install(tmp_path):
    with pytest.raises(data.DataUnavailable, match="apt-get install -y dataset-fashion-mnist"):
        data.load_fashion("test", root=tmp_path)


def test_news_fixed_split(news_test):
    train = data.load_news("train")
    assert len(news_test) + len(train) == 2127  # 2,225 minus 98 exact duplicates
    assert all(hashlib.sha256(d.text.encode()).digest()[0] < 52 for d in news_test)
    assert not {d.text for d in news_test} & {d.text for d in train}
    assert {d.label for d in news_test} == set(range(5))


def test_news_holdout_is_disjoint_from_train(news_test):
    cfg = get_config("tiny-text")
    tr, va = load_task("news", "train", cfg, limit=None), load_task("news", "val", cfg)
    assert len(tr) + len(va) == 2127 - len(news_test)


def test_byte_encoding_and_padding():
    ids = data.encode_bytes("aé", 10)
    assert ids == [ord("a") + 1, 0xC3 + 1, 0xA9 + 1]
    assert data.encode_bytes("abcdef", 4) == [98, 99, 100, 101]
    x, m = data.pad_batch([[5, 6, 7], [9]])
    assert x.tolist() == [[5, 6, 7], [9, 0, 0]] and m.tolist() == [[1, 1, 1], [1, 0, 0]]


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[MED 1 2 3 4 ]", 2),  # floored median of an even count
        ("[SM 9 9 3 ]", 1),
        ("[MIN [MAX 1 5 ] [SM 4 4 ] ]", 5),
    ],
)
def test_listops_semantics(expr, value):
    def parse(toks):
        tok = toks.pop(0)
        if tok.startswith("["):
            args = []
            while toks[0] != "]":
                args.append(parse(toks))
            toks.pop(0)
            return (tok, args)
        return int(tok)

    assert listops.evaluate(parse(expr.split())) == value


def test_listops_generator_rules():
    samples = listops.generate(20, seed=7)
    assert samples == listops.generate(20, seed=7)  # seeded
    assert len({e for e, _ in samples}) == 20  # unique
    for expr, label in samples:
        toks = expr.split()
        assert 500 < len(toks) < 2000 and 0 <= label <= 9
        assert toks.count("]") == sum(t in listops.OPS for t in toks)
        assert max(listops.encode(expr)) < listops.VOCAB_SIZE
