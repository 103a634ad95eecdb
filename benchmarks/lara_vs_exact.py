"""LARA against exact softmax attention, served side by side (a benchmark, not a test).

1. The shipped text model's weights are exported a second time with exact attention: its config.json is
   read with `config_from_dict`, only the attention kind is changed to "softmax", the weights are loaded
   non-strictly and the parameters exact attention has no use for (LARA's landmark modules) are listed.
   Both go into a TEMPORARY model repository as `<model>` and `<model>-exact-attention`.
2. One `python -m lara_serve.server` serves both on 127.0.0.1, each on the backend that serves it best. Exact
   attention on the torch backend, because there it is torch SDPA, whose CPU flash kernel keeps memory
   linear in the length; an ONNX graph of exact attention would materialize [B, H, N, N] scores (17 GB
   at N = 32K, H = 4). LARA on the server's default, onnxruntime (`--lara-backend torch` puts it on the
   torch backend too, so the two differ in attention only; its fused kernel is slower end to end).
3. The load tester sweeps document lengths (default 1 KB..64 KB, capped at the model's max_length, the
   rest listed as skipped) at concurrency 1 and 8. A cell whose p50 exceeds --max-p50-ms stops exact
   attention from going longer or heavier.

    .venv/bin/python benchmarks/lara_vs_exact.py            # ~5-15 min on 2 CPU cores

Writes benchmarks/results/lara_vs_exact/: report.json, report.csv, PNG charts, summary.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lara_serve.clients.loadtest import LoadPoint, Report, SweepPlan, Target, run_sweep, synthetic_text  # noqa: E402
from lara_serve.clients.loadtest.charts import write_charts  # noqa: E402
from lara_serve.clients.loadtest.report import Cell  # noqa: E402
from lara_serve.clients.loadtest.writers import format_table, write_csv, write_json  # noqa: E402
from lara_serve.server.testing import server_process  # noqa: E402

EXACT_SUFFIX = "-exact-attention"
DEFAULT_LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]


def build_exact_variant(model_dir: Path, repository: Path) -> dict[str, Any]:
    """Copy the model (config + weights) into `repository`, then write its exact-attention twin beside it."""
    import torch
    from safetensors.torch import load_file

    from lara_serve.model_export.models.config import config_from_dict
    from lara_serve.model_export.models.hub import VERSION, WEIGHTS, load_config, save_pretrained
    from lara_serve.model_export.models.registry import build_model

    conf = load_config(model_dir)
    name = conf["name"]
    lara_dir = repository / name
    (lara_dir / VERSION).mkdir(parents=True)
    shutil.copy2(model_dir / "config.json", lara_dir / "config.json")
    shutil.copy2(model_dir / VERSION / WEIGHTS, lara_dir / VERSION / WEIGHTS)
    if (model_dir / VERSION / "model.onnx").is_file():  # onnxruntime serves the shipped graph
        shutil.copy2(model_dir / VERSION / "model.onnx", lara_dir / VERSION / "model.onnx")

    # Everything but the attention kind comes from the shipped config: a retrained model (other
    # positions, longer max_length) gets its exact twin without a change here.
    attention = {**conf["attention"], "kind": "softmax"}
    cfg = config_from_dict(conf["model"], attention)
    model = build_model(cfg, seed=int(conf.get("seed", 0)))
    state = load_file(str(model_dir / VERSION / WEIGHTS))
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys:
        raise RuntimeError(f"exact attention needs weights the LARA model lacks: {result.missing_keys}")
    exact_conf = {
        **conf,
        "name": name + EXACT_SUFFIX,
        "attention": attention,
        "derived_from": f"{name}: same weights, exact softmax attention (benchmark only, not trained as such)",
    }
    exact_dir = save_pretrained(model.eval(), exact_conf, repository / exact_conf["name"])
    with torch.inference_mode():  # the same weights must give a sane, finite model
        logits = model(torch.ones(1, 64, dtype=torch.int64) * 70, torch.ones(1, 64, dtype=torch.int64))
    if not torch.isfinite(logits).all():
        raise RuntimeError("the exact-attention variant returns non-finite logits")
    return {
        "lara": name,
        "exact": exact_conf["name"],
        "exact_dir": str(exact_dir),
        "dropped_parameters": sorted(result.unexpected_keys),
        "max_length": int(conf["model"].get("max_length") or conf["preprocessing"]["max_length"]),
    }


def ratios(cells: list[Cell], lara: str, exact: str) -> list[dict[str, Any]]:
    """Exact p50 / LARA p50 at each (concurrency, length) both measured."""
    by_key = {(c.model, c.concurrency, c.input_bytes): c for c in cells if c.p50_ms is not None}
    rows = []
    for c in cells:
        if c.model != lara or c.p50_ms is None:
            continue
        other = by_key.get((exact, c.concurrency, c.input_bytes))
        rows.append({
            "concurrency": c.concurrency,
            "bytes": c.input_bytes,
            "lara_p50_ms": c.p50_ms,
            "exact_p50_ms": other.p50_ms if other else None,
            "exact_over_lara": round(other.p50_ms / c.p50_ms, 2) if other and other.p50_ms else None,
            # The server's own inference time (X-Inference-Time-Ms): no HTTP, no queueing.
            "lara_inference_p50_ms": c.server_inference_ms_p50,
            "exact_inference_p50_ms": other.server_inference_ms_p50 if other else None,
            "lara_rps": c.throughput_rps,
            "exact_rps": other.throughput_rps if other else None,
        })  # fmt: skip
    return rows


def summary(cells: list[Cell], names: dict[str, Any], skipped_lengths: list[int]) -> dict[str, Any]:
    rows = ratios(cells, names["lara"], names["exact"])
    out: dict[str, Any] = {"ratios": rows, "lengths_skipped_over_max_length": skipped_lengths}
    for conc in sorted({r["concurrency"] for r in rows}):
        mine = [r for r in rows if r["concurrency"] == conc]
        faster = [r["bytes"] for r in mine if r["exact_over_lara"] is not None and r["exact_over_lara"] > 1]
        out[f"crossover_bytes_c{conc}"] = min(faster) if faster else None  # shortest length where LARA wins
        p50 = {r["bytes"]: r["lara_p50_ms"] for r in mine}
        longest = max(p50)
        if 4096.0 in p50 and longest > 4096.0:  # linear in length would be longest / 4096
            out[f"lara_p50_growth_c{conc}"] = {"from_bytes": 4096, "to_bytes": longest,
                                               "p50_ratio": round(p50[longest] / p50[4096.0], 2),
                                               "linear_would_be": longest / 4096}  # fmt: skip
    return out


def ratio_chart(rows: list[dict[str, Any]], path: Path, lara_backend: str) -> Path:
    """exact p50 / LARA p50 vs length, one line per concurrency; above 1 LARA answers sooner."""
    from matplotlib.ticker import FuncFormatter

    from lara_serve.clients.loadtest.charts import format_bytes, plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for conc in sorted({r["concurrency"] for r in rows}):
        points = [(r["bytes"], r["exact_over_lara"]) for r in rows
                  if r["concurrency"] == conc and r["exact_over_lara"] is not None]  # fmt: skip
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=f"concurrency {conc}")
        for x, y in points:
            ax.annotate(f"{y:g}x", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="break-even")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(format_bytes))
    ax.set_xlabel("document length")
    ax.set_ylabel("exact p50 / LARA p50")
    ax.set_title(f"Exact (torch SDPA) p50 / LARA ({lara_backend}) p50, same weights, one server", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=ROOT / "model_repository" / "lara-text-news-bytes")
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="bytes")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--requests", type=int, default=24, help="per cell, at most")
    parser.add_argument("--seconds", type=float, default=15.0, help="per cell, at most (in-flight ones finish)")
    parser.add_argument("--max-p50-ms", type=float, default=20000.0, help="per-cell time limit (see above)")
    parser.add_argument("--budget-s", type=float, default=720.0, help="whole sweep; later cells are skipped")
    parser.add_argument("--threads", type=int, default=0, help="server intra-op threads (0: library default)")
    parser.add_argument(
        "--lara-backend",
        choices=["onnxruntime", "torch"],
        default="onnxruntime",
        help="backend serving the LARA model (exact attention always runs on torch SDPA)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "lara_vs_exact")
    args = parser.parse_args()
    started = time.time()

    with tempfile.TemporaryDirectory(prefix="lara-vs-exact-") as scratch:
        repo = Path(scratch)
        names = build_exact_variant(args.model_dir, repo)
        print(f"exact variant: {names['exact']} (dropped {len(names['dropped_parameters'])} LARA-only "
              f"parameters: {names['dropped_parameters']})", file=sys.stderr)  # fmt: skip
        requested = [int(v) for v in args.lengths.split(",")]
        lengths = [n for n in requested if n <= names["max_length"]]
        skipped = [n for n in requested if n > names["max_length"]]
        if skipped:
            print(f"skipping {skipped}: longer than the model's max_length {names['max_length']}", file=sys.stderr)
        env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_MODELS": f"{names['lara']},{names['exact']}",
               "LARA_BACKEND": "torch", "LARA_MODEL_BACKENDS": f"{names['lara']}={args.lara_backend}",
               "LARA_REQUEST_TIMEOUT_S": "600", "LARA_NUM_THREADS": str(args.threads)}  # fmt: skip
        with server_process(["--log-level", "warning"], env=env, timeout_s=300) as url:
            targets = [Target(url, names["lara"], "text", f"{names['lara']} (LARA, {args.lara_backend})", f"lara_{args.lara_backend}"),
                       Target(url, names["exact"], "text", f"{names['lara']} (exact, torch SDPA)", "lara_torch")]  # fmt: skip
            plan = SweepPlan(targets=targets, groups=[synthetic_text(n) for n in lengths],
                             points=[LoadPoint.closed(int(c)) for c in args.concurrency.split(",")],
                             requests=args.requests, seconds=args.seconds, timeout_s=900.0, warmup=1,
                             max_p50_ms=args.max_p50_ms, budget_s=args.budget_s)  # fmt: skip
            cells = asyncio.run(run_sweep(plan))

    settings = {
        "benchmark": "benchmarks/lara_vs_exact.py",
        "argv": sys.argv[1:],
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "server": f"python -m lara_serve.server --backend torch --model-backends {names['lara']}={args.lara_backend}, "
        "127.0.0.1, default batching",
        "lara_backend": args.lara_backend,
        "exact_attention": "torch SDPA (CPU flash kernel: memory linear in N), same weights as LARA",
        "requests_per_cell": args.requests,
        "seconds_per_cell": args.seconds,
        "max_p50_ms": args.max_p50_ms,
        "budget_s": args.budget_s,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "variant": names,
    }
    report = Report(settings, targets, cells, fail_on_error_rate=0.0)
    result = summary(cells, names, skipped)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(report, args.out / "report.json")
    write_csv(cells, args.out / "report.csv")
    write_charts(cells, args.out)
    ratio_chart(result["ratios"], args.out / "exact_over_lara.png", args.lara_backend)
    (args.out / "summary.json").write_text(json.dumps({**settings, **result}, indent=2, allow_nan=False) + "\n")
    print(format_table(cells))
    print(json.dumps(result, indent=2))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
