"""`python -m lara_serve.clients loadtest ...`: argument parsing, target discovery, outputs, exit status.

Exit status: 0 when every cell's error rate is within --fail-on-error-rate, every cell got at least one
successful response (or --allow-failed-cells), every open-loop cell achieved 90% of its offered rate (or
--allow-rate-shortfall) and, with --fail-on-unstable, every cell was stable; 1 when not, or the server cannot
be reached or does not serve the model; 2 for a usage error (bad flags, inputs the model cannot take),
reported before any inference request is sent; 130 when interrupted (Ctrl-C): the finished cells are
written as a normal run's, marked interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import platform
import re
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
from lara_serve.clients.loadtest.report import Cell, Report, Target
from lara_serve.clients.loadtest.rigour import Stability
from lara_serve.clients.loadtest.schedule import LoadPoint
from lara_serve.clients.loadtest.sweep import Interrupted, SweepPlan, check_plan, run_sweep
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


# A byte length: a number, then an optional unit; K and M are binary (1K = 1024), as they always were here.
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(|B|K|KB|KIB|M|MB|MIB)", re.IGNORECASE)
_SCALE = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2, "MIB": 1024**2}


def _sizes(text: str) -> list[int]:
    """'1024,4K,64KiB,1M' -> [1024, 4096, 65536, 1048576] (K = 1024 bytes, M = 1024 K)."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        match = _SIZE.fullmatch(part)
        size = float(match[1]) * _SCALE[match[2].upper()] if match else 0.0
        if size < 1 or not size.is_integer():
            raise argparse.ArgumentTypeError(
                f"not a byte length: {part!r}; give a whole number of bytes of at least 1, optionally with K, KB, "
                "KiB (1024 bytes) or M, MB, MiB (1024 K), e.g. 512,4K,64KiB,1M"
            )
        out.append(int(size))
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
                        help="built-in inputs: examples-text, examples-image (shipped with the client, any install); "
                             "bbc, brown (texts), fashion (images): test splits, full install")  # fmt: skip
    inputs.add_argument("--files", nargs="+", type=Path, default=[], help="files or folders (texts or images)")
    inputs.add_argument("--truncate", action="store_true", help="let the server cut texts longer than it takes")
    p.add_argument("--route", action="append", choices=ROUTES,
                   help="predict (default), classify, v2-json, v2-binary, grpc (KServe v2 gRPC)")  # fmt: skip
    p.add_argument("--grpc-url", action="append", default=None,
                   help="host:port of the gRPC port for --route grpc, one per --url in order (default: the port "
                        "the server reports at /info; its --grpc-port)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="write report.json, report.csv and PNG charts here")
    p.add_argument("--note", action="append", default=[], help="free text kept in report.json (e.g. server flags)")
    p.add_argument("--fail-on-error-rate", type=float, default=0.0,
                   help="exit 1 if any cell's error rate exceeds this (default 0: any error fails)")  # fmt: skip
    p.add_argument("--allow-failed-cells", action="store_true",
                   help="exit 0 even when a cell got no successful response (e.g. every request refused, 413)")  # fmt: skip
    p.add_argument("--fail-on-unstable", action="store_true",
                   help="exit 1 if a cell is unstable after --max-windows (needs --stability-percentage)")  # fmt: skip
    p.add_argument("--allow-rate-shortfall", action="store_true",
                   help="exit 0 even when an open-loop cell achieved under 90%% of its offered --rate")  # fmt: skip
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


def _reported_grpc(http: httpx.Client, url: str) -> str | None:
    """The host:port the server says its KServe v2 gRPC listens on (/info), or None when it has none."""
    try:
        info = http.get("/info")
    except httpx.HTTPError:
        return None
    reported = info.json().get("protocols", {}).get("v2_grpc") if info.status_code == 200 else None
    if not isinstance(reported, str) or ":" not in reported:
        return None
    host, port = reported.rsplit(":", 1)
    # A server bound to every interface reports 0.0.0.0: reach it where its HTTP was reached.
    return f"{urlparse(url).hostname}:{port}" if host in ("0.0.0.0", "::", "[::]") else reported


def discover(
    urls: list[str], models: list[str], api_key: str | None, grpc_urls: list[str | None] | None = None
) -> list[Target]:
    """Ask each server for each model's task (text or image) and backend, before any load. `grpc_urls`
    (for the grpc route): per URL the given host:port, or None to ask the server (/info)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    targets = []
    for i, url in enumerate(urls):
        with httpx.Client(base_url=url, headers=headers, timeout=10.0) as http:
            grpc_url = None
            if grpc_urls is not None:
                grpc_url = grpc_urls[i] or _reported_grpc(http, url)
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
                targets.append(Target(url, model, task, label, backend, grpc_url))
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


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _settings(argv: Sequence[str], plan: SweepPlan, started: float) -> dict[str, Any]:
    return {
        "argv": _redacted(argv),
        "started_utc": _utc(started),
        "finished_utc": _utc(time.time()),
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


def _write_outputs(report: Report, out: Path) -> list[Path]:
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
    return [*written, *charts, write_html(report, charts, out / "report.html")]


def _grpc_urls(args: argparse.Namespace, urls: list[str]) -> list[str | None] | None:
    """Per --url the --grpc-url given (or None: ask the server), when the grpc route is asked for."""
    given: list[str] = args.grpc_url or []
    if "grpc" not in (args.route or []):
        if given:
            raise InputError("--grpc-url applies to --route grpc")
        return None
    if given and len(given) != len(urls):
        raise InputError(f"give one --grpc-url per --url ({len(urls)}), in the same order; got {len(given)}")
    for grpc_url in given:
        if not re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s/:\[\]]+):\d{1,5}", grpc_url):
            raise InputError(f"--grpc-url takes host:port (e.g. 127.0.0.1:8001), got {grpc_url!r}")
    return list(given) or [None] * len(urls)


def _plan(args: argparse.Namespace, urls: list[str], notes: list[str]) -> SweepPlan:
    """Everything checked before any load: usage errors raise InputError/ValueError, server ones ServerError."""
    if not args.allow_remote:
        for url in urls:
            check_loopback(url)
    if args.fail_on_unstable and args.stability_percentage is None:
        raise InputError("--fail-on-unstable needs --stability-percentage (without it no cell is tested for stability)")
    points = _points(args)
    targets = discover(urls, args.model, args.api_key, _grpc_urls(args, urls))
    if not args.allow_remote:
        for target in targets:
            if target.grpc_url:
                check_loopback(f"grpc://{target.grpc_url}")
    plan = SweepPlan(targets=targets, groups=_groups(args, targets[0].task, notes), points=points,
                     routes=args.route or ["predict"], requests=args.requests, seconds=args.seconds,
                     timeout_s=args.timeout, api_key=args.api_key, truncate=args.truncate, warmup=args.warmup,
                     max_p50_ms=args.max_p50_ms, budget_s=args.budget_s, seed=args.seed, progress=args.progress,
                     stability=_stability(args))  # fmt: skip
    check_plan(plan)
    return plan


def _sweep(plan: SweepPlan) -> tuple[list[Cell], str | None]:
    """The cells, and why the sweep stopped early (Ctrl-C) or None."""
    try:
        return asyncio.run(run_sweep(plan, keep_on_cancel=True)), None
    except Interrupted as exc:
        return exc.cells, f"after {len(exc.cells)} of {exc.total} cells (Ctrl-C); the cell running then is not reported"


def main(argv: Sequence[str] | None = None, prog: str = "python -m lara_serve.clients loadtest") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    urls = args.url or [os.environ.get("LARA_URL") or DEFAULT_URL]
    started, notes = time.time(), list(args.note)
    try:
        plan = _plan(args, urls, notes)
    except (InputError, ValueError) as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # while the servers are asked about their models: nothing measured yet
        print("\ninterrupted (Ctrl-C) before any measurement: no report written", file=sys.stderr)
        return 130
    try:
        cells, interrupted = _sweep(plan)
    except KeyboardInterrupt:  # a second Ctrl-C while the sweep shut down
        print("\ninterrupted (Ctrl-C) twice: no report written", file=sys.stderr)
        return 130
    report = Report(_settings(argv, plan, started), plan.targets, cells, args.fail_on_error_rate, notes,
                    args.allow_failed_cells, args.fail_on_unstable, args.allow_rate_shortfall, interrupted)  # fmt: skip
    print(format_table(cells))
    written = _write_outputs(report, args.out) if args.out else []
    if interrupted:
        where = (
            f"wrote {len(written)} files to {args.out} (report.json ...)" if written else "no --out: nothing written"
        )
        print(f"\ninterrupted {interrupted}; {where}", file=sys.stderr)
        return 130
    if written:
        print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    if report.failures:
        print(f"FAILED: {len(report.failures)} problem(s): error rate above {args.fail_on_error_rate:g}, no "
              "successful response, open-loop rate short of offered or an unstable cell:", file=sys.stderr)  # fmt: skip
        for line in report.failures:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0
