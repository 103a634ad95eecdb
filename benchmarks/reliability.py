"""Reliability suite (not a test): the failure cases of issue 36 against live `python -m lara_serve.server`s on
127.0.0.1, over synthetic models, with one table at the end.

    .venv/bin/python -m benchmarks.reliability                  # every case (a few minutes on 2 cores)
    .venv/bin/python -m benchmarks.reliability deadlines reloads --cycles 20
    .venv/bin/python -m benchmarks.reliability bodies documents --large-texts 8 --docs 200   # lighter

Columns: load held (requests answered as intended under the case's load), faults survived (reloads,
tricklers closed in time, over-cap clients that read their 503), bad inputs tried, requests lost (never
answered, hung, reset, a false 504, or a 5xx caused by client input). Writes
benchmarks/results/reliability.json. Linux only (/proc for memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks import reliability_bodies as bodies
from benchmarks import reliability_cases as cases
from benchmarks import reliability_explain as explain
from benchmarks import reliability_grpc as grpc_cases
from lara_serve.server.synthetic import make_image_model, make_text_model

RESULTS = Path(__file__).resolve().parent / "results"
# name -> the case, run on a fresh server over the suite's repository
RUNNERS: dict[str, Callable[[Path, argparse.Namespace], Awaitable[cases.Row]]] = {
    "deadlines": lambda repo, args: cases.deadlines(repo),
    "reloads": lambda repo, args: cases.reloads(repo, cycles=args.cycles),
    "inputs": lambda repo, args: cases.hostile_inputs(repo, fuzz_cases=args.fuzz),
    "bodies": lambda repo, args: bodies.large_bodies(repo, args.body_mb * 1_000_000, args.large_json, args.large_texts),
    "near_limit": lambda repo, args: bodies.near_limit_texts(repo),
    "documents": lambda repo, args: bodies.documents(repo, count=args.docs),
    "connections": lambda repo, args: cases.connections(repo),
    "explain_memory": lambda repo, args: explain.explain_memory(repo),
    "explain_fairness": lambda repo, args: explain.explain_fairness(repo),
    **{name: (lambda repo, args, case=case: case(repo)) for name, case in grpc_cases.CASES.items()},
}
CASES = tuple(RUNNERS)


def make_repository(root: Path) -> Path:
    make_text_model(root, cases.TEXT, max_length=1024)
    make_text_model(root, cases.LONG, max_length=65536, dim=32, hidden=128)  # compute grows with length
    make_image_model(root, cases.IMAGE)
    return root


async def run(names: list[str], args: argparse.Namespace, repo: Path) -> list[cases.Row]:
    rows = []
    for name in names:
        start = time.monotonic()
        row = await RUNNERS[name](repo, args)
        row.detail["seconds"] = round(time.monotonic() - start, 1)
        print(f"{row.case}: held {row.load_held}, survived {row.faults_survived}, bad {row.bad_inputs}, "
              f"lost {row.lost}  {json.dumps(row.detail)[:300]}", flush=True)  # fmt: skip
        rows.append(row)
    return rows


def table(rows: list[cases.Row]) -> str:
    header = ["case", "load held", "faults survived", "bad inputs tried", "requests lost"]
    lines = [header] + [
        [r.case, str(r.load_held), str(r.faults_survived), str(r.bad_inputs), str(r.lost)] for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [" | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help=f"some of {list(CASES)} (default: all)")
    parser.add_argument("--cycles", type=int, default=50, help="unload/reload cycles under load")
    parser.add_argument("--fuzz", type=int, default=1500, help="fuzzed v2 requests")
    parser.add_argument("--body-mb", type=int, default=16, help="size of each large body (MB)")
    parser.add_argument("--large-json", type=int, default=8, help="large v2 JSON bodies at once")
    parser.add_argument("--large-texts", type=int, default=24, help="large raw texts at once")
    parser.add_argument("--docs", type=int, default=1000, help="concurrent 64 KB documents")
    parser.add_argument("--out", type=Path, default=RESULTS / "reliability.json")
    args = parser.parse_args()
    names = args.cases or list(CASES)
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(run(names, args, make_repository(Path(tmp))))
    print()
    print(table(rows))
    result: dict[str, Any] = {
        "command": "python -m benchmarks.reliability " + " ".join(names),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1m_at_end": round(os.getloadavg()[0], 1),
        },  # fmt: skip
        "totals": {k: sum(getattr(r, k) for r in rows) for k in ("load_held", "faults_survived", "bad_inputs", "lost")},
        "rows": [r.as_dict() for r in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
