"""PNG charts (matplotlib, Agg): latency and throughput vs input length and vs load, latency CDFs.

Each load point (or, on 'vs load' charts, each input) has its own colour; targets (model, or model on a
URL) vary the line style and routes the marker, so several models share one chart and stay readable.
Legends sit outside the axes; every panel has its own tick labels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only (servers, CI)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from lara_serve.clients.loadtest.report import Cell  # noqa: E402

_STYLES = ["-", "--", ":", "-."]
_MARKERS = ["o", "s", "^", "D", "v"]


def _ran(cells: list[Cell]) -> list[Cell]:
    return [c for c in cells if not c.skipped and c.p50_ms is not None]


def _palette(keys: list[str]) -> dict[str, str]:
    """One colour per key (a load point, or an input on 'vs load' charts), from a palette of distinct hues."""
    cycle = plt.get_cmap("tab10").colors
    return {k: matplotlib.colors.to_hex(cycle[i % len(cycle)]) for i, k in enumerate(keys)}


def _series(cells: list[Cell], key: Callable[[Cell], str]) -> dict[tuple[str, str, str], list[Cell]]:
    out: dict[tuple[str, str, str], list[Cell]] = {}
    for c in cells:
        out.setdefault((c.target, c.route, key(c)), []).append(c)
    return out


def _plot(
    ax: Axes, cells: list[Cell], x: Callable[[Cell], float], group: Callable[[Cell], str], metric: str, band: bool
) -> None:
    """Colour = the group (the load, or the input); line style = target; marker = route."""
    targets = list(dict.fromkeys(c.target for c in cells))
    routes = list(dict.fromkeys(c.route for c in cells))
    colours = _palette(list(dict.fromkeys(group(c) for c in cells)))
    for (target, route, name), series in _series(cells, group).items():
        series = sorted(series, key=x)
        xs = [x(c) for c in series]
        ys = [getattr(c, metric) for c in series]
        parts = [target] if len(targets) > 1 or len(colours) == 1 else []  # one target: the legend's title says
        parts += [name] if len(colours) > 1 else []
        label = " ".join(parts + ([route] if len(routes) > 1 else []))
        style = _STYLES[targets.index(target) % len(_STYLES)]
        marker = _MARKERS[routes.index(route) % len(_MARKERS)]
        ax.plot(xs, ys, style, marker=marker, color=colours[name], label=label, linewidth=1.8)
        if band:
            lo = [c.p90_ms if c.p90_ms is not None else c.p50_ms for c in series]
            hi = [c.p99_ms if c.p99_ms is not None else c.p50_ms for c in series]
            # A band light enough to read the line through, with its edges drawn so that it shows at any width.
            ax.fill_between(xs, lo, hi, color=colours[name], alpha=0.22, linewidth=0)  # type: ignore[arg-type]
            ax.plot(xs, hi, ":", color=colours[name], linewidth=1.0)
            ax.plot(xs, lo, ":", color=colours[name], linewidth=0.8)


def format_bytes(value: float, _pos: int | None = None) -> str:
    return f"{value / 1024:g} KB" if value >= 1024 else f"{value:g} B"


def _legend_outside(ax: Axes, title: str) -> None:
    """The legend to the right of the axes, never over the data."""
    ax.legend(fontsize=8, title=title, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0),
              borderaxespad=0.0, frameon=False)  # fmt: skip


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight" keeps the outside legend in the image
    plt.close(fig)
    return path


def _two_and_five(value: float, _pos: int | None = None) -> str:
    """Minor log ticks labelled at 2x and 5x a power of ten only, so that labels do not collide."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)), 6)
    return f"{value:g}" if mantissa in (2.0, 5.0) else ""


def _latency_axis(ax: Axes, values: list[float]) -> None:
    """Log scale when latencies span a decade or more, linear otherwise: a log axis over a narrow range
    has no major tick inside it and so no labels (the empty 1 KB panel of the old charts)."""
    finite = [v for v in values if v and v > 0]
    if finite and max(finite) / min(finite) >= 10:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(_two_and_five))
    ax.tick_params(axis="both", labelsize=7, labelbottom=True, labelleft=True)


def _vs(cells: list[Cell], out: Path, stem: str, x: Callable[[Cell], float], group: Callable[[Cell], str],
        xlabel: str, subject: str) -> list[Path]:  # fmt: skip
    written = []
    legend = "load" if stem == "length" else "input"
    for metric, ylabel, band in (("p50_ms", "latency p50 (ms); band and dotted: p90-p99", True),
                                 ("throughput_rps", "throughput (successful req/s)", False)):  # fmt: skip
        fig, ax = plt.subplots(figsize=(8, 5))
        _plot(ax, cells, x, group, metric, band)
        ax.set_xscale("log", base=2)
        xs = sorted({x(c) for c in cells})
        ax.set_xticks(xs)  # a tick at every measured point, labelled
        ax.xaxis.set_minor_formatter(NullFormatter())
        if stem == "length":
            ax.xaxis.set_major_formatter(FuncFormatter(format_bytes))
        else:
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
        if metric == "p50_ms":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(_two_and_five))  # not matplotlib's "4x10^2"
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(("Latency" if metric == "p50_ms" else "Throughput") + f" vs {subject}")
        ax.grid(True, which="both", alpha=0.3)
        _legend_outside(ax, legend)
        name = ("latency" if metric == "p50_ms" else "throughput") + f"_vs_{stem}.png"
        written.append(_save(fig, out / name))
    return written


def latency_cdf(cells: list[Cell], out: Path) -> Path | None:
    """One panel per input (small multiples): colour = load, line style = target, route by marker."""
    cells = [c for c in _ran(cells) if c.latencies_ms]
    if not cells:
        return None
    loads = list(dict.fromkeys(c.load for c in cells))
    colours = _palette(loads)
    targets = list(dict.fromkeys(c.target for c in cells))
    inputs = list(dict.fromkeys(c.input for c in cells))
    routes = list(dict.fromkeys(c.route for c in cells))
    cols = min(3, len(inputs))
    rows = -(-len(inputs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, inputs, strict=False):
        panel = [c for c in cells if c.input == name]
        for c in panel:
            xs = sorted(c.latencies_ms)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            label = c.load + (f" {c.target}" if len(targets) > 1 else "") + (f" {c.route}" if len(routes) > 1 else "")
            ax.step(xs, ys, where="post", color=colours[c.load], label=label, linewidth=1.6,
                    linestyle=_STYLES[targets.index(c.target) % len(_STYLES)],
                    marker=_MARKERS[routes.index(c.route) % len(_MARKERS)] if len(routes) > 1 else None,
                    markersize=3, markevery=max(1, len(xs) // 5))  # fmt: skip
        _latency_axis(ax, [v for c in panel for v in c.latencies_ms])
        ax.set_ylim(0, 1.02)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("latency (ms)", fontsize=8)
        ax.set_ylabel("fraction of requests", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(inputs) :]:
        ax.set_visible(False)
    # One legend for the figure, right of the panels: the same loads in every panel.
    entries: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    fig.legend(list(entries.values()), list(entries), loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8, frameon=False,
               title="load", title_fontsize=8)  # fmt: skip
    fig.suptitle("Latency CDF per cell")
    fig.tight_layout()
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
