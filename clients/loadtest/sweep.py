"""A sweep: every target x route x input group x load point, warmed up, bounded, with live progress.

Order: for each route and input group (in the given order), every target at every load point: the
models compared at one length run minutes apart at most, so a machine whose load drifts affects both
alike. A group the server refuses as too large (413 during warm-up) is skipped with the server's reason; with
`max_p50_ms`, once a (target, route) cell is slower than that, longer inputs at that load and heavier
loads at that length or longer are skipped for it (how exact attention is kept from running for hours
at 64 KB). With `budget_s`, cells that would start after the budget is spent are skipped, saying so.
With `stability`, each cell runs measurement windows (each bounded by `requests` and `seconds`) until the
last three agree (clients/loadtest/rigour.py). Cancelled (Ctrl-C), the sweep raises `Interrupted` with the
cells finished so far when asked to (`keep_on_cancel`); the cell that was running is dropped (its samples
are partial).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from lara_serve.clients.loadtest.inputs import InputError, InputGroup, Payload, kind_hint
from lara_serve.clients.loadtest.protocol import PreparedRequest, Route, prepare, unsupported_reason
from lara_serve.clients.loadtest.report import Cell, Target, skipped_cell, summarize
from lara_serve.clients.loadtest.rigour import STABLE_WINDOWS, Stability, WindowStats, is_stable, merge, window_stats
from lara_serve.clients.loadtest.runner import CellPlan, CellRun, Client, Sample, run_cell
from lara_serve.clients.loadtest.schedule import LoadPoint

MAX_REQUESTS_PER_CELL = 100_000
MAX_SECONDS_PER_CELL = 600.0


class Interrupted(Exception):
    """The sweep was cancelled (Ctrl-C); `cells` are the ones that finished before it."""

    def __init__(self, cells: list[Cell], total: int) -> None:
        super().__init__(f"interrupted after {len(cells)} of {total} cells")
        self.cells = cells
        self.total = total


@dataclass(frozen=True)
class SweepPlan:
    targets: list[Target]
    groups: list[InputGroup]
    points: list[LoadPoint]
    routes: list[Route] = field(default_factory=lambda: ["predict"])
    requests: int = 200  # per cell, at most
    seconds: float = 10.0  # per cell, at most (requests in flight at the end are awaited)
    timeout_s: float = 60.0  # per request
    api_key: str | None = None
    truncate: bool = False
    warmup: int = 2  # unrecorded requests per (target, route, input) before its cells
    max_p50_ms: float | None = None
    budget_s: float | None = None  # whole sweep; the cell running when it ends still finishes
    seed: int = 0
    progress: bool | None = None  # live progress bars; None: only when stderr is a terminal
    stability: Stability | None = None  # measurement windows until stable; None: one run per cell

    def __post_init__(self) -> None:
        if not 1 <= self.requests <= MAX_REQUESTS_PER_CELL:
            raise ValueError(f"requests per cell must be in 1..{MAX_REQUESTS_PER_CELL}, got {self.requests}")
        if not 0 < self.seconds <= MAX_SECONDS_PER_CELL:
            raise ValueError(f"seconds per cell must be in (0, {MAX_SECONDS_PER_CELL}], got {self.seconds}")


def prepare_any(route: Route, model: str, payload: Payload, truncate: bool) -> PreparedRequest:
    """`protocol.prepare`, and the grpc route's request (grpcio is in the `grpc` extra: imported only for it)."""
    if route == "grpc":
        from lara_serve.clients.loadtest.grpc_route import prepare_grpc

        return prepare_grpc(model, payload, truncate)
    return prepare(route, model, payload, truncate)


def _route_reason(route: Route, kind: str) -> str | None:
    if route == "grpc":
        from lara_serve.clients.loadtest.grpc_route import unavailable_reason

        return unavailable_reason()
    return unsupported_reason(route, kind)


