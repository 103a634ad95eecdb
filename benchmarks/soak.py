"""Soak (not a test): a real `python -m server` on 127.0.0.1 under steady mixed traffic for a bounded time.

Traffic per client loop: valid text predictions (v1 and v2), images, malformed bodies (4xx expected), and
clients that hang up while their request is queued. Every `--sample-s` seconds the server's RSS and open
file descriptors (/proc) and the window's latency percentiles and status counts are recorded. At the
end the server gets SIGTERM while the load is still running: accepted requests must all be answered.

    .venv/bin/python benchmarks/soak.py                 # 5 minutes, shipped models
    .venv/bin/python benchmarks/soak.py --minutes 1     # shorter

Writes benchmarks/results/soak.json and soak.png. Linux only (/proc).
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
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from server.repository import read_config  # noqa: E402
from server.settings import DEFAULT_MODEL_REPOSITORY  # noqa: E402
from server.testing import free_port  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WORDS = [
    "market",
    "team",
    "election",
    "science",
    "goal",
    "engine",
    "rates",
    "vote",
    "match",
    "orbit",
    "trade",
    "court",
    "storm",
    "chip",
]


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
        proc = subprocess.Popen([sys.executable, "-m", "server", "--port", str(port)], env=env, stdout=log, stderr=log)
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


# -- the failure cases, each on a fresh server ------------------------------------------------


class Server:
    """`python -m server` on a free loopback port; `nofile` lowers its open-file limit (as `ulimit -n`)."""

    def __init__(self, repo: Path, env: dict[str, str], nofile: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {**os.environ, "LARA_MODEL_REPOSITORY": str(repo), "LARA_LOG_LEVEL": "warning", **env}

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server; read in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "server", "--port", str(self.port)], env=full,
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
              "requests_counted_client_disconnected": server.metric(f'lara_requests_total{{model="{model}",outcome="client_disconnected"}}')}  # fmt: skip
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


def scenarios(args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(args.model_repository)
    model = next(p.parent.name for p in sorted(repo.glob("*/config.json")) if read_config(p.parent).task == "text")
    runs = {"hang_ups": scenario_hang_ups, "timeouts": scenario_timeouts, "idle_connections": scenario_idle_connections}
    return {"model": model} | {name: runs[name](repo, model) for name in args.scenarios.split(",")}


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
    parser.add_argument("--scenarios", nargs="?", const="hang_ups,timeouts,idle_connections",
                        help="run the issue's failure cases instead (all, or a comma-separated list)")  # fmt: skip
    args = parser.parse_args()
    if args.scenarios:
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
