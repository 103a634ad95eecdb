"""What makes a cell's figures trustworthy: measurement windows with a stability test, the samples a
percentile needs, and achieved against offered rate.

Windows follow perf_analyzer's `--stability-percentage`: a cell runs window after window (each bounded by
the sweep's requests and seconds) until, over the last `STABLE_WINDOWS` windows, throughput and p50 are
each within the percentage of their mean, or until `max_windows`; the cell is reported over those last
windows, and an unstable one says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from lara_serve.clients.loadtest.runner import CellRun

STABLE_WINDOWS = 3  # as perf_analyzer: three consecutive windows must agree
# A percentile q needs at least one sample above it: n >= 100 / (100 - q). Below that, p99 is the max.
MIN_SAMPLES = {50: 2, 90: 10, 95: 20, 99: 100}
RATE_SHORT_FRACTION = 0.10  # achieved below 90% of the offered rate is flagged


@dataclass(frozen=True)
class Stability:
    percentage: float  # throughput and p50 within this % of their mean over the last windows
    max_windows: int = 10

    def __post_init__(self) -> None:
        if not 0 < self.percentage <= 100:
            raise ValueError(f"--stability-percentage must be in (0, 100], got {self.percentage:g}")
        if self.max_windows < STABLE_WINDOWS:
            raise ValueError(f"--max-windows must be at least {STABLE_WINDOWS}, got {self.max_windows}")


@dataclass(frozen=True)
class WindowStats:
    throughput_rps: float | None
    p50_ms: float | None


def window_stats(run: CellRun) -> WindowStats:
    good = [s.latency_ms for s in run.samples if s.ok]
    if not good or run.duration_s <= 0:
        return WindowStats(None, None)
    # The median equals report.percentile(values, 50) (linear interpolation).
    return WindowStats(len(good) / run.duration_s, statistics.median(good))


def _within(values: Sequence[float | None], percentage: float) -> bool:
    if any(v is None for v in values):
        return False
    numbers = [float(v) for v in values if v is not None]
    mean = sum(numbers) / len(numbers)
    return mean > 0 and all(abs(v - mean) <= mean * percentage / 100.0 for v in numbers)


def is_stable(stats: Sequence[WindowStats], percentage: float) -> bool:
    """True when the last STABLE_WINDOWS windows agree on throughput and p50 within the percentage."""
    last = list(stats)[-STABLE_WINDOWS:]
    if len(last) < STABLE_WINDOWS:
        return False
    return _within([s.throughput_rps for s in last], percentage) and _within([s.p50_ms for s in last], percentage)


def merge(runs: Sequence[CellRun]) -> CellRun:
    """Several windows as one run: their samples together, their durations added."""
    samples = [s for run in runs for s in run.samples]
    return CellRun(samples, sum(run.duration_s for run in runs), runs[-1].stopped_by)


def percentile_warnings(n_ok: int) -> list[str]:
    """One line per percentile that rests on fewer successful samples than it needs."""
    return [
        f"p{q} rests on {n_ok} samples (needs >= {need}); read it as a rough figure"
        for q, need in MIN_SAMPLES.items()
        if 0 < n_ok < need
    ]


def rate_warning(offered_rps: float | None, achieved_rps: float | None) -> str | None:
    """An open-loop cell whose answers came back slower than it offered requests: the server (or the client's
    in-flight cap) could not keep up, so its latency is that of an overloaded system."""
    if offered_rps is None or achieved_rps is None or offered_rps <= 0:
        return None
    if achieved_rps < offered_rps * (1.0 - RATE_SHORT_FRACTION):
        return f"achieved {achieved_rps:.1f} req/s of the {offered_rps:g} offered ({achieved_rps / offered_rps:.0%})"
    return None
