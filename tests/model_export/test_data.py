"""Loaders on small slices, fixed splits, and the missing-package error."""

from __future__ import annotations

import hashlib

import pytest
import torch

from lara_serve.model_export.models.registry import get_config
from lara_serve.model_export.training import data
from lara_serve.model_export.training.tasks import load_task


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
