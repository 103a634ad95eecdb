"""Load tester: throughput and latency percentiles vs concurrency and document length.

`python -m clients.loadtest --model NAME --concurrency 1,8,32 --doc-bytes 512,2048,8192 --out r.json`
Only loopback servers (127.0.0.0/8, localhost) are accepted, and every cell is bounded in requests and
time, so a typo cannot turn this into a load generator against someone else's machine.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import numpy as np

MAX_REQUESTS_PER_CELL = 100_000
MAX_SECONDS_PER_CELL = 300.0
_WORDS = [
    "the",
    "of",
    "market",
    "team",
    "match",
    "election",
    "chip",
    "price",
    "goal",
    "vote",
    "launch",
    "league",
    "bank",
    "orbit",
]


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"load tests run against loopback only (127.0.0.1, localhost); got {host!r}")


def make_doc(n_bytes: int, seed: int) -> str:
    """Deterministic ASCII text of exactly n_bytes bytes."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < n_bytes:
        words.append(rng.choice(_WORDS))
        size += len(words[-1]) + 1
    return " ".join(words)[:n_bytes].ljust(n_bytes, "x")


@dataclass(frozen=True)
class CellResult:
    concurrency: int
    doc_bytes: int
    requests: int
    errors: int
    statuses: dict[str, int]
    duration_s: float
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    server_queue_ms_mean: float
    server_inference_ms_mean: float
    server_total_ms_mean: float


async def run_cell(
    client: httpx.AsyncClient,
    model: str,
    concurrency: int,
    doc_bytes: int,
    max_requests: int,
    max_seconds: float,
    route: str = "predict",
) -> CellResult:
    max_requests = min(max_requests, MAX_REQUESTS_PER_CELL)
    max_seconds = min(max_seconds, MAX_SECONDS_PER_CELL)
    docs = [make_doc(doc_bytes, seed) for seed in range(16)]
    latencies: list[float] = []
    server: list[tuple[float, float, float]] = []
    statuses: Counter[str] = Counter()
    issued = 0
    start = time.perf_counter()
    deadline = start + max_seconds

    async def worker(worker_id: int) -> None:
        nonlocal issued
        while issued < max_requests and time.perf_counter() < deadline:
            doc = docs[(issued + worker_id) % len(docs)]
            issued += 1
            t0 = time.perf_counter()
            try:
                if route == "classify":
                    response = await client.post(
                        f"/v1/models/{model}:classify", content=doc.encode(), headers={"Content-Type": "text/plain"}
                    )
                else:
                    response = await client.post(f"/v1/models/{model}:predict", json={"instances": [doc]})
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
                continue
            latencies.append(time.perf_counter() - t0)
            statuses[str(response.status_code)] += 1
            if response.status_code == 200:
                h = response.headers
                server.append(tuple(float(h.get(k, "nan")) for k in
                                    ("x-queue-time-ms", "x-inference-time-ms", "x-total-time-ms")))  # type: ignore[arg-type]  # fmt: skip

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    duration = time.perf_counter() - start
    ok = statuses.get("200", 0)
    lat_ms = np.array(latencies) * 1000 if latencies else np.array([np.nan])
    srv = np.array(server) if server else np.full((1, 3), np.nan)
    return CellResult(
        concurrency=concurrency,
        doc_bytes=doc_bytes,
        requests=sum(statuses.values()),
        errors=sum(statuses.values()) - ok,
        statuses=dict(statuses),
        duration_s=round(duration, 3),
        throughput_rps=round(ok / duration, 2),
        p50_ms=round(float(np.percentile(lat_ms, 50)), 3),
        p99_ms=round(float(np.percentile(lat_ms, 99)), 3),
        mean_ms=round(float(lat_ms.mean()), 3),
        server_queue_ms_mean=round(float(srv[:, 0].mean()), 3),
        server_inference_ms_mean=round(float(srv[:, 1].mean()), 3),
        server_total_ms_mean=round(float(srv[:, 2].mean()), 3),
    )


async def run(
    url: str,
    model: str,
    concurrencies: Sequence[int],
    doc_lengths: Sequence[int],
    max_requests: int,
    max_seconds: float,
    api_key: str | None = None,
    route: str = "predict",
    warmup_requests: int = 8,
) -> list[CellResult]:
    check_loopback(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max(concurrencies) + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60.0, limits=limits) as client:
        results = []
        for doc_bytes in doc_lengths:
            await run_cell(client, model, 2, doc_bytes, warmup_requests, 10.0, route)  # connections, caches
            for concurrency in concurrencies:
                cell = await run_cell(client, model, concurrency, doc_bytes, max_requests, max_seconds, route)
                print(json.dumps(asdict(cell)), file=sys.stderr)
                results.append(cell)
        return results


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clients.loadtest", description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--concurrency", type=_ints, default=[1, 8, 32])
    parser.add_argument("--doc-bytes", type=_ints, default=[512, 2048, 8192])
    parser.add_argument("--requests", type=int, default=500, help=f"per cell, at most {MAX_REQUESTS_PER_CELL}")
    parser.add_argument("--seconds", type=float, default=10.0, help=f"per cell, at most {MAX_SECONDS_PER_CELL}")
    parser.add_argument("--route", choices=["predict", "classify"], default="predict")
    parser.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    args = parser.parse_args(argv)
    try:
        check_loopback(args.url)
    except ValueError as exc:
        parser.error(str(exc))
    cells = asyncio.run(
        run(
            args.url,
            args.model,
            args.concurrency,
            args.doc_bytes,
            args.requests,
            args.seconds,
            args.api_key,
            args.route,
        )  # fmt: skip
    )
    report: dict[str, Any] = {"url": args.url, "model": args.model, "route": args.route,
                              "cells": [asdict(c) for c in cells]}  # fmt: skip
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
