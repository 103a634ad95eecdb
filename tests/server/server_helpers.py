"""Shared constants and helpers of the server tests (conftest.py holds the fixtures)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from lara_serve.server import Settings, create_app
from lara_serve.server.models import ServedModel
from lara_serve.server.testing import server_process

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


def live_server(repo: Path) -> Iterator[str]:
    """For a module fixture (`yield from live_server(repo)`): a real `python -m lara_serve.server` on 127.0.0.1
    over `repo`, one thread and a 1 ms batching delay, so that the tests wait for answers, not for batches."""
    env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_MAX_QUEUE_DELAY_MS": "1", "LARA_NUM_THREADS": "1"}
    with server_process(["--log-level", "warning"], env=env) as url:
        yield url


def tritonclient_http(url: str) -> tuple[ModuleType, Any]:
    """tritonclient's HTTP module and a client of the server at `url`; the test is skipped without tritonclient."""
    http = pytest.importorskip("tritonclient.http")
    return http, http.InferenceServerClient(url=url.removeprefix("http://"))


def png_bytes(size: tuple[int, int] = (28, 28), seed: int = 0, fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, size=(size[1], size[0]), dtype=np.uint8), mode="L")
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


async def asgi_post(
    app: Any, path: str, body: bytes, hang_up: asyncio.Event | None = None, *, complete: bool = True
) -> dict[str, Any]:
    """POST through the ASGI interface by hand (httpx's in-process transport cannot hang up or stall).

    complete=True: the body is sent, then the client disconnects when `hang_up` is set (never if None).
    complete=False: `body` arrives with more to come, then the client disconnects (hang_up None) or
    stalls until `hang_up` is set. Returns {"status": int | None, "headers": dict, "body": bytes}.
    """
    sent: dict[str, Any] = {"status": None, "headers": {}, "body": b""}
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": not complete}
        if not complete and hang_up is None:
            return {"type": "http.disconnect"}
        await (hang_up.wait() if hang_up is not None else asyncio.Event().wait())
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]
            sent["headers"] = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        else:
            sent["body"] += message.get("body", b"")

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}  # fmt: skip
    await app(scope, receive, send)
    return sent


async def post_while_a_large_body_stalls(
    app: Any, client: httpx.AsyncClient, path: str, big: bytes
) -> tuple[httpx.Response, httpx.Response]:
    """With max_large_bodies=1: a large body arrives in part and stalls, holding the one slot, while `big`
    and a small request are posted; then it goes on. Returns the answers to `big` and to the small one."""
    stall = asyncio.Event()
    holder = asyncio.create_task(asgi_post(app, path, big, stall, complete=False))
    await asyncio.sleep(0.2)
    refused = await client.post(path, content=big)
    small = await client.post(path, json={"instances": ["hi"]})
    stall.set()
    await holder
    return refused, small
