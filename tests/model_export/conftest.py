"""Shared fixtures for model_export tests: tiny models, data availability skips."""

from __future__ import annotations

import pytest
import torch

from model_export.data import DataUnavailable, load_fashion, load_news


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # the test machine is shared; tiny models gain nothing from threads


@pytest.fixture(scope="session")
def fashion_test():
    try:
        return load_fashion("test")
    except DataUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def news_test():
    try:
        return load_news("test")
    except DataUnavailable as e:
        pytest.skip(str(e))
