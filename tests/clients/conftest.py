"""A live server on 127.0.0.1 over a repository of tiny synthetic models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lara_serve.server.synthetic import make_image_model, make_text_model
from lara_serve.server.testing import server_process

API_KEY = "client-test-key"


@pytest.fixture(scope="session")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("client_repo")
    make_text_model(repo, "tiny-text", max_length=128)
    make_image_model(repo, "tiny-image")
    env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_API_KEY": API_KEY, "LARA_NUM_THREADS": "1"}
    with server_process(["--log-level", "warning"], env=env) as url:
        yield url


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("client_files")
