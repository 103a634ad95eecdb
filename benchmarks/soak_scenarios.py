"""The reliability issue's failure cases, each on a fresh `python -m lara_serve.server` on 127.0.0.1 (run through
`benchmarks/soak.py --scenarios [names]`): clients that hang up while queued, requests that time out,
idle connections against a low open-file limit, and the memory of a burst of large image decodes."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from lara_serve.server.repository import read_config
from lara_serve.server.testing import free_port

WORDS = ("market", "team", "election", "science", "goal", "engine", "rates", "vote",
         "match", "orbit", "trade", "court", "storm", "chip")  # fmt: skip
SOAK = Path(__file__).resolve().parent / "soak.py"


class Server:
    """`python -m lara_serve.server` on a free loopback port; `nofile` lowers its open-file limit (as `ulimit -n`)."""

    def __init__(self, repo: Path, env: dict[str, str], nofile: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {**os.environ, "LARA_MODEL_REPOSITORY": str(repo), "LARA_LOG_LEVEL": "warning", **env}

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server; read in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "lara_serve.server", "--port", str(self.port)], env=full,
                                     stdout=self.log, stderr=self.log, preexec_fn=limit)  # fmt: skip
        deadline = time.monotonic() + 300
        while not _ready(self.url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server did not become ready")
            time.sleep(0.1)

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _raw_predict(port: int, model: str, docs: list[str]) -> socket.socket:
    body = json.dumps({"instances": docs}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST /v1/models/{model}:predict HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
    return sock


def scenario_hang_ups(repo: Path, model: str) -> dict[str, Any]:
    """100 clients send 2-3 documents each and hang up 0.5 s after the server has queued them all (on a
    loaded machine the server may take longer than 0.5 s just to read 100 bodies)."""
    server = Server(repo, {"LARA_NUM_THREADS": "1"})
    docs = [[" ".join(random.choices(WORDS, k=300))] * random.randint(2, 3) for _ in range(100)]
    socks = [_raw_predict(server.port, model, d) for d in docs]
    deadline = time.monotonic() + 60
    while server.metric("lara_requests_in_flight") < 100 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    computed_before = server.metric("lara_batch_size_sum")
    for sock in socks:
        sock.close()
    time.sleep(3)
    while server.metric("lara_requests_in_flight") > 0:
        time.sleep(0.5)
    result = {"clients": 100, "items": sum(map(len, docs)), "computed_before_hang_up": computed_before,
              "computed_in_total": server.metric("lara_batch_size_sum"),
              "orphaned_in_flight_at_hang_up": server.metric("lara_items_orphaned_total"),
              "dropped_uncomputed": server.metric("lara_items_dropped_total"),
              "requests_counted_client_disconnected": server.metric(f'lara_requests_total{{model="{model}",outcome="client_disconnected",protocol="v1"}}')}  # fmt: skip
    server.stop()
    return result


def scenario_timeouts(repo: Path, model: str, seconds: float = 15.0) -> dict[str, Any]:
    """LARA_REQUEST_TIMEOUT_S=1, 64 closed-loop clients for 15 s."""
    server = Server(repo, {"LARA_NUM_THREADS": "1", "LARA_REQUEST_TIMEOUT_S": "1"})
    statuses: dict[str, int] = {}
    end = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            while time.monotonic() < end:
                doc = " ".join(random.choices(WORDS, k=300))
                code = str(c.post(f"/v1/models/{model}:predict", json={"instances": [doc]}).status_code)
                statuses[code] = statuses.get(code, 0) + 1

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(lambda _: client(), range(64)))
    result = {"clients": 64, "seconds": seconds, "statuses": statuses,
              "items_computed": server.metric("lara_batch_size_sum"),
              "computed_for_requests_answered_504": server.metric("lara_items_orphaned_total"),
              "dropped_uncomputed": server.metric("lara_items_dropped_total")}  # fmt: skip
    server.stop()
    return result


def scenario_idle_connections(repo: Path, model: str) -> dict[str, Any]:
    """300 idle connections against a server whose open-file limit is 256."""
    server = Server(repo, {"LARA_HEADER_TIMEOUT_S": "5"}, nofile=256)
    t0 = time.monotonic()
    idle = []
    for _ in range(300):
        try:
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        except OSError:
            break
    while_full = httpx.post(f"{server.url}/v1/models/{model}:predict", json={"instances": ["x"]}, timeout=30)
    while not _ready(server.url) or httpx.post(f"{server.url}/v1/models/{model}:predict",
                                                json={"instances": ["x"]}, timeout=30).status_code != 200:  # fmt: skip
        time.sleep(0.2)
    recovered_s = time.monotonic() - t0
    for sock in idle:
        sock.close()
    log = server.stop()
    return {"idle_connections_opened": len(idle), "request_while_full": while_full.status_code,
            "while_full_is_json": while_full.headers.get("content-type") == "application/json",
            "serving_again_after_s": round(recovered_s, 1), "too_many_open_files_in_log": "Too many open files" in log,
            }  # fmt: skip


def decode_probe(mode: str) -> float:
    """Peak RSS added (MiB) by 32 concurrent decodes of a 4096x4096 PNG run as the routes run them
    (asyncio.to_thread), with the server's decode budget (mode "budget") or without ("none")."""
    import numpy as np
    from PIL import Image

    from lara_serve.server.preprocess import DecodeBudget, image_item
    from lara_serve.server.repository import ImagePreprocessing

    def kib(field: str) -> int:
        status = Path("/proc/self/status").read_text().splitlines()
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

    pixels = np.random.default_rng(0).integers(0, 256, (4096, 4096, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    data, prep = buffer.getvalue(), ImagePreprocessing(kind="image", height=28, width=28)
    budget = DecodeBudget(2 * 4096 * 4096) if mode == "budget" else None

    async def burst() -> None:
        await asyncio.gather(*(asyncio.to_thread(image_item, data, prep, 4096 * 4096, budget) for _ in range(32)))

    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = kib("VmRSS")
    asyncio.run(burst())
    return (kib("VmHWM") - before) / 1024


def scenario_decode_memory(repo: Path, model: str) -> dict[str, Any]:
    """Each mode in a fresh process: freed decode buffers stay in glibc arenas, so order would matter."""
    out = {}
    for mode in ("none", "budget"):
        run = subprocess.run(
            [sys.executable, str(SOAK), "--decode-probe", mode], capture_output=True, text=True, check=True
        )
        out[f"peak_extra_mib_{mode}"] = round(float(run.stdout.strip().splitlines()[-1]), 1)
    return {"images": "32 x 4096x4096 PNG at once", **out}


def scenarios(args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(args.model_repository)
    model = next(p.parent.name for p in sorted(repo.glob("*/config.json")) if read_config(p.parent).task == "text")
    runs = {"hang_ups": scenario_hang_ups, "timeouts": scenario_timeouts,
            "idle_connections": scenario_idle_connections, "decode_memory": scenario_decode_memory}  # fmt: skip
    return {"model": model} | {name: runs[name](repo, model) for name in args.scenarios.split(",")}
