"""report.json, report.csv and the stdout table."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from lara_serve.clients.loadtest.report import Cell, Report

CSV_COLUMNS = [
    "target", "model", "url", "backend", "route", "input", "input_kind", "input_bytes", "mode", "load",
    "concurrency", "rate", "arrival", "max_in_flight", "requests", "ok", "errors", "error_rate", "statuses",
    "duration_s", "throughput_rps", "offered_rps", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms",
    "send_lag_p50_ms", "send_lag_p99_ms", "send_lag_max_ms", "server_queue_ms_p50", "server_queue_ms_mean",
    "server_inference_ms_p50", "server_inference_ms_mean", "server_total_ms_p50", "server_total_ms_mean",
    "batch_size_mean", "batch_size_max", "stopped_by", "skipped", "achieved_rps", "rate_short", "windows",
    "stable", "warnings",
]  # fmt: skip


def _finite(value: Any) -> Any:
    """NaN and infinities become None (null): report.json must parse under strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_json(report: Report, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(report.to_dict()), indent=2, allow_nan=False) + "\n")
    return path


def write_csv(cells: list[Cell], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for cell in cells:
            row = _finite(cell.to_dict())
            row["statuses"] = ";".join(f"{k}:{v}" for k, v in cell.statuses.items())
            row["warnings"] = " | ".join(cell.warnings)
            writer.writerow({k: "" if row[k] is None else row[k] for k in CSV_COLUMNS})
    return path


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(cells: list[Cell]) -> str:
    """Fixed-width table: one row per cell, latency in ms; skipped cells are listed below it with the reason."""
    head = ["target", "route", "input", "load", "n", "err", "req/s", "p50", "p90", "p95", "p99", "max",
            "queue", "infer", "batch"]  # fmt: skip
    rows, skipped, warned = [], [], []
    for c in cells:
        if c.skipped:
            skipped.append(f"skipped {c.target} {c.route} {c.input} {c.load}: {c.skipped}")
            continue
        warned += [f"warning {c.target} {c.route} {c.input} {c.load}: {w}" for w in c.warnings]
        rows.append([
            c.target, c.route, c.input, c.load, str(c.requests), str(c.errors), _fmt(c.throughput_rps),
            _fmt(c.p50_ms), _fmt(c.p90_ms), _fmt(c.p95_ms), _fmt(c.p99_ms), _fmt(c.max_ms),
            _fmt(c.server_queue_ms_p50), _fmt(c.server_inference_ms_p50), _fmt(c.batch_size_mean),
        ])  # fmt: skip
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(head)]

    def line(values: list[str]) -> str:
        # Names left-aligned, numbers right-aligned.
        return "  ".join(
            v.ljust(w) if i < 4 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )

    lines = [line(head), line(["-" * w for w in widths]), *(line(r) for r in rows), *skipped, *warned]
    lines.append(
        "latency: ms from the scheduled send time; queue, infer: server p50 (headers, gRPC trailing metadata); batch: mean size"
    )
    return "\n".join(lines)
