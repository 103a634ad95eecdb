"""The gRPC port behind HTTP's limits: the key before the message is parsed, a cap on connections in the
shared open-file budget, a cap on calls and on large-message bytes in flight (retryable refusals, counted),
typed contents converted off the event loop, and accept() errors logged at a bounded rate."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from server_helpers import TEXT, serve

from lara_serve.server import Settings, serving
from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.testing import free_port, server_process

grpc = pytest.importorskip("grpc")
from tritonclient.grpc import service_pb2 as pb  # noqa: E402

from lara_serve.server.grpc import convert, service  # noqa: E402
from lara_serve.server.grpc.limits import CallGuard, channel_options  # noqa: E402

KEY = "limits-key"
AUTH = (("authorization", f"Bearer {KEY}"),)
CONNECTIONS = 3  # grpc_max_connections of the live server


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self, metadata: tuple = AUTH) -> None:
        self.metadata, self.status = metadata, None

    def invocation_metadata(self) -> tuple:
        return self.metadata

    def time_remaining(self) -> float | None:
        return None

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        self.status = (code, message)
        raise Aborted(message)


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[tuple[str, str]]:
    port = free_port()
    env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_NUM_THREADS": "1", "LARA_API_KEY": KEY}
    args = ["--log-level", "warning", "--grpc-port", str(port), "--grpc-max-connections", str(CONNECTIONS),
            "--grpc-max-message-bytes", str(1024 * 1024), "--header-timeout-s", "1",
            "--grpc-idle-timeout-s", "2"]  # fmt: skip
    with server_process(args, env=env) as url:
        yield url, f"127.0.0.1:{port}"


def test_key_is_checked_before_the_message_is_parsed(server: tuple[str, str]) -> None:
    """Garbage with the key is INVALID_ARGUMENT (it was parsed); without the key it is never parsed."""
    with grpc.insecure_channel(server[1]) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as parsed:
            infer(b"\xff\xff\xff not a protobuf", metadata=AUTH, timeout=10)
        assert parsed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for metadata in ((), (("x-api-key", "wrong"),)):
            with pytest.raises(grpc.RpcError) as refused:
                infer(b"\xff\xff\xff not a protobuf" * 1000, metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "authorization: Bearer" in refused.value.details()
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        assert pb.ServerLiveResponse.FromString(live(b"", timeout=10)).live  # probes need no key
    metrics = httpx.get(f"{server[0]}/metrics", headers={"authorization": f"Bearer {KEY}"}, timeout=10).text
    assert 'lara_requests_total{model="",outcome="unauthenticated",protocol="grpc"} 2.0' in metrics


def test_connections_over_the_cap_are_refused_and_http_stays_up(server: tuple[str, str]) -> None:
    channels = [grpc.insecure_channel(server[1], options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(6)]
    try:
        codes = []
        for channel in channels:  # each holds its connection open after its call
            live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
            try:
                live(b"", timeout=5)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        assert codes[:CONNECTIONS] == [grpc.StatusCode.OK] * CONNECTIONS
        assert set(codes[CONNECTIONS:]) == {grpc.StatusCode.UNAVAILABLE}  # retryable
        assert httpx.get(f"{server[0]}/v2/health/live", timeout=2).status_code == 200
    finally:
        for channel in channels:
            channel.close()


def _until_closed(address: str, send: bytes, limit_s: float = 8.0) -> tuple[float, bytes]:
    """(seconds until the server closed a raw connection that sent `send`, what it sent meanwhile)."""
    host, port = address.rsplit(":", 1)
    start, received = time.monotonic(), b""
    with socket.create_connection((host, int(port)), timeout=limit_s) as sock:
        sock.sendall(send)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return time.monotonic() - start, received


def _frame_types(data: bytes) -> list[int]:
    types, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        types.append(data[at + 3])
        at += 9 + length
    return types


def test_silent_and_idle_connections_are_closed(server: tuple[str, str]) -> None:
    """No handshake within header_timeout_s (1 s): closed; an HTTP/2 connection without calls for
    grpc_idle_timeout_s (2 s): GOAWAY (frame type 7). grpc's defaults are 120 s and never."""
    silent_s, _ = _until_closed(server[1], b"")
    assert silent_s < 4.0
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
    idle_s, frames = _until_closed(server[1], preface)
    assert 7 in _frame_types(frames) and idle_s < 7.0