def check_plan(plan: SweepPlan) -> None:
    """Refuse, before any request, inputs a model cannot take (texts to an image model, and so on)."""
    problems = []
    for target in plan.targets:
        for group in plan.groups:
            if group.kind != target.task:
                problems.append(f"model {target.model!r} at {target.url} is a {target.task} model but input "
                                f"{group.name!r} is {group.kind}; give it {kind_hint(target.task)}")  # fmt: skip
            for route in plan.routes:
                reason = _route_reason(route, group.kind)
                if reason:
                    problems.append(f"route {route!r} with input {group.name!r}: {reason}")
        if "grpc" in plan.routes and target.grpc_url is None:
            problems.append(f"route 'grpc': {target.url} serves no KServe v2 gRPC (start it with --grpc-port) "
                            "and no --grpc-url was given")  # fmt: skip
    if problems:
        raise InputError("; ".join(dict.fromkeys(problems)))


async def _warm_up(client: Client, requests: list[PreparedRequest], n: int) -> str | None:
    """Send n requests one by one; a 413 means the input is larger than the model takes: skip reason."""
    if not isinstance(client, httpx.AsyncClient):
        return await client.warm_up(requests, n)
    for request in (requests[i % len(requests)] for i in range(n)):
        try:
            response = await client.post(request.path, content=request.content, headers=request.headers,
                                         params=request.params)  # fmt: skip
        except httpx.HTTPError:
            return None  # the cells will count it
        if response.status_code == 413:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            return f"server answered 413: {message}"
    return None


def _progress(plan: SweepPlan) -> bool:
    return sys.stderr.isatty() if plan.progress is None else plan.progress


async def run_sweep(
    plan: SweepPlan, log: Callable[[str], None] | None = None, keep_on_cancel: bool = False
) -> list[Cell]:
    """Every cell in order. `keep_on_cancel`: a cancellation (Ctrl-C under asyncio.run) raises `Interrupted`
    with the finished cells instead of CancelledError; for a caller that owns the event loop (the CLI)."""
    check_plan(plan)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    headers = {"Authorization": f"Bearer {plan.api_key}"} if plan.api_key else {}
    widest = max(
        [p.concurrency or p.max_in_flight or 256 for p in plan.points]  # an uncapped open loop: generous pool
    )
    limits = httpx.Limits(max_connections=widest + 4, max_keepalive_connections=widest + 4)
    # pool=None: waiting for a connection is client queueing, counted in latency, not an error.
    timeout = httpx.Timeout(plan.timeout_s, pool=None)
    clients: dict[str, Client] = {
        url: httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout, limits=limits)
        for url in dict.fromkeys(t.url for t in plan.targets)
    }
    if "grpc" in plan.routes:
        from lara_serve.clients.loadtest.grpc_route import GrpcClient

        for grpc_url in dict.fromkeys(t.grpc_url for t in plan.targets if t.grpc_url):
            clients[f"grpc://{grpc_url}"] = GrpcClient(grpc_url, plan.api_key, plan.timeout_s)
    cells: list[Cell] = []
    total = len(plan.targets) * len(plan.routes) * len(plan.groups) * len(plan.points)

    def record(cell: Cell) -> None:
        cells.append(cell)
        log(f"[{len(cells)}/{total}] " + _summary_line(cell))

    slow: dict[tuple[str, str], list[_TooSlow]] = {}  # (target, route) -> its cells over max_p50_ms
    deadline = time.monotonic() + plan.budget_s if plan.budget_s is not None else None
    try:
        for route in plan.routes:
            for group in plan.groups:
                for target in plan.targets:
                    marks = slow.setdefault((target.label, route), [])
                    client = clients[f"grpc://{target.grpc_url}" if route == "grpc" else target.url]
                    await _sweep_group(plan, client, target, route, group, marks, deadline, record)
    except asyncio.CancelledError:
        if not keep_on_cancel:
            raise
        # Ctrl-C under asyncio.run cancels this task: keep what finished instead of losing the whole run.
        raise Interrupted(cells, total) from None
    finally:
        for client in clients.values():
            await client.aclose()
    return cells


@dataclass(frozen=True)
class _TooSlow:
    input_bytes: float
    point: LoadPoint
    reason: str


def _slow_reason(slow: list[_TooSlow], group: InputGroup, point: LoadPoint) -> str | None:
    """A cell over max_p50_ms rules out longer inputs at its load, and heavier loads at its length or longer."""
    for hit in slow:
        if hit.point.mode == point.mode and point.x >= hit.point.x and group.mean_bytes >= hit.input_bytes:
            return hit.reason
    return None


