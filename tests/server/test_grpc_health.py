"""grpc.health.v1 in process: the status follows the server's state (loading, serving, unloaded, draining),
and a Watch ends once the drain's NOT_SERVING is written, so it never holds the server's stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from server_helpers import IMAGE, TEXT, serve

from lara_serve.server import Settings
from lara_serve.server.routes.common import AppState
from lara_serve.server.testing import free_port

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_health", reason="grpcio-health-checking (the grpc extra) is not installed")
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from lara_serve.server.grpc.health import NOT_SERVING, SERVING, serving_status  # noqa: E402

pytestmark = pytest.mark.anyio
SERVER = frozenset({"", "inference.GRPCInferenceService"})


def test_status_follows_the_state(make_settings: Callable[..., Settings]) -> None:
    state = AppState(make_settings())
    loading = {name: serving_status(state, name, SERVER) for name in ("", TEXT, IMAGE, "no-such-model")}
    assert loading == {"": NOT_SERVING, TEXT: NOT_SERVING, IMAGE: NOT_SERVING, "no-such-model": None}
    state.started, state.registry.models = True, {TEXT: object()}  # type: ignore[dict-item]
    state.registry.failed = {IMAGE: "unloaded"}
    serving = {name: serving_status(state, name, SERVER) for name in ("", TEXT, IMAGE)}
    assert serving == {"": SERVING, TEXT: SERVING, IMAGE: NOT_SERVING}
    state.draining = True
    assert serving_status(state, "", SERVER) == serving_status(state, TEXT, SERVER) == NOT_SERVING


async def test_watch_ends_with_not_serving_when_the_server_drains(make_settings: Callable[..., Settings]) -> None:
    port = free_port()
    async with serve(make_settings(grpc_port=port)) as client:
        state = client._transport.app.state.lara  # type: ignore[attr-defined]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=TEXT), timeout=10)
            first = await watch.read()
            state.draining = True
            seen = [first.status]
            async with asyncio.timeout(3):  # one poll interval, not the drain's grace period
                while (answer := await watch.read()) is not grpc.aio.EOF:
                    seen.append(answer.status)
            assert seen == [SERVING, NOT_SERVING] and await watch.code() == grpc.StatusCode.OK
            state.draining = False  # the lifespan's stop drains again
