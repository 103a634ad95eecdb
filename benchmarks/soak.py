"""Soak (not a test): a real `python -m lara_serve.server` on 127.0.0.1 under steady mixed traffic for a bounded time.

Traffic per client loop: valid text predictions (v1 and v2), images, malformed bodies (4xx expected), and
clients that hang up while their request is queued. Every `--sample-s` seconds the server's RSS and open
file descriptors (/proc) and the window's latency percentiles and status counts are recorded. At the
end the server gets SIGTERM while the load is still running: accepted requests must all be answered.

    .venv/bin/python benchmarks/soak.py                 # 5 minutes, shipped models
    .venv/bin/python benchmarks/soak.py --minutes 1     # shorter

Writes benchmarks/results/soak.json and soak.png. Linux only (/proc).

    .venv/bin/python benchmarks/soak.py --scenarios     # the issue's failure cases (benchmarks/soak_scenarios.py)

writes benchmarks/results/soak_scenarios.json.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lara_serve.server.repository import read_config  # noqa: E402
from lara_serve.server.settings import DEFAULT_MODEL_REPOSITORY  # noqa: E402
from lara_serve.server.testing import free_port  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WORDS = ("market", "team", "election", "science", "goal", "engine", "rates", "vote",
         "match", "orbit", "trade", "court", "storm", "chip")  # fmt: skip


def proc_stats(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open file descriptors) of a process."""
    rss_kib = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))  # fmt: skip
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.effect_noise((28, 28), random.uniform(20, 80)).convert("L").save(buffer, format="PNG")
    return buffer.getvalue()


class Tally:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.statuses: dict[str, int] = {}
        self.plain_5xx = 0
        self.transport_errors = 0

    def add(self, status: int | str, seconds: float | None = None, content_type: str = "") -> None:
        self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
        if isinstance(status, int) and status >= 500 and "json" not in content_type:
            self.plain_5xx += 1
        if seconds is not None and status == 200:
            self.latencies.append(seconds)


