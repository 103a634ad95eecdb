"""Shared fixtures for model_export tests: tiny models, data availability skips."""

from __future__ import annotations

import os

import pytest
import torch

from model_export import brown
from model_export.data import DataUnavailable, load_fashion, load_news


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # the test machine is shared; tiny models gain nothing from threads


def _load_or_skip(loader, split: str):
    """Missing data skips a developer's run, but fails under CI, where `make test` installs it."""
    try:
        return loader(split)
    except DataUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the data packages installed by `make test`: {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def fashion_test():
    return _load_or_skip(load_fashion, "test")


@pytest.fixture(scope="session")
def news_test():
    return _load_or_skip(load_news, "test")


@pytest.fixture(scope="session")
def brown_all() -> list[brown.BrownDoc]:
    try:
        return brown.load_brown("all")
    except brown.BrownUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the Brown corpus unpacked by `make test`: {e}")
        pytest.skip(str(e))
