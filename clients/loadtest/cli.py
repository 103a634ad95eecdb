"""`python -m lara_serve.clients loadtest ...`: argument parsing, target discovery, outputs, exit status.

Exit status: 0 when every cell's error rate is within --fail-on-error-rate and every cell got at least one
successful response (or --allow-failed-cells); 1 when not, or the server cannot be reached or does not
serve the model; 2 for a usage error (bad flags, inputs the model
cannot take), reported before any inference request is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from lara_serve.clients.loadtest.html import write_html
from lara_serve.clients.loadtest.inputs import (
    BUILTIN_KINDS,
    BUILTIN_SETS,
    InputError,
    InputGroup,
    builtin,
    from_paths,
    kind_hint,
    synthetic_images,
    synthetic_text,
)
from lara_serve.clients.loadtest.protocol import ROUTES
from lara_serve.clients.loadtest.report import Report, Target
from lara_serve.clients.loadtest.rigour import Stability
from lara_serve.clients.loadtest.schedule import LoadPoint
from lara_serve.clients.loadtest.sweep import SweepPlan, check_plan, run_sweep
from lara_serve.clients.loadtest.writers import format_table, write_csv, write_json

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_LENGTHS = [1024, 4096]
EXAMPLE = (
    "python -m lara_serve.clients loadtest --model lara-text-news --lengths 1K,4K,16K --concurrency 1,8 --out results/"
)


class ServerError(RuntimeError):
    """The server cannot be reached, or does not serve the model."""


def check_loopback(url: str) -> None:
    """Load goes to this machine only unless the user says otherwise (--allow-remote)."""
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"load tests run against loopback (127.0.0.1, localhost) unless --allow-remote; got {host!r}")


def _sizes(text: str) -> list[int]:
    """'1024,4K,64KB' -> [1024, 4096, 65536] (K = 1024 bytes)."""
    out = []
    for part in (p.strip().upper().removesuffix("B").removesuffix("I") for p in text.split(",") if p.strip()):
        scale = 1024 if part.endswith("K") else 1
        try:
            out.append(int(float(part.removesuffix("K")) * scale))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a byte length: {part!r} (examples: 512, 4K, 64KB)") from None
    return out


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def build_parser(prog: str = "python -m lara_serve.clients loadtest") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=f"Load-test LARA Serve: latency vs input length and load. "
                                f"Example: {EXAMPLE}")  # fmt: skip
    p.add_argument("--url", action="append", help=f"server URL, repeatable (env LARA_URL; default {DEFAULT_URL})")
    p.add_argument("--model", action="append", required=True, help="model name, repeatable: one chart for all")
    p.add_argument("--api-key", default=os.environ.get("LARA_API_KEY"), help="or env LARA_API_KEY")
    p.add_argument("--allow-remote", action="store_true", help="allow a server that is not on loopback")
    load = p.add_argument_group("load (closed loop by default)")
    load.add_argument("--concurrency", type=_ints, default=None, help="closed loop: in-flight requests, e.g. 1,8")
    load.add_argument("--rate", type=_floats, default=None, help="open loop: requests/s, e.g. 5,20")
    load.add_argument("--arrival", choices=["poisson", "constant"], default="poisson", help="open-loop arrivals")
    load.add_argument("--max-in-flight", type=int, default=None, help="open loop: cap; waiting counts as latency")
    load.add_argument("--requests", type=int, default=200, help="per cell, at most")
    load.add_argument("--seconds", type=float, default=10.0, help="per cell, at most")
    load.add_argument("--timeout", type=float, default=60.0, help="per request, seconds")
    load.add_argument("--warmup", type=int, default=2, help="unrecorded requests per model, route and input")
    load.add_argument("--max-p50-ms", type=float, default=None,
                      help="skip longer inputs for a model and load once a cell's p50 exceeds this")  # fmt: skip
    load.add_argument("--budget-s", type=float, default=None, help="whole run: later cells are skipped, saying so")
    load.add_argument("--seed", type=int, default=0, help="open-loop arrival schedule")
    load.add_argument("--stability-percentage", type=float, default=None,
                      help="measurement windows (each bounded by --requests and --seconds) until throughput and "
                           "p50 are within this %% over 3 windows, as perf_analyzer; default: one run per cell")  # fmt: skip
    load.add_argument("--max-windows", type=int, default=10, help="with --stability-percentage: at most this many")
    inputs = p.add_argument_group("inputs (default: --lengths 1K,4K for text models, noise PNGs for image models)")
    inputs.add_argument("--lengths", type=_sizes, default=None, help="synthetic texts of these byte lengths")
    inputs.add_argument("--set", action="append", default=[], choices=list(BUILTIN_SETS),
                        help="built-in inputs: examples-text, examples-image (examples/, any install); "
                             "bbc, brown (texts), fashion (images): test splits, full install")  # fmt: skip
    inputs.add_argument("--files", nargs="+", type=Path, default=[], help="files or folders (texts or images)")
    inputs.add_argument("--truncate", action="store_true", help="let the server cut texts longer than it takes")
    p.add_argument("--route", action="append", choices=ROUTES, help="predict (default), classify, v2-json, v2-binary")
    p.add_argument("--out", type=Path, default=None, help="write report.json, report.csv and PNG charts here")
    p.add_argument("--note", action="append", default=[], help="free text kept in report.json (e.g. server flags)")
    p.add_argument("--fail-on-error-rate", type=float, default=0.0,
                   help="exit 1 if any cell's error rate exceeds this (default 0: any error fails)")  # fmt: skip
    p.add_argument("--allow-failed-cells", action="store_true",
                   help="exit 0 even when a cell got no successful response (e.g. every request refused, 413)")  # fmt: skip
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="live progress bars (default: when stderr is a terminal)")  # fmt: skip
    return p


def _points(args: argparse.Namespace) -> list[LoadPoint]:
    if args.rate is not None and args.concurrency is not None:
        raise InputError("give --concurrency (closed loop) or --rate (open loop), not both")
    if args.rate is not None:
        return [LoadPoint.open(r, args.arrival, args.max_in_flight) for r in args.rate]
    if args.max_in_flight is not None:
        raise InputError("--max-in-flight applies to the open loop (--rate)")
    return [LoadPoint.closed(c) for c in (args.concurrency or [1, 8])]


def _groups(args: argparse.Namespace, first_task: str, notes: list[str]) -> list[InputGroup]:
    wrong = [name for name in args.set if BUILTIN_KINDS[name] != first_task]
    if wrong or (args.lengths and first_task != "text"):
        # Refused before loading a corpus: the user learns at once, not after 10,000 images are read.
        given = f"--set {wrong[0]} ({BUILTIN_KINDS[wrong[0]]})" if wrong else "--lengths (synthetic text)"
        raise InputError(f"model {args.model[0]!r} is a {first_task} model but the input {given} is not; "
                         f"give it {kind_hint(first_task)}")  # fmt: skip
    groups = [synthetic_text(n) for n in args.lengths or []]
    if args.files:
        groups.append(from_paths(args.files))
    for name in args.set:
        try:
            groups.append(builtin(name))
        except InputError as exc:
            # A missing corpus skips that set only; the run says so instead of failing everything.
            notes.append(f"skipped set {name!r}: {exc}")
            print(f"warning: skipped set {name!r}: {exc}", file=sys.stderr)
    if groups:
        return groups
    if args.set:
        raise InputError("no input left: every --set was unavailable (see the warnings above)")
    return [synthetic_text(n) for n in DEFAULT_LENGTHS] if first_task == "text" else [synthetic_images()]


def discover(urls: list[str], models: list[str], api_key: str | None) -> list[Target]:
    """Ask each server for each model's task (text or image) and backend, before any load."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    targets = []
    for url in urls:
        with httpx.Client(base_url=url, headers=headers, timeout=10.0) as http:
            for model in models:
                try:
                    info = http.get(f"/v1/models/{model}")
                    meta = http.get(f"/v2/models/{model}") if info.status_code == 200 else None
                except httpx.HTTPError as exc:
                    raise ServerError(f"cannot reach the server at {url} ({type(exc).__name__}: {exc}); "
                                      "is it running? (python -m lara_serve.server)") from None  # fmt: skip
                if info.status_code != 200:
                    raise ServerError(f"{url} /v1/models/{model}: HTTP {info.status_code}: {info.text[:300]}")
                task = info.json().get("task")
                if task not in ("text", "image"):
                    raise ServerError(f"{url} did not say model {model!r}'s task (text or image): {info.text[:300]}")
                backend = meta.json().get("platform") if meta is not None and meta.status_code == 200 else None
                label = model if len(urls) == 1 else f"{model}@{urlparse(url).netloc}"
                targets.append(Target(url, model, task, label, backend))
    return targets