async def one_request(client: httpx.AsyncClient, text_model: str, image_model: str | None, tally: Tally) -> None:
    kind = random.choices(["v1", "v2", "image", "bad", "deep"], weights=[50, 25, 10 if image_model else 0, 10, 5])[0]
    doc = " ".join(random.choices(WORDS, k=random.randint(20, 300)))
    if kind == "v1":
        args: dict[str, Any] = {
            "url": f"/v1/models/{text_model}:predict",
            "json": {"instances": [doc] * random.randint(1, 4)},
        }
    elif kind == "v2":
        args = {"url": f"/v2/models/{text_model}/infer",
                "json": {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": [doc]}]}}  # fmt: skip
    elif kind == "image":
        args = {"url": f"/v1/models/{image_model}:classify", "content": png(), "headers": {"content-type": "image/png"}}
    elif kind == "bad":
        args = {"url": f"/v1/models/{text_model}:predict", "content": b'{"instances": [1, 2'}
    else:
        args = {"url": f"/v2/models/{text_model}/infer", "content": b"[" * 5000 + b"]" * 5000}
    start = time.perf_counter()
    try:
        response = await client.post(**args)
    except httpx.ConnectError:  # never accepted (the server has closed its listener): not a lost request
        tally.add("connect_refused")
        await asyncio.sleep(0.05)
        return
    except httpx.HTTPError as exc:  # sent, and the connection broke before an answer: lost
        tally.add(f"transport_error:{type(exc).__name__}")
        tally.transport_errors += 1
        return
    tally.add(response.status_code, time.perf_counter() - start, response.headers.get("content-type", ""))


async def hang_up(port: int, text_model: str, tally: Tally) -> None:
    """A client that sends a valid request and leaves before the answer."""
    body = json.dumps({"instances": [" ".join(random.choices(WORDS, k=200))] * 4}).encode()
    head = (f"POST /v1/models/{text_model}:predict HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + body)
        await writer.drain()
    except OSError:
        await asyncio.sleep(0.05)
        return
    await asyncio.sleep(random.uniform(0.0, 0.05))
    writer.close()
    tally.add("hung_up")


async def load(
    url: str, port: int, models: tuple[str, str | None], stop: asyncio.Event, tally: Tally, clients: int
) -> None:
    async def loop(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            if random.random() < 0.05:
                await hang_up(port, models[0], tally)
            else:
                await one_request(client, *models, tally)

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await asyncio.gather(*(loop(client) for _ in range(clients)))


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    wanted = ("lara_requests_total", "lara_items_dropped_total", "lara_items_orphaned_total")
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+\{[^}]*\}) (\S+)$", text, re.MULTILINE)
            if m.group(1).startswith(wanted)}  # fmt: skip


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(args.model_repository)
    names = sorted(p.parent.name for p in repo.glob("*/config.json"))
    tasks = {n: read_config(repo / n).task for n in names}
    text_model = next(n for n in names if tasks[n] == "text")
    image_model = next((n for n in names if tasks[n] == "image"), None)
    port = free_port()
    env = {**os.environ, "LARA_MODEL_REPOSITORY": str(repo), "LARA_NUM_THREADS": str(args.threads),
           "LARA_REQUEST_TIMEOUT_S": "10", "LARA_LOG_LEVEL": "warning"}  # fmt: skip
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lara_serve.server", "--port", str(port)], env=env, stdout=log, stderr=log
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(1200):
                try:
                    if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("server did not become ready")
            samples, tally, stop = [], Tally(), asyncio.Event()
            runner = asyncio.create_task(load(url, port, (text_model, image_model), stop, tally, args.clients))
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.minutes * 60:
                await asyncio.sleep(args.sample_s)
                rss, fds = proc_stats(proc.pid)
                window, tally.latencies = tally.latencies, []
                q = statistics.quantiles(window, n=100) if len(window) >= 2 else [float("nan")] * 99
                samples.append({"t_s": round(time.monotonic() - t0, 1), "rss_mib": round(rss, 1), "fds": fds,
                                "ok": len(window), "p50_ms": round(q[49] * 1000, 1), "p99_ms": round(q[98] * 1000, 1),
                                "statuses": dict(tally.statuses)})  # fmt: skip
                print(json.dumps(samples[-1]), flush=True)
            before = scrape(url)
            # Shutdown under load: the clients keep sending while the server drains.
            proc.send_signal(signal.SIGTERM)
            drain_start = time.monotonic()
            await asyncio.to_thread(proc.wait, 120)
            drain_s = time.monotonic() - drain_start
            stop.set()
            await asyncio.wait_for(runner, 120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.seek(0)
        server_log = log.read().decode(errors="replace")
    return {
        "minutes": args.minutes, "clients": args.clients, "threads": args.threads, "models": names,
        "samples": samples, "final_statuses": tally.statuses, "plain_text_5xx": tally.plain_5xx,
        "lost_after_send": tally.transport_errors, "metrics_before_sigterm": before,
        "drain_s": round(drain_s, 2), "exit_code": proc.returncode,
        "server_log_errors": [line for line in server_log.splitlines() if "Traceback" in line or " 500 " in line][:20],
        "rss_growth_mib": round(samples[-1]["rss_mib"] - samples[0]["rss_mib"], 1) if samples else None,
        "fd_growth": samples[-1]["fds"] - samples[0]["fds"] if samples else None,
        "environment": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()},
    }  # fmt: skip


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["samples"]
    t = [x["t_s"] / 60 for x in s]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(t, [x["rss_mib"] for x in s])
    axes[0].set(title="server RSS (MiB)", xlabel="minutes")
    axes[1].plot(t, [x["fds"] for x in s])
    axes[1].set(title="open file descriptors", xlabel="minutes")
    axes[2].plot(t, [x["p50_ms"] for x in s], label="p50")
    axes[2].plot(t, [x["p99_ms"] for x in s], label="p99")
    axes[2].set(title="latency of 200s per window (ms)", xlabel="minutes")
    axes[2].legend()
    fig.suptitle(f"soak: {result['clients']} clients, {result['minutes']} min, mixed valid/invalid/hang-up traffic")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="LARA_NUM_THREADS of the server")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--model-repository", default=str(DEFAULT_MODEL_REPOSITORY))
    parser.add_argument("--out", default=str(RESULTS / "soak"))
    parser.add_argument("--decode-probe", choices=["none", "budget"], help=argparse.SUPPRESS)
    parser.add_argument("--scenarios", nargs="?", const="hang_ups,timeouts,idle_connections,decode_memory",
                        help="run the issue's failure cases instead (all, or a comma-separated list)")  # fmt: skip
    args = parser.parse_args()
    if args.decode_probe:
        from benchmarks.soak_scenarios import decode_probe

        print(decode_probe(args.decode_probe))
        return
    if args.scenarios:
        from benchmarks.soak_scenarios import scenarios

        out = Path(args.out + "_scenarios.json")
        out.write_text(json.dumps(scenarios(args), indent=1))
        print(out.read_text())
        return
    result = asyncio.run(soak(args))
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))


if __name__ == "__main__":
    main()
