"""The tables of benchmarks/grpc_vs_http.py: measured cells -> rows, ratios and the targets, markdown, chart.

Pure functions of the cells (no server, no Triton), so they are tested without either. A cell is one
measurement: `payload`, `server` ("lara" | "triton"), `input` ("tensors": preprocessed INT64/FP32
tensors, what both servers accept; "raw": the text or PNG bytes, LARA Serve only), `protocol` ("http"
binary | "grpc"), `round`, `p50_ms`, `p99_ms`, `requests_per_s`. Rounds alternate the order of servers,
so a row is the median over rounds (mean for throughput). Overhead per request is the median latency minus
the model's own compute time on the same input (`compute_ms`, measured with onnxruntime in-process, the
same for every server, so it shifts rows but no comparison). Where a cell has it, `cpu_ms_per_request` is the
server's CPU time (all its processes and threads) per request of the one-client latency cell: what a request
costs the machine, which CPU contention stretches far less than it stretches wall time.

    python -m benchmarks.grpc_vs_http_report RESULTS.json   # rows, ratios and chart again from the cells
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

KEY = ("payload", "server", "input", "protocol")
LEVEL_TOLERANCE = 0.05  # "at least level with Triton": LARA's gRPC overhead at most 5% above Triton's
LANE_NAMES = {
    ("lara", "tensors"): "LARA Serve, tensors",
    ("triton", "tensors"): "Triton (pytriton), tensors",
    ("lara", "raw"): "LARA Serve, raw bytes",
}


def summarize(
    cells: Iterable[Mapping[str, Any]], compute_ms: Mapping[str, float] | None = None
) -> list[dict[str, Any]]:
    """One row per (payload, server, input, protocol), in first-seen order, aggregated over rounds."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for cell in cells:
        groups.setdefault(tuple(str(cell[k]) for k in KEY), []).append(cell)
    rows = []
    for key, group in groups.items():
        row: dict[str, Any] = dict(zip(KEY, key, strict=True))
        row["rounds"] = len(group)
        row["p50_ms"] = statistics.median(c["p50_ms"] for c in group)
        row["p50_ms_range"] = [min(c["p50_ms"] for c in group), max(c["p50_ms"] for c in group)]  # the noise
        row["p99_ms"] = statistics.median(c["p99_ms"] for c in group)
        row["requests_per_s"] = statistics.fmean(c["requests_per_s"] for c in group)
        cpu = [c["cpu_ms_per_request"] for c in group if c.get("cpu_ms_per_request") is not None]
        row["cpu_ms_per_request"] = statistics.median(cpu) if cpu else None  # files before it was measured: None
        compute = (compute_ms or {}).get(row["payload"])
        row["overhead_ms"] = row["p50_ms"] - compute if compute is not None else None
        rows.append(row)
    return rows


def _find(rows: Sequence[Mapping[str, Any]], *key: str) -> Mapping[str, Any] | None:
    """The row of (payload, server, input, protocol), or None."""
    for row in rows:
        if tuple(row[k] for k in KEY) == key:
            return row
    return None


def _ratio(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, field: str) -> float | None:
    if a is None or b is None or a.get(field) is None or b.get(field) is None or b[field] == 0:
        return None
    return float(a[field]) / float(b[field])


