"""Forward time with and without `keep_freed_memory` (glibc malloc tuning), per document length.

    .venv/bin/python -m research.allocator [--lengths 4096 16384 32768 65536] [--rounds 2] [--threads 1]
        [--backends torch onnxruntime]

Each measurement is a fresh child process (the setting is process-wide and cannot be undone), loading
the shipped `lara-text-news-bytes` (torch eager with the fused CPU kernel, or its model.onnx in onnxruntime)
and timing a batch-1 forward (one warm-up, then the median of 3). Off and on alternate round by round so that load on a shared machine falls on both alike; the
ratio is what to read. Writes research/results/allocator.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "research" / "results" / "allocator.json"
MODEL = ROOT / "model_repository" / "lara-text-news-bytes"


def child(backend: str, lengths: list[int], threads: int, keep: bool) -> dict[str, float]:
    if keep:
        from lara_serve.server.backends.allocator import keep_freed_memory

        reason = keep_freed_memory()
        if reason:
            raise SystemExit(f"keep_freed_memory not applied: {reason}")
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    if backend == "torch":
        from lara_serve.model_export import load_pretrained

        model = load_pretrained(MODEL)

        def forward(ids: np.ndarray, mask: np.ndarray) -> object:
            with torch.inference_mode():
                return model(torch.from_numpy(ids), torch.from_numpy(mask))
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(MODEL / "1" / "model.onnx"), so, providers=["CPUExecutionProvider"])

        def forward(ids: np.ndarray, mask: np.ndarray) -> object:
            return sess.run(None, {"input_ids": ids, "attention_mask": mask})

    rng = np.random.default_rng(0)
    out = {}
    for n in lengths:
        ids, mask = rng.integers(1, 257, (1, n), dtype=np.int64), np.ones((1, n), dtype=np.int64)
        forward(ids, mask)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            forward(ids, mask)
            times.append(time.perf_counter() - t0)
        out[str(n)] = 1e3 * statistics.median(times)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768, 65536])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--backends", nargs="+", choices=["torch", "onnxruntime"], default=["torch", "onnxruntime"])
    p.add_argument("--child", nargs=2, metavar=("BACKEND", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        backend, mode = args.child
        print(json.dumps(child(backend, args.lengths, args.threads, mode == "on")))
        return
    result: dict[str, Any] = {"model": "lara-text-news-bytes, batch 1", "threads": args.threads, "rounds": args.rounds}
    for backend in args.backends:
        runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
        for r in range(args.rounds):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                cmd = [sys.executable, "-m", "research.allocator", "--child", backend, mode]
                cmd += ["--threads", str(args.threads), "--lengths", *map(str, args.lengths)]
                res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
                runs[mode].append(json.loads(res.stdout.strip().splitlines()[-1]))
                print(f"{backend} round {r + 1} {mode}: {runs[mode][-1]}", flush=True)
        rows: list[dict[str, Any]] = []
        for n in map(str, args.lengths):
            off = statistics.median(x[n] for x in runs["off"])
            on = statistics.median(x[n] for x in runs["on"])
            rows.append(
                {"tokens": int(n), "off_ms": round(off, 1), "on_ms": round(on, 1), "on_over_off": round(on / off, 3)}
            )
        first, last = rows[0], rows[-1]
        growth = {m: round(last[f"{m}_ms"] / first[f"{m}_ms"], 1) for m in ("off", "on")}
        result[backend] = {"rows": rows, f"growth_{first['tokens']}_to_{last['tokens']}": growth, "runs": runs}
        print(f"\n{backend}\n| tokens | default malloc (ms) | keep_freed_memory (ms) | ratio |\n|---|---|---|---|")
        for row in rows:
            print(f"| {row['tokens']:,} | {row['off_ms']:.0f} | {row['on_ms']:.0f} | {row['on_over_off']:.2f} |")
        print(f"growth {first['tokens']} -> {last['tokens']}: {growth}")
    result["command"] = "python -m research.allocator " + " ".join(argv if argv is not None else sys.argv[1:])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