def test_grpc_core_never_cancels_calls_the_caps_admit(make_settings: Callable[..., Settings]) -> None:
    """grpc core cancels calls waiting for the server beyond 1000 by default (CANCELLED: not retryable,
    never counted); every stream the connection cap allows may wait, and CallGuard answers beyond its cap."""
    state = SimpleNamespace(settings=make_settings(grpc_max_concurrent_calls=5000))
    options = dict(channel_options(state, max_connections=1000))  # type: ignore[arg-type]
    streams = 1000 * options["grpc.max_concurrent_streams"]
    assert options["grpc.server.max_pending_requests"] >= streams
    assert options["grpc.server.max_pending_requests_hard_limit"] >= streams >= 5000
    assert options["grpc.max_allowed_incoming_connections"] == 1000


def test_fit_all_splits_one_descriptor_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = SimpleNamespace(max_connections=3000, grpc_max_connections=1000, grpc_port=8001)
    monkeypatch.setattr(serving.resource, "getrlimit", lambda _: (4096, 4096))
    http, grpc_connections, backlog = serving.fit_all(settings)
    assert http + grpc_connections + backlog + serving.FD_RESERVE <= 4096
    assert grpc_connections >= 1 and abs(http / grpc_connections - 3) < 0.1  # in proportion
    monkeypatch.setattr(serving.resource, "getrlimit", lambda _: (100_000, 100_000))
    assert serving.fit_all(settings) == (3000, 1000, 2048)
    assert serving.fit_all(SimpleNamespace(max_connections=3000, grpc_max_connections=1000, grpc_port=0))[1] == 0


def _message(size: int) -> bytes:
    request = pb.ModelInferRequest(model_name=TEXT)
    request.inputs.add(name="raw", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"a" * size)
    return request.SerializeToString()


