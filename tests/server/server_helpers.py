"""Shared constants and helpers of the server tests (conftest.py holds the fixtures)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import numpy as np
from PIL import Image

from server import Settings, create_app
from server.models import ServedModel

TEXT, IMAGE = "tiny-text", "tiny-image"
MAX_LENGTH = 256


@asynccontextmanager
async def serve(settings: Settings, models: list[ServedModel] | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan (model loading) running, behind an in-process httpx client."""
    app = create_app(settings, models)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


def png_bytes(size: tuple[int, int] = (28, 28), seed: int = 0, fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, size=(size[1], size[0]), dtype=np.uint8), mode="L")
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()
