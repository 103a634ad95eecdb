"""One access-log line per gRPC call (KServe, health, unknown methods), in process: the app's lifespan starts
the gRPC server, tritonclient's asyncio client calls it, and caplog reads the `lara_serve.access` lines."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable

import numpy as np
import pytest
from server_helpers import TEXT, serve

from lara_serve.server import Settings
from lara_serve.server.testing import free_port

grpc = pytest.importorskip("grpc")
grpcaio = pytest.importorskip("tritonclient.grpc.aio")
pytest.importorskip("grpc_health", reason="grpcio-health-checking (the grpc extra) is not installed")
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from tritonclient.grpc import InferInput  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from lara_serve.server.grpc.access import peer_address  # noqa: E402

pytestmark = pytest.mark.anyio
LINE = re.compile(r'^(\S+) - "gRPC (/\S+)" (\d+) ([A-Z_]+) model=(\S+) (\d+\.\d)ms$')


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, ...]]:
    records = [r for r in caplog.records if r.name == "lara_serve.access" and getattr(r, "method", "") == "gRPC"]
    parsed = [LINE.match(r.getMessage()) for r in records]
    assert all(parsed), [r.getMessage() for r in records]
    for record in records:  # the fields --log-format json writes, as the HTTP access lines carry them
        assert record.path.startswith("/") and record.duration_ms >= 0  # type: ignore[attr-defined]
    return [m.groups() for m in parsed if m]


async def test_one_line_per_call_with_method_model_status_and_time(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    caplog.set_level(logging.INFO, logger="lara_serve.access")
    async with serve(make_settings(grpc_port=port)):
        client = grpcaio.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            text = InferInput("raw", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"log this call"], dtype=object))
            caplog.clear()
            assert await client.is_model_ready("no-such-model") is False
            await client.infer(TEXT, [text])
            with pytest.raises(InferenceServerException):
                await client.infer("no-such-model", [text])
            health = health_pb2_grpc.HealthStub(client._channel)
            await health.Check(health_pb2.HealthCheckRequest(service=TEXT), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError):  # not a method of the service: UNIMPLEMENTED, logged too
                await client._channel.unary_unary("/inference.GRPCInferenceService/NoSuchRpc")(b"", timeout=10)
        finally:
            await client.close()
    lines = _lines(caplog)
    service = "/inference.GRPCInferenceService"
    assert [(method, code, name, model) for _, method, code, name, model, _ in lines] == [
        (f"{service}/ModelReady", "0", "OK", "no-such-model"),
        (f"{service}/ModelInfer", "0", "OK", TEXT),
        (f"{service}/ModelInfer", "5", "NOT_FOUND", "no-such-model"),
        ("/grpc.health.v1.Health/Check", "0", "OK", TEXT),
        (f"{service}/NoSuchRpc", "12", "UNIMPLEMENTED", "-"),
    ]
    assert all(peer.startswith("127.0.0.1:") for peer, *_ in lines[:4])
    assert float(lines[1][5]) > 0  # the inference took time; the line says how long


def test_peer_addresses_read_as_uvicorn_prints_them() -> None:
    assert peer_address("ipv4:127.0.0.1:53412") == "127.0.0.1:53412"
    assert peer_address("ipv6:[::1]:53412") == "[::1]:53412"
    assert peer_address("unix:/tmp/s") == "unix:/tmp/s" and peer_address("") == "-"


async def test_without_health_and_reflection_packages_kserve_still_serves(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An environment installed before the grpc extra gained them: a warning, and the KServe service."""
    from lara_serve.server.grpc.service import build_server
    from lara_serve.server.routes.common import AppState

    for module in ("grpc_health.v1", "grpc_reflection.v1alpha", "lara_serve.server.grpc.health",
                   "lara_serve.server.grpc.reflection"):  # fmt: skip
        monkeypatch.setitem(sys.modules, module, None)  # import of it raises ImportError
    port = free_port()
    server = build_server(AppState(make_settings(grpc_port=port)), object())
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            client = grpcaio.InferenceServerClient(f"127.0.0.1:{port}")
            live = await client.is_server_live()
            await client.close()
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10)
    finally:
        await server.stop(None)
    assert live and missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("health checking is off" in m for m in warned) and any("reflection is off" in m for m in warned)
