"""Latency and memory per document vs length through the real server (python -m server on 127.0.0.1).

    python -m benchmarks.long_serving [--model lara-text-news] [--lengths 1024,4096,16384,32768,65536]

Documents are same-label composites of BBC test articles cut to each length (model_export.long_docs). For
each length: a request holding 1 document (median of --repeats), and a request holding 8 different
documents (median of --repeats, also per document). The server's resident memory is sampled from /proc
every 10 ms; the table gives its peak above the idle (warmed-up) server at each length.
Writes benchmarks/results/long_serving.json.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import environment, markdown_table, write_json
from model_export.long_docs import make_composites
from model_export.tasks import text_docs
from server.testing import server_process

REPO = Path(__file__).resolve().parent.parent / "model_repository"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _server_pid(port: int) -> int:
    """The `python -m server` process listening on `port` (found by its command line)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"server" in cmd and b"--port" in cmd and cmd[cmd.index(b"--port") + 1] == str(port).encode():
                return int(proc.name)
    raise RuntimeError(f"no server process on port {port}")


@contextmanager
def peak_rss(pid: int) -> Iterator[dict[str, int]]:
    """Samples the process's RSS every 10 ms; yields a dict whose "peak_kib" is filled on exit."""
    out = {"peak_kib": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            out["peak_kib"] = max(out["peak_kib"], _rss_kib(pid))
            time.sleep(0.01)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()


def _post(client: httpx.Client, model: str, texts: list[str]) -> tuple[float, float | None]:
    t0 = time.perf_counter()
    r = client.post(f"/v1/models/{model}:predict", json={"instances": texts})
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    if any(p["truncated"] for p in r.json()["predictions"]):
        raise RuntimeError("the server truncated a document: the benchmark must measure whole documents")
    server_ms = r.headers.get("x-inference-time-ms")
    return elapsed * 1000, float(server_ms) if server_ms else None


def measure(url: str, pid: int, model: str, lengths: list[int], repeats: int) -> list[dict[str, Any]]:
    texts, labels = text_docs("news", "test")
    rows = []
    with httpx.Client(base_url=url, timeout=600) as client:
        _post(client, model, ["warm up"])
        idle = _rss_kib(pid)
        for n in lengths:
            docs = [raw.decode("utf-8", "ignore") for raw, _ in make_composites(texts, labels, n, per_class=2)][:8]
            with peak_rss(pid) as mem:
                one = [_post(client, model, [docs[i % len(docs)]]) for i in range(repeats)]
                eight = [_post(client, model, docs) for _ in range(repeats)]
            rows.append(
                {
                    "bytes": n,
                    "batch1_ms": statistics.median(t for t, _ in one),
                    "batch1_server_inference_ms": statistics.median(s for _, s in one) if one[0][1] else None,
                    "batch8_ms": statistics.median(t for t, _ in eight),
                    "batch8_per_doc_ms": statistics.median(t for t, _ in eight) / 8,
                    "peak_rss_above_idle_mib": (mem["peak_kib"] - idle) / 1024,
                }
            )
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="lara-text-news")
    p.add_argument("--lengths", default="1024,4096,16384,32768,65536")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="LARA_NUM_THREADS of the server")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    env = {"LARA_MODEL_REPOSITORY": str(REPO), "LARA_NUM_THREADS": str(args.threads), "LARA_MAX_QUEUE_DELAY_MS": "2"}
    with server_process(["--log-level", "warning"], env=env, timeout_s=180) as url:
        pid = _server_pid(int(url.rsplit(":", 1)[1]))
        rows = measure(url, pid, args.model, lengths, args.repeats)
    by_len = {r["bytes"]: r for r in rows}
    ratios = {}
    if 4096 in by_len and 65536 in by_len:
        ratios["batch1_64k_over_4k"] = by_len[65536]["batch1_ms"] / by_len[4096]["batch1_ms"]
        ratios["batch8_64k_over_4k"] = by_len[65536]["batch8_ms"] / by_len[4096]["batch8_ms"]
    path = write_json(
        "long_serving.json",
        {"environment": environment(), "model": args.model, "server_threads": args.threads, "rows": rows,
         "ratios": ratios, "note": "client-side wall time on loopback; one server, default batching settings"},
    )  # fmt: skip
    headers = ["bytes", "1 doc (ms)", "8 docs (ms)", "8 docs, per doc (ms)", "peak RSS above idle (MiB)"]
    table = [
        [r["bytes"], r["batch1_ms"], r["batch8_ms"], r["batch8_per_doc_ms"], r["peak_rss_above_idle_mib"]] for r in rows
    ]
    print(markdown_table(headers, table))
    print(f"ratios: {ratios}\nwrote {path}")


if __name__ == "__main__":
    main()
