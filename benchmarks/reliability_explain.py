"""The `:explain` cases of `python -m benchmarks.reliability` (issue 50's targets), each on a fresh server:

- `explain_memory`: the server's peak RSS above idle while it explains one 1 MiB text (64 passages) against
  while it classifies the same text; target: explaining < 1.5x classifying.
- `explain_fairness`: other clients' p50 latency for short texts alone, and while one client explains 64 KB
  texts back to back (16 passages each); target: within 3x of alone.

The model is the suite's synthetic `rel-long` (compute grows with length) with max_length raised to 1 MiB, so
the figures are the server's own costs (copies of the variants, queueing), not a big network's activations.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable
from pathlib import Path

import httpx

from benchmarks.reliability_bodies import RssSampler
from benchmarks.reliability_cases import Row, rss_mib
from benchmarks.soak_scenarios import Server
from lara_serve.server.synthetic import make_text_model

EXPLAIN = "rel-explain"


def add_model(repo: Path) -> None:
    make_text_model(repo, EXPLAIN, max_length=1 << 20, dim=32, hidden=128)


def _text(size: int) -> bytes:
    sentence = b"The committee met on Tuesday and agreed the budget for the coming year. "
    return (sentence * (size // len(sentence) + 1))[:size]


async def _peak_above(server: Server, send: Awaitable[httpx.Response]) -> tuple[float, int]:
    base = rss_mib(server.proc.pid)
    async with RssSampler(server.proc.pid) as rss:
        response = await send
    return rss.peak - base, response.status_code


async def explain_memory(repo: Path, size: int = 1 << 20, passages: int = 64) -> Row:
    add_model(repo)
    server = Server(
        repo, {"LARA_MODELS": EXPLAIN, "LARA_REQUEST_TIMEOUT_S": "600", "LARA_MAX_BODY_BYTES": str(4 << 20)}
    )
    row = Row(f"explain one {size >> 20} MiB text ({passages} passages) vs classify it: peak RSS above idle")
    text = _text(size)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=900) as client:
            classify = client.post(
                f"/v1/models/{EXPLAIN}:classify", content=text, headers={"Content-Type": "text/plain"}
            )
            classified, c_status = await _peak_above(server, classify)
            body = {"instances": [text.decode()], "parameters": {"max_passages": passages}}
            t0 = time.monotonic()
            explained, e_status = await _peak_above(server, client.post(f"/v1/models/{EXPLAIN}:explain", json=body))
            seconds = time.monotonic() - t0
        row.load_held = (c_status == 200) + (e_status == 200)
        row.lost = 2 - row.load_held
        ratio = explained / max(classified, 1.0)
        row.detail = {"classify_peak_above_idle_mib": round(classified, 1), "explain_peak_above_idle_mib":
                      round(explained, 1), "ratio": round(ratio, 2), "target_ratio_below": 1.5,
                      "explain_s": round(seconds, 1), "statuses": [c_status, e_status]}  # fmt: skip
    finally:
        server.stop()
    return row


async def _short_latencies(client: httpx.AsyncClient, seconds: float) -> list[float]:
    times, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        r = await client.post(f"/v1/models/{EXPLAIN}:predict", json={"instances": ["The vote was close."]})
        r.raise_for_status()
        times.append(time.perf_counter() - t0)
        await asyncio.sleep(0.05)
    return times


async def explain_fairness(repo: Path, size: int = 64 << 10, seconds: float = 20.0) -> Row:
    add_model(repo)
    server = Server(repo, {"LARA_MODELS": EXPLAIN, "LARA_REQUEST_TIMEOUT_S": "120"})
    row = Row(f"short predictions while {size >> 10} KB texts are explained back to back: p50 vs alone")
    body = {"instances": [_text(size).decode()], "parameters": {"max_passages": 16}}
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
            alone = await _short_latencies(client, seconds / 2)
            stop, explained = asyncio.Event(), []

            async def explainer() -> None:
                while not stop.is_set():
                    explained.append((await client.post(f"/v1/models/{EXPLAIN}:explain", json=body)).status_code)

            task = asyncio.create_task(explainer())
            await asyncio.sleep(1.0)  # the first explanation is under way
            during = await _short_latencies(client, seconds)
            stop.set()
            await task
        p50_alone, p50_during = statistics.median(alone), statistics.median(during)
        row.load_held = len(alone) + len(during) + explained.count(200)
        row.lost = sum(s != 200 for s in explained)
        row.detail = {"p50_alone_ms": round(1000 * p50_alone, 1), "p50_during_ms": round(1000 * p50_during, 1),
                      "ratio": round(p50_during / p50_alone, 2), "target_ratio_within": 3.0,
                      "short_requests": [len(alone), len(during)], "explanations": len(explained),
                      "explain_statuses": sorted(set(explained))}  # fmt: skip
    finally:
        server.stop()
    return row
