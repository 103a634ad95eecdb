"""Run one cell: send prepared requests under a load point, bounded by a request count and seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from lara_serve.clients.loadtest.protocol import PreparedRequest
from lara_serve.clients.loadtest.schedule import LoadPoint, arrival_offsets

# Response headers the server sets on every answered inference (server/routes/common.py, server/app.py).
SERVER_HEADERS = {
    "queue_ms": "x-queue-time-ms",
    "inference_ms": "x-inference-time-ms",
    "total_ms": "x-total-time-ms",
    "batch_size": "x-batch-size",
}
# A successful answer: HTTP 200, or gRPC OK (the grpc route counts statuses by gRPC code name).
OK_STATUSES = ("200", "OK")


@dataclass(frozen=True)
class Sample:
    """One request. Times are seconds on the cell's clock (time.perf_counter() - cell start)."""

    scheduled: float  # when it should have gone (open loop) or went (closed loop)
    sent: float
    done: float
    status: str  # "200", "413", a gRPC code ("OK", "RESOURCE_EXHAUSTED"), or "connect-error", "timeout", ...
    server: dict[str, float]  # SERVER_HEADERS present on the answer, as numbers

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES

    @property
    def latency_ms(self) -> float:
        return (self.done - self.scheduled) * 1000.0

    @property
    def send_lag_ms(self) -> float:
        return (self.sent - self.scheduled) * 1000.0


@dataclass(frozen=True)
class CellRun:
    samples: list[Sample]
    duration_s: float  # start to last answer
    stopped_by: str  # "requests" or "seconds"


def _transport_error(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect-error"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "disconnected"
    return type(exc).__name__


class Sender(Protocol):
    """A route that is not HTTP (gRPC): sends one prepared request and times it as `send` does."""

    async def send(self, request: PreparedRequest, start: float, scheduled: float) -> Sample: ...

    async def warm_up(self, requests: Sequence[PreparedRequest], n: int) -> str | None:
        """Send n requests one by one; a reason to skip the input's cells (refused as too large), or None."""
        ...

    async def aclose(self) -> None: ...


Client = httpx.AsyncClient | Sender


def server_values(headers: Mapping[str, str]) -> dict[str, float]:
    """SERVER_HEADERS from HTTP headers or gRPC trailing metadata (the server sends the same lower-case names)."""
    values: dict[str, float] = {}
    for key, header in SERVER_HEADERS.items():
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            values[key] = float(raw)
        except ValueError:  # another server's header of the same name: ignore, do not crash the run
            continue
    return values


async def send(client: Client, request: PreparedRequest, start: float, scheduled: float) -> Sample:
    if not isinstance(client, httpx.AsyncClient):
        return await client.send(request, start, scheduled)
    sent = time.perf_counter() - start
    try:
        response = await client.post(request.path, content=request.content, headers=request.headers,
                                     params=request.params)  # fmt: skip
        await response.aread()
        status, server = str(response.status_code), server_values(response.headers)
    except httpx.HTTPError as exc:
        status, server = _transport_error(exc), {}
    return Sample(scheduled, sent, time.perf_counter() - start, status, server)


def _ignore(sample: Sample) -> None:
    return None


@dataclass(frozen=True)
class CellPlan:
    """What one cell sends, in turn, and where it stops: after `max_requests` or `max_seconds`, whichever is first."""

    requests: Sequence[PreparedRequest]
    max_requests: int
    max_seconds: float
    seed: int = 0  # the open loop's arrival schedule
    on_done: Callable[[Sample], None] = _ignore  # called with each answered request (progress bars)


async def run_closed(client: Client, plan: CellPlan, concurrency: int) -> CellRun:
    samples: list[Sample] = []
    issued = 0
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal issued
        while issued < plan.max_requests and time.perf_counter() - start < plan.max_seconds:
            request = plan.requests[issued % len(plan.requests)]
            issued += 1
            sample = await send(client, request, start, time.perf_counter() - start)
            samples.append(sample)
            plan.on_done(sample)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    duration = time.perf_counter() - start
    return CellRun(samples, duration, "requests" if issued >= plan.max_requests else "seconds")


async def run_open(client: Client, plan: CellPlan, point: LoadPoint) -> CellRun:
    assert point.rate is not None
    offsets = arrival_offsets(point.rate, point.arrival, plan.max_requests, plan.max_seconds, plan.seed)
    gate = asyncio.Semaphore(point.max_in_flight) if point.max_in_flight else None
    samples: list[Sample] = []
    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()

    async def fire(request: PreparedRequest, scheduled: float) -> None:
        try:
            sample = await send(client, request, start, scheduled)
        finally:
            if gate is not None:
                gate.release()
        samples.append(sample)
        plan.on_done(sample)

    for i, offset in enumerate(offsets):
        delay = offset - (time.perf_counter() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        if gate is not None:
            await gate.acquire()  # waiting here is client-side queueing: it is counted from `offset`
        tasks.append(asyncio.create_task(fire(plan.requests[i % len(plan.requests)], offset)))
    await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    return CellRun(samples, duration, "requests" if len(offsets) >= plan.max_requests else "seconds")


async def run_cell(client: Client, plan: CellPlan, point: LoadPoint) -> CellRun:
    if point.mode == "closed":
        assert point.concurrency is not None
        return await run_closed(client, plan, point.concurrency)
    return await run_open(client, plan, point)
