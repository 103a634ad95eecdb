"""The gRPC servicer in process: the client's deadline bounds the wait, a cancelled call drops its queued
items, and error kinds map to gRPC codes through the one table."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from server_helpers import TEXT, serve

from lara_serve.server import Settings
from lara_serve.server.errors import GRPC_STATUS, HTTP_STATUS, ErrorKind, ServeError

grpc = pytest.importorskip("grpc")
from tritonclient.grpc import service_pb2 as pb  # noqa: E402

from lara_serve.server.grpc.service import InferenceService  # noqa: E402

pytestmark = pytest.mark.anyio


class FakeContext:
    def __init__(self, remaining: float | None) -> None:
        self.remaining, self.trailing = remaining, ()

    def time_remaining(self) -> float | None:
        return self.remaining

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailing = metadata

    def invocation_metadata(self) -> tuple:
        return ()


def _request(n: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=TEXT)
    tensor = request.inputs.add(name="raw", datatype="BYTES", shape=[n])
    tensor.contents.bytes_contents.extend([f"text number {i}".encode() for i in range(n)])
    return request


def test_every_error_kind_has_a_grpc_code() -> None:
    assert set(GRPC_STATUS) == set(HTTP_STATUS) == set(ErrorKind)
    assert all(hasattr(grpc.StatusCode, name) for name in GRPC_STATUS.values())
    assert "UNKNOWN" not in GRPC_STATUS.values()


async def test_deadline_bounds_the_wait(make_settings: Callable[..., Settings]) -> None:
    app_settings = make_settings(max_queue_delay_ms=200.0, max_batch_size=64)
    async with serve(app_settings) as client:
        app = client._transport.app  # type: ignore[attr-defined]
        service = InferenceService(app.state.lara, app.state)
        with pytest.raises(ServeError) as passed:
            await service.ModelInfer(_request(1), FakeContext(-0.1))
        assert passed.value.kind is ErrorKind.TIMEOUT
        # 200 ms of batching delay, 20 ms of deadline: the wait ends at the deadline with TIMEOUT.
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(ServeError) as waited:
            await service.ModelInfer(_request(1), FakeContext(0.02))
        assert waited.value.kind is ErrorKind.TIMEOUT and loop.time() - start < 0.15
        ok = await service.ModelInfer(_request(2), FakeContext(None))
        assert np.frombuffer(ok.raw_output_contents[0], dtype=np.float32).size > 0
        stats = app.state.lara.metrics.statistics.snapshot(TEXT)
        assert (stats.success.count, stats.fail.count) == (1, 2)


async def test_cancelled_call_drops_its_items(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(max_queue_delay_ms=300.0, max_batch_size=64)) as client:
        app = client._transport.app  # type: ignore[attr-defined]
        state = app.state.lara
        service = InferenceService(state, app.state)
        task = asyncio.create_task(service.ModelInfer(_request(5), FakeContext(None)))
        await asyncio.sleep(0.05)  # queued, waiting for the batch to fill
        task.cancel()  # what grpc.aio does when the client cancels
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.4)  # past the queue delay: the batcher would have run them
        dropped = state.metrics.registry.get_sample_value(
            "lara_items_dropped_total", {"model": TEXT, "reason": "cancelled"}
        )
        assert dropped == 5
        assert state.metrics.statistics.snapshot(TEXT).inference_count == 0


def test_preflight_names_a_busy_grpc_port(make_settings: Callable[..., Settings]) -> None:
    import socket

    from lara_serve.server.preflight import preflight
    from lara_serve.server.testing import free_port

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        problem = preflight(make_settings(port=free_port(), grpc_port=taken))
    assert problem is not None and "--grpc-port" in problem
