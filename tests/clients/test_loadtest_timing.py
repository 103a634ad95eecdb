"""Open-loop timing without a network: a mock server that takes a known time per request.

These pin the rule that makes open-loop numbers trustworthy: latency runs from the SCHEDULED send
time, so a slow server (or a full in-flight cap) shows up as latency, not as silently fewer requests.
"""

from __future__ import annotations

import asyncio
import statistics

import httpx
import pytest

from lara_serve.clients.loadtest.protocol import PreparedRequest
from lara_serve.clients.loadtest.report import percentile
from lara_serve.clients.loadtest.runner import CellPlan, run_closed, run_open
from lara_serve.clients.loadtest.schedule import LoadPoint, arrival_offsets

SERVICE_S = 0.03


def slow_client(service_s: float = SERVICE_S) -> httpx.AsyncClient:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(service_s)
        return httpx.Response(200, headers={"X-Batch-Size": "1", "X-Queue-Time-Ms": "0.5"}, json={})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://127.0.0.1")


REQUEST = [PreparedRequest("/v1/models/m:predict", b"{}")]


def test_arrival_offsets() -> None:
    constant = arrival_offsets(50.0, "constant", 10, 60.0, seed=0)
    assert constant == pytest.approx([i / 50.0 for i in range(10)])
    poisson = arrival_offsets(100.0, "poisson", 4000, 1e9, seed=3)
    gaps = [b - a for a, b in zip(poisson, poisson[1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.01, rel=0.05)  # mean gap 1/rate
    assert statistics.stdev(gaps) == pytest.approx(0.01, rel=0.1)  # exponential: sd = mean
    assert poisson == arrival_offsets(100.0, "poisson", 4000, 1e9, seed=3)  # seeded
    assert max(arrival_offsets(100.0, "poisson", 10_000, 2.0, seed=0)) <= 2.0  # bounded by seconds


def test_open_loop_counts_latency_from_the_schedule() -> None:
    """Rate 100/s, one request in flight, 30 ms each: request i waits about i * 20 ms before it can go."""
    point = LoadPoint.open(100.0, "constant", max_in_flight=1)

    async def go() -> list:
        async with slow_client() as client:
            return (await run_open(client, CellPlan(REQUEST, max_requests=12, max_seconds=5.0), point)).samples

    samples = sorted(asyncio.run(go()), key=lambda s: s.scheduled)
    assert [s.scheduled for s in samples] == pytest.approx([i / 100.0 for i in range(12)])
    assert all(s.sent >= s.scheduled - 1e-3 and s.done > s.sent for s in samples)
    for s in samples:
        assert s.latency_ms == pytest.approx((s.done - s.scheduled) * 1000)
    # Service time alone is ~30 ms; the last request also waited ~11 * 20 ms for its turn (a busy
    # machine only adds to both, so these hold under load too).
    assert samples[-1].latency_ms > samples[0].latency_ms + 150
    assert samples[-1].send_lag_ms > 150
    assert all(s.server["batch_size"] == 1 for s in samples)


def test_open_loop_without_cap_keeps_the_rate() -> None:
    """No cap: requests go on schedule even though each takes 30 ms (more than the 10 ms gap)."""

    async def go() -> list:
        async with slow_client() as client:
            return (await run_open(client, CellPlan(REQUEST, 20, 5.0), LoadPoint.open(100.0, "constant"))).samples

    samples = asyncio.run(go())
    # With one request in flight the 20th would go ~19 * 20 ms = 380 ms late; here none waits for another.
    assert max(s.send_lag_ms for s in samples) < 200
    assert percentile([s.latency_ms for s in samples], 50) < SERVICE_S * 1000 + 100  # type: ignore[operator]


def test_closed_loop_bounds() -> None:
    async def go(requests: int, seconds: float) -> tuple[int, str]:
        async with slow_client(0.01) as client:
            run = await run_closed(client, CellPlan(REQUEST, requests, seconds), 4)
            return len(run.samples), run.stopped_by

    assert asyncio.run(go(10, 30.0)) == (10, "requests")
    count, why = asyncio.run(go(100_000, 0.2))
    assert why == "seconds" and 4 <= count < 200


def test_percentile_matches_numpy_and_is_none_when_empty() -> None:
    np = pytest.importorskip("numpy")
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (50, 90, 95, 99):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None