def _redacted(argv: Sequence[str]) -> list[str]:
    """The command line for the report, without the API key."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--api-key" and i + 1 < len(out):
            out[i + 1] = "***"
        elif arg.startswith("--api-key="):
            out[i] = "--api-key=***"
    return out


def _settings(args: argparse.Namespace, argv: Sequence[str], plan: SweepPlan) -> dict[str, Any]:
    return {
        "argv": _redacted(argv),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "routes": list(plan.routes),
        "requests_per_cell": plan.requests,
        "seconds_per_cell": plan.seconds,
        "timeout_s": plan.timeout_s,
        "warmup": plan.warmup,
        "max_p50_ms": plan.max_p50_ms,
        "budget_s": plan.budget_s,
        "truncate": plan.truncate,
        "seed": plan.seed,
        "stability_percentage": plan.stability.percentage if plan.stability else None,
        "max_windows": plan.stability.max_windows if plan.stability else None,
        "client": {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()},
        "latency": "from the scheduled send time (open loop) or the send time (closed loop) to the full answer",
    }


def _stability(args: argparse.Namespace) -> Stability | None:
    if args.stability_percentage is None:
        return None
    return Stability(args.stability_percentage, args.max_windows)


def _write_outputs(report: Report, out: Path) -> None:
    """report.json, report.csv, the PNG charts when matplotlib is there, and report.html beside them."""
    written = [write_json(report, out / "report.json"), write_csv(report.cells, out / "report.csv")]
    charts: list[Path] = []
    try:
        from lara_serve.clients.loadtest.charts import write_charts
    except ImportError as exc:  # matplotlib is in the [loadtest] extra; the lean install lacks it
        print(f"note: no PNG charts ({exc}); report.html has the table. For charts: pip install -e '.[loadtest]' "
              "(matplotlib, tqdm) and rerun", file=sys.stderr)  # fmt: skip
    else:
        charts = write_charts(report.cells, out)
    written += [*charts, write_html(report, charts, out / "report.html")]
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)


def main(argv: Sequence[str] | None = None, prog: str = "python -m lara_serve.clients loadtest") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    urls = args.url or [os.environ.get("LARA_URL") or DEFAULT_URL]
    try:
        if not args.allow_remote:
            for url in urls:
                check_loopback(url)
        points = _points(args)
        targets = discover(urls, args.model, args.api_key)
        notes: list[str] = list(args.note)
        plan = SweepPlan(targets=targets, groups=_groups(args, targets[0].task, notes), points=points,
                         routes=args.route or ["predict"], requests=args.requests, seconds=args.seconds,
                         timeout_s=args.timeout, api_key=args.api_key, truncate=args.truncate, warmup=args.warmup,
                         max_p50_ms=args.max_p50_ms, budget_s=args.budget_s, seed=args.seed, progress=args.progress,
                         stability=_stability(args))  # fmt: skip
        check_plan(plan)
    except (InputError, ValueError) as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    cells = asyncio.run(run_sweep(plan))
    report = Report(_settings(args, argv, plan), targets, cells, args.fail_on_error_rate, notes,
                    args.allow_failed_cells)  # fmt: skip
    print(format_table(cells))
    if args.out:
        _write_outputs(report, args.out)
    if report.failures:
        print(f"FAILED: {len(report.failures)} cell(s) with an error rate above {args.fail_on_error_rate:g} or "
              "no successful response:", file=sys.stderr)  # fmt: skip
        for line in report.failures:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0