@pytest.mark.anyio
async def test_large_messages_beyond_the_byte_budget_are_resource_exhausted(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(max_large_bodies=2, large_body_bytes=1024, grpc_max_message_bytes=100_000)
    async with serve(settings) as client:
        app = client._transport.app  # type: ignore[attr-defined]
        inference = service.InferenceService(app.state.lara, app.state)
        release = asyncio.Event()

        async def held(request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
            await release.wait()
            return pb.ModelInferResponse()

        monkeypatch.setattr(inference, "ModelInfer", held)
        call = service._Handler(inference)._handlers["ModelInfer"].unary_unary
        first = asyncio.create_task(call(_message(90_000), FakeContext()))
        second = asyncio.create_task(call(_message(90_000), FakeContext()))  # 180 KB of a 200 KB budget
        await asyncio.sleep(0.05)
        refused = FakeContext()
        with pytest.raises(Aborted):
            await call(_message(90_000), refused)
        assert refused.status[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry" in refused.status[1]
        small = asyncio.create_task(call(_message(100), FakeContext()))  # small messages never count
        await asyncio.sleep(0.05)
        assert not small.done()  # admitted: waiting in the held handler, not refused
        release.set()
        await asyncio.gather(first, second, small)
        assert isinstance(await call(_message(90_000), FakeContext()), pb.ModelInferResponse)  # budget given back
        assert app.state.lara.metrics.large_bodies_refused._value.get() == 1


@pytest.mark.anyio
async def test_typed_contents_are_converted_off_the_event_loop(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[bool] = []
    original = convert.decoded_request

    def recorded(request: pb.ModelInferRequest) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return original(request)

    monkeypatch.setattr(convert, "decoded_request", recorded)
    async with serve(make_settings()) as client:
        app = client._transport.app  # type: ignore[attr-defined]
        inference = service.InferenceService(app.state.lara, app.state)
        for count in (10, 200_000):  # 40 B and 800 KB of fp32_contents
            request = pb.ModelInferRequest(model_name=TEXT)
            tensor = request.inputs.add(name="input_ids", datatype="FP32", shape=[1, count])
            tensor.contents.fp32_contents.extend([1.0] * count)
            with pytest.raises(ServeError) as rejected:  # the text model takes INT64 ids: refused after decoding
                await inference.ModelInfer(request, FakeContext())
            assert rejected.value.kind in (ErrorKind.INVALID_INPUT, ErrorKind.TOO_LARGE, ErrorKind.MALFORMED)
    assert threads == [True, False]  # the small one inline, the large one in a worker thread


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_large_fixed_width_contents_are_read_as_bytes_with_the_same_values(datatype: str) -> None:
    values = np.random.default_rng(0).standard_normal(5000)
    request = pb.ModelInferRequest(model_name=TEXT)
    tensor = request.inputs.add(name="x", datatype=datatype, shape=[2, 2500])
    getattr(tensor.contents, f"{datatype.lower()}_contents").extend(values.tolist())
    assert convert._packed_contents(tensor.contents, datatype) is not None  # the fast path is taken
    fast = convert.decoded_request(request).tensors[0].array
    expected = values.astype(np.float32 if datatype == "FP32" else np.float64).reshape(2, 2500)
    assert fast.dtype == expected.dtype and np.array_equal(fast, expected)
    tensor.contents.int_contents.append(1)  # another field set: value by value, with the usual checks
    assert convert._packed_contents(tensor.contents, datatype) is None
    tensor.shape[1] = 2501  # a count that does not match the shape is refused on the fast path too
    tensor.contents.ClearField("int_contents")
    with pytest.raises(ServeError, match="2501"):
        convert.decoded_request(request)


@pytest.mark.anyio
async def test_calls_over_the_cap_are_unavailable_and_counted(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings()) as client:
        state = client._transport.app.state.lara  # type: ignore[attr-defined]
        guard = CallGuard(state, max_calls=1)
        release = asyncio.Event()

        async def held(request: Any, context: Any) -> str:
            await release.wait()
            return "ok"

        async def continuation(details: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(held)

        details = SimpleNamespace(method="/inference.GRPCInferenceService/ModelInfer", invocation_metadata=())
        admitted = await guard.intercept_service(continuation, details)
        running = asyncio.create_task(admitted.unary_unary(None, FakeContext()))
        await asyncio.sleep(0.01)
        refusal = await guard.intercept_service(continuation, details)
        assert refusal.request_deserializer(b"\xff" * 100) is None  # the message is never parsed
        context = FakeContext()
        with pytest.raises(Aborted):
            await refusal.stream_unary(None, context)
        assert context.status[0] == grpc.StatusCode.UNAVAILABLE
        assert state.metrics.requests.labels("", "queue_full", "grpc")._value.get() == 1
        health = SimpleNamespace(method="/grpc.health.v1.Health/Check", invocation_metadata=())
        assert (await guard.intercept_service(continuation, health)).unary_unary is held  # probes pass
        release.set()
        assert await running == "ok" and guard.in_flight == 0


def test_accept_errors_are_logged_at_most_once_per_period() -> None:
    log_filter = serving.AcceptErrorFilter(every_s=60.0)

    def record() -> logging.LogRecord:
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            import sys

            return logging.LogRecord("asyncio", logging.ERROR, "", 0, "socket.accept() out of system resource",
                                     None, sys.exc_info())  # fmt: skip

    passed = [log_filter.filter(record()) for _ in range(1000)]
    assert passed.count(True) == 1 and log_filter.suppressed == 999
    other = logging.LogRecord("asyncio", logging.ERROR, "", 0, "something else", None, None)
    assert log_filter.filter(other)
    log_filter._last -= 61
    again = record()
    assert log_filter.filter(again) and "999 more like it" in str(again.msg) and again.exc_info is None
