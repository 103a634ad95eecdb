"""Fixtures: a repository of tiny synthetic models, and in-process apps with their lifespan running."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from server import Settings, create_app
from server.models import ServedModel
from server.synthetic import make_image_model, make_text_model

TEXT, IMAGE = "tiny-text", "tiny-image"
MAX_LENGTH = 256


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


@asynccontextmanager
async def serve(settings: Settings, models: list[ServedModel] | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan (model loading) running, behind an in-process httpx client."""
    app = create_app(settings, models)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@pytest.fixture
async def client(make_settings: Callable[..., Settings]) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(make_settings()) as c:
        yield c


def png_bytes(size: tuple[int, int] = (28, 28), seed: int = 0, fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, size=(size[1], size[0]), dtype=np.uint8), mode="L")
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()
