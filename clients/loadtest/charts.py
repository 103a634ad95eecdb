"""PNG charts (matplotlib, Agg): latency and throughput vs input length and vs load, latency CDFs.

Every target (model, or model on a URL) has one colour on every chart; load points or inputs vary the
line style, so several models share one chart and stay readable.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only (servers, CI)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from clients.loadtest.report import Cell  # noqa: E402

_STYLES = ["-", "--", ":", "-."]
_MARKERS = ["o", "s", "^", "D", "v"]


def _ran(cells: list[Cell]) -> list[Cell]:
    return [c for c in cells if not c.skipped and c.p50_ms is not None]


def _colours(cells: list[Cell]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    targets = list(dict.fromkeys(c.target for c in cells))
    return {t: cycle[i % len(cycle)] for i, t in enumerate(targets)}


def _series(cells: list[Cell], key: Callable[[Cell], str]) -> dict[tuple[str, str, str], list[Cell]]:
    out: dict[tuple[str, str, str], list[Cell]] = {}
    for c in cells:
        out.setdefault((c.target, c.route, key(c)), []).append(c)
    return out


def _plot(
    ax: Axes, cells: list[Cell], x: Callable[[Cell], float], group: Callable[[Cell], str], metric: str, band: bool
) -> None:
    colours = _colours(cells)
    routes = list(dict.fromkeys(c.route for c in cells))
    groups = list(dict.fromkeys(group(c) for c in cells))
    for (target, route, name), series in _series(cells, group).items():
        series = sorted(series, key=x)
        xs = [x(c) for c in series]
        ys = [getattr(c, metric) for c in series]
        label = target + (f" {route}" if len(routes) > 1 else "") + (f" {name}" if len(groups) > 1 else "")
        style = _STYLES[groups.index(name) % len(_STYLES)]
        marker = _MARKERS[routes.index(route) % len(_MARKERS)]
        ax.plot(xs, ys, style, marker=marker, color=colours[target], label=label)
        if band:
            lo = [c.p90_ms for c in series]
            hi = [c.p99_ms for c in series]
            ax.fill_between(xs, lo, hi, color=colours[target], alpha=0.15, linewidth=0)  # type: ignore[arg-type]


def format_bytes(value: float, _pos: int | None = None) -> str:
    return f"{value / 1024:g} KB" if value >= 1024 else f"{value:g} B"


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _vs(cells: list[Cell], out: Path, stem: str, x: Callable[[Cell], float], group: Callable[[Cell], str],
        xlabel: str, subject: str) -> list[Path]:  # fmt: skip
    written = []
    for metric, ylabel, band in (("p50_ms", "latency p50 (ms); band: p90-p99", True),
                                 ("throughput_rps", "throughput (successful req/s)", False)):  # fmt: skip
        fig, ax = plt.subplots(figsize=(8, 5))
        _plot(ax, cells, x, group, metric, band)
        ax.set_xscale("log", base=2)
        if stem == "length":
            ax.xaxis.set_major_formatter(FuncFormatter(format_bytes))
        else:
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
        if metric == "p50_ms":
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(("Latency" if metric == "p50_ms" else "Throughput") + f" vs {subject}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        name = ("latency" if metric == "p50_ms" else "throughput") + f"_vs_{stem}.png"
        written.append(_save(fig, out / name))
    return written


def latency_cdf(cells: list[Cell], out: Path) -> Path | None:
    """One panel per input (small multiples): colour = target, line style = load, route by marker."""
    cells = [c for c in _ran(cells) if c.latencies_ms]
    if not cells:
        return None
    colours = _colours(cells)
    inputs = list(dict.fromkeys(c.input for c in cells))
    loads = list(dict.fromkeys(c.load for c in cells))
    routes = list(dict.fromkeys(c.route for c in cells))
    cols = min(4, len(inputs))
    rows = -(-len(inputs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False, sharey=True)
    for ax, name in zip(axes.flat, inputs, strict=False):
        for c in (c for c in cells if c.input == name):
            xs = sorted(c.latencies_ms)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            label = c.target + (f" {c.route}" if len(routes) > 1 else "") + f" {c.load}"
            ax.step(xs, ys, where="post", color=colours[c.target], label=label,
                    linestyle=_STYLES[loads.index(c.load) % len(_STYLES)],
                    marker=_MARKERS[routes.index(c.route) % len(_MARKERS)] if len(routes) > 1 else None,
                    markersize=3, markevery=max(1, len(xs) // 5))  # fmt: skip
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short ranges
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("latency (ms)", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(inputs) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("fraction of requests")
    fig.suptitle("Latency CDF per cell")
    return _save(fig, out / "latency_cdf.png")


def write_charts(cells: list[Cell], out: Path) -> list[Path]:
    """The charts that make sense for this sweep: 'vs length' needs two input sizes, 'vs load' two loads."""
    out.mkdir(parents=True, exist_ok=True)
    ran = _ran(cells)
    written: list[Path] = []
    if len({c.input_bytes for c in ran}) > 1:
        written += _vs(ran, out, "length", lambda c: c.input_bytes or 1.0, lambda c: c.load,
                       "input length (bytes, mean per input set)", "input length")  # fmt: skip
    if len({c.load for c in ran}) > 1 and len({c.mode for c in ran}) == 1:
        xlabel = "concurrency (closed loop)" if ran[0].mode == "closed" else "offered rate (requests/s)"
        written += _vs(ran, out, "load", lambda c: c.concurrency or c.rate or 1.0, lambda c: c.input,
                       xlabel, "load")  # fmt: skip
    cdf = latency_cdf(cells, out)
    if cdf:
        written.append(cdf)
    return written
