"""Scale-out benchmark (not a test): the plain server against Ray Serve with 1 and 2 replicas, on this
machine, in one run, against 127.0.0.1 only.

Every configuration gets the same CPUs (--cpus, default 2): the plain server runs with that many backend
threads, and again with 1; Ray 1 replica with num_cpus=cpus (threads = cpus); Ray 2 replicas with
num_cpus=cpus/2 each (1 thread each). Load:
`python -m lara_serve.clients loadtest`, closed loop, 2 KB texts to lara-text-news-bytes on v1 :classify, concurrency 1, 8
and 32. All replicas share one machine here: see deploy/README.md for what changes on a real cluster.

    .venv/bin/python benchmarks/scaleout.py            # about 8 minutes; ray[serve] from deploy/ci/ray_venv.sh

Writes benchmarks/results/scaleout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy.ray.processes import descendants, stop_driver  # noqa: E402
from lara_serve.server.testing import free_port, server_process  # noqa: E402

MODEL = "lara-text-news-bytes"
OUT = ROOT / "benchmarks" / "results" / "scaleout.json"


@contextmanager
def ray_app(python: str, replicas: int, cpus: int) -> Iterator[str]:
    """deploy/ray/serve_app.py ingress on 127.0.0.1; stopped with SIGTERM, then any Ray process left is killed."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="lray-", dir="/tmp")
    per_replica = cpus / replicas
    cmd = [python, "-m", "deploy.ray.serve_app", "ingress", f"num_replicas={replicas}", f"num_cpus={per_replica:g}",
           f"num_threads={max(1, int(per_replica))}", "--port", str(port), "--num-cpus", str(cpus),
           "--temp-dir", temp_dir]  # fmt: skip
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    log_path = Path(temp_dir) / "driver.log"
    with open(log_path, "wb") as log:
        driver = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    tree: set[int] = set()
    try:
        deadline = time.monotonic() + 600
        while b"ready: http://127.0.0.1" not in log_path.read_bytes():
            if driver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray Serve did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(1)
        tree = descendants(driver.pid)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_driver(driver, tree, timeout_s=90, settle_s=2)
        subprocess.run(["rm", "-rf", temp_dir], timeout=120)


def load(url: str, args: argparse.Namespace, note: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "lara_serve.clients", "loadtest", "--url", url, "--model", MODEL, "--route", "classify",
               "--lengths", "2K", "--concurrency", args.concurrency, "--seconds", str(args.seconds),
               "--timeout", "60", "--warmup", "16", "--out", out, "--note", note, "--no-progress",
               "--fail-on-error-rate", "1"]  # fmt: skip
        subprocess.run(cmd, cwd=ROOT, check=True, timeout=3600)
        cells = json.loads((Path(out) / "report.json").read_text())["cells"]
    keep = ("load", "concurrency", "requests", "ok", "errors", "throughput_rps", "p50_ms", "p95_ms", "p99_ms")
    return [{k: cell.get(k) for k in keep} for cell in cells]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=15.0, help="per load point")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    ray_python = subprocess.run(
        [str(ROOT / "deploy" / "ci" / "ray_venv.sh")], capture_output=True, text=True, check=True, timeout=1800
    ).stdout.split()[-1]
    results: dict[str, Any] = {}
    # The plain server twice: with as many backend threads as CPUs (the fair single-process setting), and with
    # 1 thread, the per-replica setting of Ray with 2 replicas, to tell Ray's effect from the thread count's.
    for threads in sorted({args.cpus, 1}, reverse=True):
        server_args = ["--models", MODEL, "--num-threads", str(threads)]
        with server_process(server_args, timeout_s=300) as url:
            results[f"plain-{threads}t"] = load(url, args, f"plain server, {threads} thread(s)")
    for replicas in (1, 2):
        with ray_app(ray_python, replicas, args.cpus) as url:
            results[f"ray-{replicas}"] = load(url, args, f"Ray Serve ingress, {replicas} replica(s)")

    report = {
        "what": f"{MODEL}, 2 KB texts, v1 :classify, closed loop, {args.seconds:g} s per point; same {args.cpus} "
        "CPUs for every configuration; one machine (replicas share it)",
        "command": "python benchmarks/scaleout.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg": os.getloadavg()},
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'config':<9} {'load':>6} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'errors':>6}")
    for name, cells in results.items():
        for c in cells:
            print(f"{name:<9} {c['load']:>6} {c['throughput_rps'] or 0:>8.1f} {c['p50_ms'] or 0:>8.1f} "
                  f"{c['p95_ms'] or 0:>8.1f} {c['errors']:>6}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