async def _sweep_group(
    plan: SweepPlan,
    client: Client,
    target: Target,
    route: Route,
    group: InputGroup,
    slow: list[_TooSlow],
    deadline: float | None,
    record: Callable[[Cell], None],
) -> None:
    """One target, route and input at every load point; `slow` collects this target's cells over the limit."""

    def reason_to_skip(point: LoadPoint) -> str | None:
        if deadline is not None and time.monotonic() > deadline:
            return f"the sweep's time budget of {plan.budget_s:g} s was spent"
        return _slow_reason(slow, group, point)

    requests = [prepare_any(route, target.model, p, plan.truncate) for p in group.payloads]
    too_large = None
    if any(reason_to_skip(point) is None for point in plan.points):  # no warm-up for nothing
        too_large = await _warm_up(client, requests, plan.warmup)
    for point in plan.points:
        reason = too_large or reason_to_skip(point)
        if reason:
            record(skipped_cell(target, route, group, point, reason, refused=reason is too_large))
            continue
        cell = await _one_cell(plan, client, target, route, group, point, requests)
        record(cell)
        if plan.max_p50_ms is not None and (cell.p50_ms is None or cell.p50_ms > plan.max_p50_ms):
            why = f"p50 {cell.p50_ms} ms at {cell.input} {cell.load} exceeded the limit of {plan.max_p50_ms:g} ms"
            slow.append(_TooSlow(group.mean_bytes, point, why))


async def _one_cell(
    plan: SweepPlan,
    client: Client,
    target: Target,
    route: Route,
    group: InputGroup,
    point: LoadPoint,
    requests: list[PreparedRequest],
) -> Cell:
    desc = f"{target.label} {route} {group.name} {point.label}"
    stability = plan.stability
    windows = stability.max_windows if stability else 1
    runs: list[CellRun] = []
    stats: list[WindowStats] = []
    with _bar(plan, desc, windows) as bar:
        errors = 0

        def on_done(sample: Sample) -> None:
            nonlocal errors
            errors += not sample.ok
            bar.update(1)
            if errors:
                bar.set_postfix(errors=errors, refresh=False)

        for window in range(windows):
            # Each window its own arrival schedule (seed + window): repeats of one schedule would agree trivially.
            cell_plan = CellPlan(requests, plan.requests, plan.seconds, plan.seed + window, on_done)
            run = await run_cell(client, cell_plan, point)
            runs.append(run)
            stats.append(window_stats(run))
            if stability and is_stable(stats, stability.percentage):
                break
    if stability is None:
        return summarize(target, route, group, point, runs[0])
    cell = summarize(target, route, group, point, merge(runs[-STABLE_WINDOWS:]))
    cell.windows, cell.stable = len(runs), is_stable(stats, stability.percentage)
    cell.window_throughput_rps = [None if s.throughput_rps is None else round(s.throughput_rps, 3) for s in stats]
    cell.window_p50_ms = [None if s.p50_ms is None else round(s.p50_ms, 3) for s in stats]
    if not cell.stable:
        cell.warnings.append(
            f"unstable: throughput and p50 not within {stability.percentage:g}% over {STABLE_WINDOWS} consecutive "
            f"windows in {len(runs)}; figures are over the last {min(len(runs), STABLE_WINDOWS)}"
        )
    return cell


class _NoBar:
    """Stands in for tqdm when progress is off or tqdm is not installed (it is in the [loadtest] extra)."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int) -> None:
        return None

    def set_postfix(self, **kwargs: Any) -> None:
        return None


def _bar(plan: SweepPlan, desc: str, windows: int = 1) -> Any:
    if not _progress(plan):
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=plan.requests * windows, desc=desc, unit="req", leave=False)


def _summary_line(cell: Cell) -> str:
    where = f"{cell.target} {cell.route} {cell.input} {cell.load}"
    if cell.skipped:
        return f"{where}: skipped ({cell.skipped})"
    line = (f"{where}: {cell.requests} requests, {cell.errors} errors, {cell.throughput_rps} req/s, "
            f"p50 {cell.p50_ms} ms, p99 {cell.p99_ms} ms")  # fmt: skip
    if cell.windows is not None:
        line += f", {cell.windows} windows, {'stable' if cell.stable else 'UNSTABLE'}"
    return line
