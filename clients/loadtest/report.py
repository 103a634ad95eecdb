"""The report model: one `Cell` per (target, route, input, load point), and the run's `Report`.

Latency percentiles are over answered-with-200 requests only; errors are counted by status, never
averaged into latency. A value that cannot be computed (no successful request) is None, written as
null: never NaN.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from lara_serve.clients.loadtest.inputs import InputGroup
from lara_serve.clients.loadtest.rigour import RATE_SHORT_FRACTION, percentile_warnings, rate_warning
from lara_serve.clients.loadtest.runner import CellRun
from lara_serve.clients.loadtest.schedule import LoadPoint

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Target:
    """One model on one server; `label` names it on charts and in tables."""

    url: str
    model: str
    task: str  # "text" or "image", from the server's model metadata
    label: str
    backend: str | None = None  # the server's v2 "platform" (onnxruntime_onnx, pytorch_libtorch: Triton's names)
    grpc_url: str | None = None  # host:port of its KServe v2 gRPC, for the grpc route


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


@dataclass
class Cell:
    target: str
    model: str
    url: str
    backend: str | None
    route: str
    input: str
    input_kind: str
    input_bytes: float | None  # mean payload size of the input group
    mode: str
    load: str  # "c=8" or "20/s poisson"
    concurrency: int | None
    rate: float | None
    arrival: str | None
    max_in_flight: int | None
    requests: int = 0
    ok: int = 0
    errors: int = 0
    error_rate: float | None = None
    statuses: dict[str, int] = field(default_factory=dict)
    duration_s: float | None = None
    throughput_rps: float | None = None  # successful answers per second
    offered_rps: float | None = None  # the open loop's configured rate; None in a closed loop (it offers none)
    achieved_rps: float | None = None  # answers (any status) per second: what the load actually was
    rate_short: bool | None = None  # open loop: achieved below 90% of offered
    p50_ms: float | None = None
    p90_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    mean_ms: float | None = None
    send_lag_p50_ms: float | None = None  # open loop: sent - scheduled (client-side delay)
    send_lag_p99_ms: float | None = None
    send_lag_max_ms: float | None = None
    server_queue_ms_p50: float | None = None
    server_queue_ms_mean: float | None = None
    server_inference_ms_p50: float | None = None
    server_inference_ms_mean: float | None = None
    server_total_ms_p50: float | None = None
    server_total_ms_mean: float | None = None
    batch_size_mean: float | None = None
    batch_size_max: float | None = None
    stopped_by: str | None = None  # "requests", "seconds", or None when skipped
    skipped: str | None = None  # why the cell did not run
    refused: bool = False  # skipped because the server refused the input (413 at warm-up): a failed cell
    windows: int | None = None  # measurement windows run (None: one bounded run, no stability test)
    stable: bool | None = None  # throughput and p50 agreed over the last windows (None: not tested)
    window_throughput_rps: list[float | None] = field(default_factory=list)
    window_p50_ms: list[float | None] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # thin percentiles, rate short of offered, unstable
    latencies_ms: list[float] = field(default_factory=list, repr=False)  # for CDF plots; not serialized

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("latencies_ms")
        return d


def empty_cell(target: Target, route: str, group: InputGroup, point: LoadPoint) -> Cell:
    return Cell(
        target=target.label,
        model=target.model,
        url=target.url,
        backend=target.backend,
        route=route,
        input=group.name,
        input_kind=group.kind,
        input_bytes=_r(group.mean_bytes, 1),
        mode=point.mode,
        load=point.label,
        concurrency=point.concurrency,
        rate=point.rate,
        arrival=point.arrival if point.mode == "open" else None,
        max_in_flight=point.max_in_flight,
    )


def skipped_cell(
    target: Target, route: str, group: InputGroup, point: LoadPoint, reason: str, refused: bool = False
) -> Cell:
    cell = empty_cell(target, route, group, point)
    cell.skipped = reason
    cell.refused = refused
    return cell


def summarize(target: Target, route: str, group: InputGroup, point: LoadPoint, run: CellRun) -> Cell:
    cell = empty_cell(target, route, group, point)
    samples = run.samples
    good = [s for s in samples if s.ok]
    latencies = [s.latency_ms for s in good]
    cell.requests, cell.ok = len(samples), len(good)
    cell.errors = cell.requests - cell.ok
    cell.error_rate = _r(cell.errors / cell.requests, 4) if samples else None
    cell.statuses = dict(sorted(Counter(s.status for s in samples).items()))
    cell.duration_s = _r(run.duration_s)
    cell.offered_rps = point.rate if point.mode == "open" else None
    if run.duration_s > 0:
        cell.throughput_rps = _r(cell.ok / run.duration_s)
        cell.achieved_rps = _r(cell.requests / run.duration_s)
    short = rate_warning(cell.offered_rps, cell.achieved_rps)
    cell.rate_short = None if cell.offered_rps is None else short is not None
    cell.warnings = percentile_warnings(cell.ok) + ([short] if short else [])
    for q in PERCENTILES:
        setattr(cell, f"p{q}_ms", _r(percentile(latencies, q)))
    cell.max_ms = _r(max(latencies)) if latencies else None
    cell.mean_ms = _r(_mean(latencies))
    if point.mode == "open":
        lags = [s.send_lag_ms for s in samples]
        cell.send_lag_p50_ms, cell.send_lag_p99_ms = _r(percentile(lags, 50)), _r(percentile(lags, 99))
        cell.send_lag_max_ms = _r(max(lags)) if lags else None
    for key in ("queue_ms", "inference_ms", "total_ms"):
        values = [s.server[key] for s in good if key in s.server]
        setattr(cell, f"server_{key}_p50", _r(percentile(values, 50)))
        setattr(cell, f"server_{key}_mean", _r(_mean(values)))
    sizes = [s.server["batch_size"] for s in good if "batch_size" in s.server]
    cell.batch_size_mean = _r(_mean(sizes), 2)
    cell.batch_size_max = max(sizes) if sizes else None
    cell.stopped_by = run.stopped_by
    cell.latencies_ms = latencies
    return cell


@dataclass
class Report:
    settings: dict[str, Any]
    targets: list[Target]
    cells: list[Cell]
    fail_on_error_rate: float = 0.0
    notes: list[str] = field(default_factory=list)  # e.g. skipped built-in sets
    allow_failed_cells: bool = False  # a cell without one successful answer fails the run unless this is set
    fail_on_unstable: bool = False  # a cell the stability test marked unstable fails the run
    allow_rate_shortfall: bool = False  # an open-loop cell short of its offered rate fails the run unless this is set
    interrupted: str | None = None  # why the sweep stopped early (Ctrl-C): the cells are the finished ones

    @property
    def failures(self) -> list[str]:
        """Cells whose error rate exceeds the threshold, cells that got no successful answer at all (413
        included, also when warm-up saw it and skipped the cell), open-loop cells short of their offered rate
        and, when asked, unstable cells: the run's exit status is non-zero if any. An interrupted run fails too:
        its report holds the finished cells only."""
        out = [f"interrupted: {self.interrupted}"] if self.interrupted else []
        for c in self.cells:
            where = f"{c.target} {c.route} {c.input} {c.load}"
            if c.error_rate is not None and c.error_rate > self.fail_on_error_rate:
                out.append(f"{where}: {c.errors}/{c.requests} errors {c.statuses}")
            elif not self.allow_failed_cells and (c.refused or (c.requests > 0 and c.ok == 0)):
                why = c.skipped if c.refused else f"{c.requests} requests, statuses {c.statuses}"
                out.append(f"{where}: no successful response ({why}); --allow-failed-cells accepts it")
            if c.rate_short and not self.allow_rate_shortfall:
                out.append(f"{where}: achieved {c.achieved_rps} req/s of the {c.offered_rps:g} offered (below "
                           f"{1 - RATE_SHORT_FRACTION:.0%}); --allow-rate-shortfall accepts it")  # fmt: skip
            if self.fail_on_unstable and c.stable is False:
                out.append(f"{where}: unstable over {c.windows} windows (--fail-on-unstable)")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "lara-loadtest/1",
            "settings": self.settings,
            "targets": [asdict(t) for t in self.targets],
            "fail_on_error_rate": self.fail_on_error_rate,
            "allow_failed_cells": self.allow_failed_cells,
            "fail_on_unstable": self.fail_on_unstable,
            "allow_rate_shortfall": self.allow_rate_shortfall,
            "interrupted": self.interrupted,
            "passed": not self.failures,
            "failures": self.failures,
            "notes": self.notes,
            "cells": [c.to_dict() for c in self.cells],
        }
