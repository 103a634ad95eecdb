"""The gRPC port's cases of `python -m benchmarks.reliability` (issue 50): idle connections, unauthenticated
large messages, typed contents, and a thousand calls at once. Each on a fresh server on 127.0.0.1 with
--grpc-port; caps set low so the counts stay small on a shared machine.

    .venv/bin/python -m benchmarks.reliability grpc_idle grpc_unauth grpc_typed grpc_calls \
        --out benchmarks/results/reliability_grpc.json
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from benchmarks.reliability_bodies import RssSampler
from benchmarks.reliability_cases import TEXT, LivenessProbe, Row, rss_mib
from benchmarks.soak_scenarios import Server
from lara_serve.server.testing import free_port

KEY = "bench-key"
AUTH = (("authorization", f"Bearer {KEY}"),)
INFER = "/inference.GRPCInferenceService/ModelInfer"
# An HTTP/2 client's opening: the preface and an empty SETTINGS frame; the server answers with its SETTINGS.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
RETRYABLE = {"UNAVAILABLE", "RESOURCE_EXHAUSTED"}


def _grpc_server(repo: Path, env: dict[str, str], nofile: int | None = None) -> tuple[Server, str]:
    port = free_port()
    full = {"LARA_MODELS": TEXT, "LARA_GRPC_PORT": str(port), "LARA_NUM_THREADS": "1", **env}
    return Server(repo, full, nofile=nofile), f"127.0.0.1:{port}"


def _open_idle(address: str, count: int) -> tuple[list[socket.socket], int]:
    """`count` connections that sent the HTTP/2 preface and got the server's SETTINGS; (open sockets, how
    many of them the server closed or never answered)."""
    host, port = address.rsplit(":", 1)
    held, closed = [], 0
    for _ in range(count):
        try:
            sock = socket.create_connection((host, int(port)), timeout=3)
            sock.sendall(H2_PREFACE)
            if not sock.recv(9):  # the server's SETTINGS frame header, or EOF when over the cap
                closed += 1
                sock.close()
                continue
            held.append(sock)
        except OSError:
            closed += 1
    return held, closed


async def idle_connections(repo: Path, cap: int = 80, nofile: int = 256, hold_s: float = 20.0) -> Row:
    """4 x grpc_max_connections idle HTTP/2 connections (more than the open-file limit) held for hold_s,
    while HTTP liveness is probed every 20 ms: no probe may take 1 s."""
    server, address = _grpc_server(repo, {"LARA_MAX_CONNECTIONS": "60", "LARA_GRPC_MAX_CONNECTIONS": str(cap)},
                                   nofile=nofile)  # fmt: skip
    row = Row(f"{4 * cap} idle gRPC connections vs grpc_max_connections={cap}, nofile {nofile}")
    try:
        with LivenessProbe(server.url) as probe, grpc.insecure_channel(address) as before:
            earlier = before.unary_unary("/inference.GRPCInferenceService/ServerLive")
            earlier(b"", timeout=10)  # a client connected before the flood keeps being served
            held, refused = await asyncio.to_thread(_open_idle, address, 4 * cap - 1)
            grpc_during = []
            for _ in range(int(hold_s)):
                await asyncio.sleep(1.0)
                start = time.monotonic()
                earlier(b"", timeout=10)
                grpc_during.append(time.monotonic() - start)
            with grpc.insecure_channel(address) as channel:  # a new client once the idle ones leave
                for sock in held:
                    sock.close()
                await asyncio.sleep(1.0)
                live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
                grpc_live_after = bool(pb.ServerLiveResponse.FromString(live(b"", timeout=10)).live)
        log = server.stop()
        slow = sum(t >= 1.0 for t in probe.times)
        row.load_held = len(probe.times) - slow
        row.faults_survived = refused
        row.lost = slow + (not grpc_live_after) + sum(t >= 1.0 for t in grpc_during)
        row.detail = {"held_open": len(held), "refused": refused, "liveness": probe.stats(),
                      "grpc_live_after": grpc_live_after,
                      "grpc_earlier_client_max_s": round(max(grpc_during), 3), "log_lines": log.count("\n"),
                      "emfile_lines": log.count("Too many open files")}  # fmt: skip
    except BaseException:
        server.stop()
        raise
    return row


def _large_request(size: int) -> bytes:
    request = pb.ModelInferRequest(model_name=TEXT)
    request.inputs.add(name="raw", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"a" * size)
    return request.SerializeToString()


async def _calls(address: str, bodies: list[bytes], metadata: tuple, channels: int = 1) -> dict[str, int]:
    """Send every body as a ModelInfer at once over `channels` connections; status name -> count."""
    opened = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1),
              ("grpc.max_send_message_length", 64 << 20)]) for _ in range(channels)]  # fmt: skip
    codes: dict[str, int] = {}

    async def one(index: int, body: bytes) -> None:
        call = opened[index % channels].unary_unary(INFER)
        try:
            await call(body, metadata=metadata, timeout=120)
            name = "OK"
        except grpc.aio.AioRpcError as exc:
            name = exc.code().name
        codes[name] = codes.get(name, 0) + 1

    try:
        await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
    finally:
        await asyncio.gather(*(c.close() for c in opened))
    return codes


async def unauthenticated_large(repo: Path, count: int = 64, size: int = 15_000_000) -> Row:
    """`count` concurrent 15 MB ModelInfer calls without the key: RSS may grow < 100 MB."""
    server, address = _grpc_server(repo, {"LARA_API_KEY": KEY, "LARA_GRPC_MAX_MESSAGE_BYTES": str(16 << 20)})
    row = Row(f"{count} x {size // 10**6} MB unauthenticated gRPC calls at once")
    body = _large_request(size)
    try:
        await asyncio.sleep(1.0)
        before = rss_mib(server.proc.pid)
        with LivenessProbe(server.url) as probe:
            async with RssSampler(server.proc.pid) as rss:
                codes = await _calls(address, [body] * count, (), channels=8)
        row.bad_inputs = count
        row.faults_survived = codes.get("UNAUTHENTICATED", 0)
        row.lost = count - row.faults_survived
        row.detail = {"codes": codes, "rss_before_mib": round(before), "rss_peak_mib": round(rss.peak),
                      "rss_growth_mib": round(rss.peak - before), "rss_after_mib": round(rss_mib(server.proc.pid)),
                      "liveness": probe.stats()}  # fmt: skip
    finally:
        server.stop()
    return row


async def typed_contents(repo: Path, count: int = 8, values: int = 3_750_000) -> Row:
    """`count` authenticated calls of `values` fp32_contents each (15 MB): health answered within 1 s."""
    server, address = _grpc_server(repo, {"LARA_GRPC_MAX_MESSAGE_BYTES": str(16 << 20)})
    row = Row(f"{count} x {values * 4 // 10**6} MB typed fp32_contents gRPC calls")
    request = pb.ModelInferRequest(model_name=TEXT)
    tensor = request.inputs.add(name="input_ids", datatype="FP32", shape=[1, values])
    tensor.contents.fp32_contents.extend(np.ones(values, dtype=np.float32).tolist())
    body = request.SerializeToString()
    try:
        with LivenessProbe(server.url) as probe:
            codes = await _calls(address, [body] * count, (), channels=2)
        slow = sum(t >= 1.0 for t in probe.times)
        row.bad_inputs = count  # the text model takes INT64 ids: each is refused after it is converted
        row.load_held = len(probe.times) - slow
        row.lost = slow + sum(n for c, n in codes.items() if c not in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"))
        row.detail = {"codes": codes, "liveness": probe.stats()}
    finally:
        server.stop()
    return row


async def many_calls(repo: Path, count: int = 2000, cap: int = 1000) -> Row:
    """`count` small calls at once over 16 connections against grpc_max_concurrent_calls=cap: each is OK or
    a retryable refusal (never CANCELLED), and each is counted in lara_requests_total{protocol="grpc"}."""
    server, address = _grpc_server(repo, {"LARA_GRPC_MAX_CONCURRENT_CALLS": str(cap)})
    row = Row(f"{count} gRPC calls at once vs grpc_max_concurrent_calls={cap}")
    request = pb.ModelInferRequest(model_name=TEXT)
    request.inputs.add(name="raw", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"a short text " * 8)
    try:
        start = time.monotonic()
        codes = await _calls(address, [request.SerializeToString()] * count, (), channels=16)
        counted = _grpc_requests(server)
        row.load_held = codes.get("OK", 0) + sum(codes.get(c, 0) for c in RETRYABLE)
        row.lost = count - row.load_held
        row.detail = {"codes": codes, "seconds": round(time.monotonic() - start, 1), "counted_in_metrics": counted}
        row.lost += abs(count - int(counted))
    finally:
        server.stop()
    return row


def _grpc_requests(server: Server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("lara_requests_total{") and 'protocol="grpc"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


CASES: dict[str, Any] = {
    "grpc_idle": idle_connections,
    "grpc_unauth": unauthenticated_large,
    "grpc_typed": typed_contents,
    "grpc_calls": many_calls,
}
