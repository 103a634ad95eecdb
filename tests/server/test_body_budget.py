"""Bodies just under 1 MiB are bounded too (issue 50, item 6): the large-body gate takes every body over
64 KiB (a 1,040,000-byte text went around it at 1 MiB), and a model's queue is bounded in tokens as well
as items, with a 429 that names max_queue_tokens."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import httpx
import pytest
from server_helpers import TEXT, post_while_a_large_body_stalls
from test_batcher_budget import Recorder, make_busy

from lara_serve.server import Settings, create_app
from lara_serve.server.errors import ErrorKind, ServeError

pytestmark = pytest.mark.anyio


async def test_queue_is_bounded_in_tokens_with_a_429() -> None:
    backend = Recorder()
    batcher, running = await make_busy(backend, max_batch_size=1, max_queue_size=64, max_queue_tokens=1000)
    first = batcher.submit([(1, 600)])  # 600 tokens waiting
    with pytest.raises(ServeError) as refused:
        batcher.submit([(2, 300), (3, 200)])  # 1,100 would wait: all or none
    assert refused.value.kind is ErrorKind.QUEUE_FULL and refused.value.retry_after_s is not None
    assert "600 of 1000 tokens waiting (max_queue_tokens), request has 500" in refused.value.message
    fits = batcher.submit([(4, 400)])  # exactly the budget
    backend.gate.set()
    assert [(await f).value for f in (running, *first, *fits)] == [0, 10, 40]
    alone = batcher.submit([(5, 5000)])  # an empty queue takes any request, however long
    assert (await alone[0]).value == 50
    await batcher.stop()


def test_default_gate_threshold_takes_bodies_under_one_mib() -> None:
    fields = Settings.model_fields
    assert fields["large_body_bytes"].default == 64 * 1024 < 1_040_000


async def test_a_text_just_under_one_mib_waits_for_a_slot(make_settings: Callable[..., Settings]) -> None:
    # The default threshold: only the slot count and the wait are lowered for the test.
    settings = make_settings(max_large_bodies=1, large_body_wait_s=0.3)
    app = create_app(settings)
    big = json.dumps({"instances": ["x" * 100_000], "parameters": {"truncate": True}}).encode()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            refused, small = await post_while_a_large_body_stalls(app, client, f"/v1/models/{TEXT}:predict", big)
    assert refused.status_code == 503 and "max_large_bodies" in refused.json()["error"]
    assert small.status_code == 200


async def test_queue_token_setting_reaches_the_batcher(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(max_queue_tokens=12345)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        assert app.state.lara.registry.models[TEXT].batcher.policy.max_queue_tokens == 12345


async def test_texts_over_64_kib_are_preprocessed_off_the_loop(make_settings: Callable[..., Settings]) -> None:
    app = create_app(make_settings())
    async with app.router.lifespan_context(app):
        model = app.state.lara.registry.models[TEXT]
        where: list[str] = []
        real = model.item_from_bytes

        def recording(data: bytes, truncate: str | None, max_pixels: int) -> object:
            where.append(threading.current_thread().name)
            return real(data, truncate, max_pixels)

        model.item_from_bytes = recording
        await model.items_from_bytes([b"x" * 1000], "head", 1)
        await model.items_from_bytes([b"x" * 1_040_000], "head", 1)  # under the old 1 MiB line
    assert where[0] == threading.main_thread().name and where[1] != threading.main_thread().name
