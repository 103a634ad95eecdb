"""The torch backend with and without `keep_freed_memory` (glibc malloc tuning), per document length.

    .venv/bin/python -m benchmarks.allocator [--lengths 4096 16384 32768 65536] [--rounds 2] [--threads 1]

Each measurement is a fresh child process (the setting is process-wide and cannot be undone), loading
the shipped `lara-text-news` and timing its eager forward at batch 1 (one warm-up, then the median of
3). Off and on alternate round by round so that load on a shared machine falls on both alike; the
ratio is what to read. Writes benchmarks/results/allocator.json.
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
RESULTS = ROOT / "benchmarks" / "results" / "allocator.json"
MODEL = ROOT / "model_repository" / "lara-text-news"


def child(lengths: list[int], threads: int, keep: bool) -> dict[str, float]:
    if keep:
        from server.backends.allocator import keep_freed_memory

        reason = keep_freed_memory()
        if reason:
            raise SystemExit(f"keep_freed_memory not applied: {reason}")
    import torch

    from model_export import load_pretrained

    torch.set_num_threads(threads)
    model = load_pretrained(MODEL)
    g = torch.Generator().manual_seed(0)
    out = {}
    with torch.inference_mode():
        for n in lengths:
            ids, mask = torch.randint(1, 257, (1, n), generator=g), torch.ones(1, n, dtype=torch.long)
            model(ids, mask)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                model(ids, mask)
                times.append(time.perf_counter() - t0)
            out[str(n)] = 1e3 * statistics.median(times)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768, 65536])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.lengths, args.threads, args.child == "on")))
        return
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
            cmd = [sys.executable, "-m", "benchmarks.allocator", "--child", mode, "--threads", str(args.threads)]
            cmd += ["--lengths", *map(str, args.lengths)]
            res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {mode}: {runs[mode][-1]}", flush=True)
    rows: list[dict[str, Any]] = []
    for n in map(str, args.lengths):
        off = statistics.median(x[n] for x in runs["off"])
        on = statistics.median(x[n] for x in runs["on"])
        rows.append(
            {"tokens": int(n), "off_ms": round(off, 1), "on_ms": round(on, 1), "on_over_off": round(on / off, 3)}
        )
    first, last = rows[0], rows[-1]
    growth = {m: round(last[f"{m}_ms"] / first[f"{m}_ms"], 1) for m in ("off", "on")}
    result = {
        "model": "lara-text-news (torch eager, fused CPU kernel), batch 1",
        "threads": args.threads,
        "rounds": args.rounds,
        "rows": rows,
        f"growth_{first['tokens']}_to_{last['tokens']}": growth,
        "runs": runs,
        "command": "python -m benchmarks.allocator " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("| tokens | default malloc (ms) | keep_freed_memory (ms) | ratio |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokens']:,} | {r['off_ms']:.0f} | {r['on_ms']:.0f} | {r['on_over_off']:.2f} |")
    print(f"growth {first['tokens']} -> {last['tokens']}: {growth}")


if __name__ == "__main__":
    main()
