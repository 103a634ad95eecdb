"""Work for nobody is never computed: deadlines and cancellation in the batcher, and client disconnects
through the real ASGI app (a hand-driven receive channel, since httpx's in-process transport cannot hang
up). Each test holds the backend with a gate, queues work behind it, and counts what was computed."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import TEXT, asgi_post

from lara_serve.server import Settings, create_app
from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
from lara_serve.server.batcher import Batcher, BatchPolicy
from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.metrics import Metrics
from lara_serve.server.models import ServedModel
from lara_serve.server.repository import read_config

pytestmark = pytest.mark.anyio


class GatedBackend:
    """A real backend that records each batch's size and holds a batch while `gate` is clear."""

    def __init__(self, inner: OnnxRuntimeBackend) -> None:
        self.inner = inner
        self.name, self.device = "gated", "cpu"
        self.batches: list[int] = []
        self.gate, self.started = threading.Event(), threading.Event()
        self.gate.set()

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        self.started.set()
        self.gate.wait(timeout=10)
        self.batches.append(len(inputs["input_ids"]))
        return self.inner.run(inputs)

    def close(self) -> None:
        pass


def gated_app(repo: Path, settings: Settings) -> tuple[Any, ServedModel, GatedBackend]:
    """The app over one text model whose backend starts held; the batcher reports to the app's metrics."""
    config = read_config(repo / TEXT)
    backend = GatedBackend(OnnxRuntimeBackend(repo / TEXT, config, "cpu"))
    backend.gate.clear()
    model = ServedModel(config, backend, BatchPolicy(max_batch_size=4, max_queue_delay_s=0.0, max_queue_size=256))
    app = create_app(settings, models=[model])
    model.batcher._observer = app.state.lara.metrics.observer(TEXT)
    return app, model, backend


def metric(metrics: Metrics, name: str, labels: dict[str, str]) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_disconnected_clients_queued_items_are_never_computed(
    repo: Path, make_settings: Callable[..., Settings]
) -> None:
    app, model, backend = gated_app(repo, make_settings())
    state = app.state.lara
    path = f"/v1/models/{TEXT}:predict"
    async with app.router.lifespan_context(app):
        holder = asyncio.create_task(asgi_post(app, path, json.dumps({"instances": ["hold"]}).encode()))
        await asyncio.to_thread(backend.started.wait, 5)
        hang_up = asyncio.Event()
        leavers = [
            asyncio.create_task(asgi_post(app, path, json.dumps({"instances": ["a", "b", "c"]}).encode(), hang_up))
            for _ in range(5)
        ]
        while model.batcher.depth < 15:  # 5 clients x 3 items queued behind the held batch
            await asyncio.sleep(0.01)
        hang_up.set()
        gone = await asyncio.gather(*leavers)
        backend.gate.set()
        held = await holder
        stayer = await asgi_post(app, path, json.dumps({"instances": ["after"]}).encode())
    assert held["status"] == 200 and stayer["status"] == 200
    assert all(g["status"] is None for g in gone)  # nothing was sent to a client that had left
    assert backend.batches == [1, 1]  # only the holder and the later client were computed
    m = state.metrics
    assert metric(m, "lara_items_dropped_total", {"model": TEXT, "reason": "cancelled"}) == 15
    assert metric(m, "lara_requests_total", {"model": TEXT, "outcome": "client_disconnected", "protocol": "v1"}) == 5
    assert metric(m, "lara_requests_total", {"model": TEXT, "outcome": "backend_failure", "protocol": "v1"}) == 0
    assert metric(m, "lara_items_orphaned_total", {"model": TEXT}) == 0


async def test_timed_out_requests_are_answered_504_and_never_computed(
    repo: Path, make_settings: Callable[..., Settings]
) -> None:
    app, model, backend = gated_app(repo, make_settings(request_timeout_s=0.3))
    path = f"/v1/models/{TEXT}:predict"
    async with app.router.lifespan_context(app):
        first = asyncio.create_task(asgi_post(app, path, json.dumps({"instances": ["hold"]}).encode()))
        await asyncio.to_thread(backend.started.wait, 5)
        late = [asyncio.create_task(asgi_post(app, path, json.dumps({"instances": ["x", "y"]}).encode()))
                for _ in range(4)]  # fmt: skip
        answers = await asyncio.gather(*late)  # each times out while the backend is held
        backend.gate.set()
        held = await first
        await asyncio.sleep(0.1)
    assert held["status"] == 200  # already computing at its timeout: it finishes and is answered
    assert [a["status"] for a in answers] == [504] * 4
    assert b"request_timeout_s" in answers[0]["body"]
    assert backend.batches == [1]  # the 8 timed-out items never reached the backend
    m = app.state.lara.metrics
    assert metric(m, "lara_requests_total", {"model": TEXT, "outcome": "timeout", "protocol": "v1"}) >= 4
    dropped = sum(
        metric(m, "lara_items_dropped_total", {"model": TEXT, "reason": r}) for r in ("cancelled", "deadline")
    )
    assert dropped == 8


# -- the batcher alone -------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.dropped: dict[str, int] = {}
        self.orphaned = 0

    def __call__(self, payloads: list[int]) -> list[int]:
        time.sleep(0.05)  # 0.05 s per batch of 1-token items: the measured cost the estimate learns
        self.batches.append(payloads)
        return payloads

    def batch_done(self, size: int, padded_tokens: int, inference_s: float) -> None: ...

    def queue_depth(self, depth: int) -> None: ...

    def items_dropped(self, reason: str, count: int) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    def items_orphaned(self, count: int) -> None:
        self.orphaned += count


async def test_item_that_cannot_finish_in_time_is_refused_before_compute() -> None:
    rec = Recorder()
    batcher: Batcher[int, int] = Batcher("m", rec, BatchPolicy(max_batch_size=1, max_queue_delay_s=0.0), rec)
    batcher.start()
    await batcher.submit([(0, 1)])[0]  # teaches the batcher: ~0.05 s per batch
    now = time.perf_counter()
    tight, roomy = batcher.submit([(1, 1)], deadline=now + 0.01) + batcher.submit([(2, 1)], deadline=now + 5)
    with pytest.raises(ServeError) as info:
        await tight
    assert info.value.kind is ErrorKind.TIMEOUT and "could not have been answered" in info.value.message
    assert (await roomy).value == 2
    assert rec.batches == [[0], [2]] and rec.dropped == {"deadline": 1}
    await batcher.stop()


async def test_retry_after_is_spread_and_queued_work_can_be_failed_on_shutdown() -> None:
    rec = Recorder()
    gate = threading.Event()

    def held(payloads: list[int]) -> list[int]:
        gate.wait(5)
        return rec(payloads)

    batcher: Batcher[int, int] = Batcher(
        "m", held, BatchPolicy(max_batch_size=1, max_queue_size=1, max_queue_delay_s=0)
    )
    batcher.start()
    running = batcher.submit([(0, 1)])[0]
    await asyncio.sleep(0.05)
    queued = batcher.submit([(1, 1)])[0]
    hints = set()
    for _ in range(60):
        with pytest.raises(ServeError) as info:
            batcher.submit([(2, 1)])
        hints.add(info.value.retry_after_s)
    assert len(hints) > 1 and min(h or 0 for h in hints) >= 1  # refused clients do not come back in step
    assert batcher.fail_queued(ServeError(ErrorKind.NOT_READY, "shutting down")) == 1
    with pytest.raises(ServeError, match="shutting down"):
        await queued
    gate.set()
    assert (await running).value == 0  # the running batch still answers
    await batcher.stop()
