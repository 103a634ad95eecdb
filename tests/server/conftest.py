"""Fixtures: a repository of tiny synthetic models, and in-process apps with their lifespan running."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import IMAGE, MAX_LENGTH, TEXT, serve

from lara_serve.server import Settings
from lara_serve.server.synthetic import make_image_model, make_text_model


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model_repository")
    make_text_model(root, TEXT, max_length=MAX_LENGTH)
    make_image_model(root, IMAGE)
    return root


@pytest.fixture
def make_settings(repo: Path) -> Callable[..., Settings]:
    def build(**overrides: Any) -> Settings:
        return Settings(**({"model_repository": repo, "max_queue_delay_ms": 2.0} | overrides))

    return build


@pytest.fixture
async def client(make_settings: Callable[..., Settings]) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(make_settings()) as c:
        yield c
