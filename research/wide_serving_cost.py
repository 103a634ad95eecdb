"""What the wide path costs at serving time: onnxruntime latency of a `lara train` text model (the LARA encoder
plus the hashed word 1-2-gram tf-idf head, lara_serve.model_export.your_data.wide) against the shipped lara-text-news-bytes, which has
the same encoder architecture and no wide path (config.json "model" differs only in num_classes and
tfidf_buckets, checked here).

    python -m benchmarks.your_data --sets emails          # or any `lara train` text model
    .venv/bin/python -m research.wide_serving_cost [--wide runs/your_data/models/emails] [--threads 1]

Both models load through the server's own backend (lara_serve.server.backends.create_backend: onnxruntime, fused LaraAttention
kernel, the server's session options). Per length (random printable bytes with spaces, so the wide path sees
words) the two models alternate call by call, `--repeats` times after one warm-up each, and the ratio of
medians is reported; alternating keeps a shared machine's load out of the ratio. Writes
research/results/wide_serving_cost.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "research" / "results" / "wide_serving_cost.json"
ALPHABET = b"abcdefghijklmnopqrstuvwxyz     ."


def _inputs(length: int, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = random.Random(seed)
    ids = np.array([[rng.choice(ALPHABET) + 1 for _ in range(length)] for _ in range(batch)], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def measure(wide_dir: Path, plain_dir: Path, lengths: list[int], repeats: int, threads: int) -> list[dict[str, Any]]:
    from lara_serve.server.backends import create_backend
    from lara_serve.server.repository import read_config

    configs = {name: read_config(d) for name, d in (("wide", wide_dir), ("plain", plain_dir))}
    backends = {name: create_backend("onnxruntime", d, configs[name], "cpu", num_threads=threads)
                for name, d in (("wide", wide_dir), ("plain", plain_dir))}  # fmt: skip
    rows = []
    for length in lengths:
        batch = 8 if length <= 4096 else 1
        x = _inputs(length, batch, seed=length)
        times: dict[str, list[float]] = {"wide": [], "plain": []}
        for name in times:
            backends[name].run(x)  # warm-up
        for _ in range(repeats):
            for name in times:
                t0 = time.perf_counter()
                backends[name].run(x)
                times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(v) for name, v in times.items()}
        rows.append({"length": length, "batch": batch, "repeats": repeats, "median_s": med,
                     "wide_over_plain": round(med["wide"] / med["plain"], 3)})  # fmt: skip
        print(f"{length:>7} B x {batch}: wide {med['wide'] * 1e3:8.1f} ms  plain {med['plain'] * 1e3:8.1f} ms  "
              f"ratio {rows[-1]['wide_over_plain']:.3f}", flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wide", type=Path, default=ROOT / "runs" / "your_data" / "models" / "emails")
    p.add_argument("--plain", type=Path, default=ROOT / "model_repository" / "lara-text-news-bytes")
    p.add_argument("--lengths", default="1024,4096,16384,65536")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    models = [json.loads((d / "config.json").read_text())["model"] for d in (args.wide, args.plain)]
    differ = sorted(k for k in set(models[0]) | set(models[1]) if models[0].get(k) != models[1].get(k))
    if not set(differ) <= {"num_classes", "tfidf_buckets", "tfidf_utf8"} or not models[0].get("tfidf_buckets"):
        raise SystemExit(f"{args.wide} is not {args.plain} plus a wide path: the configs differ in {differ}")
    rows = measure(args.wide, args.plain, [int(n) for n in args.lengths.split(",")], args.repeats, args.threads)
    out = {"wide": str(args.wide), "plain": str(args.plain), "threads": args.threads, "model_differs_in": differ,
           "wide_buckets": models[0]["tfidf_buckets"], "rows": rows}  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