def ratios(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per payload: gRPC against binary HTTP on each server, LARA's gRPC against Triton's, and the targets."""
    out: dict[str, dict[str, Any]] = {}
    for payload in dict.fromkeys(r["payload"] for r in rows):
        lara_grpc, lara_http = (_find(rows, payload, "lara", "tensors", p) for p in ("grpc", "http"))
        raw_grpc, raw_http = (_find(rows, payload, "lara", "raw", p) for p in ("grpc", "http"))
        triton_grpc, triton_http = (_find(rows, payload, "triton", "tensors", p) for p in ("grpc", "http"))
        entry: dict[str, Any] = {
            "lara_grpc_over_http_p50": _ratio(lara_grpc, lara_http, "p50_ms"),
            "lara_raw_grpc_over_http_p50": _ratio(raw_grpc, raw_http, "p50_ms"),
            "triton_grpc_over_http_p50": _ratio(triton_grpc, triton_http, "p50_ms"),
            "lara_over_triton_grpc_p50": _ratio(lara_grpc, triton_grpc, "p50_ms"),
            "lara_over_triton_grpc_throughput": _ratio(lara_grpc, triton_grpc, "requests_per_s"),
            "lara_over_triton_http_p50": _ratio(lara_http, triton_http, "p50_ms"),
            "lara_over_triton_grpc_cpu": _ratio(lara_grpc, triton_grpc, "cpu_ms_per_request"),
        }
        # Both servers run the same model on the same input, so overhead = p50 - the same compute: comparing
        # overheads is comparing p50s.
        pairs = [(lara_grpc, lara_http), (raw_grpc, raw_http)]
        below = [g["p50_ms"] < h["p50_ms"] for g, h in pairs if g is not None and h is not None]
        entry["target_grpc_below_http"] = all(below) if below else None
        level = entry["lara_over_triton_grpc_p50"]
        entry["target_level_with_triton"] = None if level is None else level <= 1 + LEVEL_TOLERANCE
        out[payload] = entry
    return out


def paired(cells: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per payload and protocol, LARA's p50 over Triton's (tensors) round by round. Within a round the two
    took turns request by request, so each ratio saw one load; their median is steadier than the ratio of
    the medians, which compares p50s taken minutes apart."""
    by: dict[tuple[str, str, int], dict[str, float]] = {}
    for c in cells:
        if c["input"] == "tensors":
            by.setdefault((c["payload"], c["protocol"], c["round"]), {})[c["server"]] = c["p50_ms"]
    out: dict[str, dict[str, Any]] = {}
    for (payload, protocol, _), p50 in by.items():
        if "lara" in p50 and p50.get("triton"):
            out.setdefault(payload, {}).setdefault(protocol, []).append(p50["lara"] / p50["triton"])
    return {
        payload: {
            f"lara_over_triton_{p}_p50_per_round": {"median": statistics.median(r), "rounds": r} for p, r in v.items()
        }
        for payload, v in out.items()
    }


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| payload | server, input | protocol | p50 (ms) | p50 over rounds | p99 (ms) | overhead p50 (ms) "
        "| throughput (req/s) | server CPU (ms/req) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lane = LANE_NAMES.get((r["server"], r["input"]), f"{r['server']}, {r['input']}")
        lines.append(
            f"| {r['payload']} | {lane} | {r['protocol']} | {_fmt(r['p50_ms'])} | "
            f"{_fmt(r['p50_ms_range'][0])}-{_fmt(r['p50_ms_range'][1])} | {_fmt(r['p99_ms'])} | "
            f"{_fmt(r.get('overhead_ms'))} | {_fmt(r['requests_per_s'])} | {_fmt(r.get('cpu_ms_per_request'))} |"
        )
    return "\n".join(lines)


def chart(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> None:
    """Median latency and throughput per payload, one bar per (server, input, protocol)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    payloads = list(dict.fromkeys(r["payload"] for r in rows))
    kinds = list(dict.fromkeys((r["server"], r["input"]) for r in rows))  # one colour each
    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    lanes = [(*kind, p) for kind in kinds for p in protocols]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(len(lanes), 1)
    for i, lane in enumerate(lanes):
        by_payload = {r["payload"]: r for r in rows if (r["server"], r["input"], r["protocol"]) == lane}
        xs = [p + (i - (len(lanes) - 1) / 2) * width for p in range(len(payloads))]
        label = f"{LANE_NAMES.get(lane[:2], ', '.join(lane[:2]))}, {lane[2]}"
        grpc = lane[2] == "grpc"
        for ax, field in zip(axes, ("p50_ms", "requests_per_s"), strict=True):
            values = [by_payload[p][field] if p in by_payload else 0.0 for p in payloads]
            color = f"C{kinds.index(lane[:2])}"
            ax.bar(
                xs, values, width, label=label, color=color, hatch="//" if grpc else None, alpha=0.9 if grpc else 0.55
            )
    for ax, ylabel in zip(axes, ("median latency, one client (ms)", "throughput (requests/s)"), strict=True):
        ax.set_xticks(range(len(payloads)), payloads)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rerender(path: Path) -> str:
    """Rows, ratios and the chart of a results file again from its cells (after a change to this module)."""
    report = json.loads(path.read_text())
    report["rows"] = summarize(report["cells"], report.get("compute_ms"))
    report["ratios"] = ratios(report["rows"])
    report["paired"] = paired(report["cells"])
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    settings = report["settings"]
    rounds = max(c["round"] for c in report["cells"]) + 1 if report["cells"] else 0
    load = report["machine"].get("loadavg_1min_end")
    chart(report["rows"], path.with_suffix(".png"), f"gRPC vs binary HTTP, {settings['models_dir']} models, "
          f"concurrency {settings['concurrency']}, {rounds} round(s), load avg {load:.1f} on "
          f"{report['machine']['cpus']} CPUs")  # fmt: skip
    return markdown(report["rows"])


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}\n{rerender(Path(name))}\n")
