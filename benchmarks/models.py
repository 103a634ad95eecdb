"""Model latency on the CPU (not a test): onnxruntime vs PyTorch eager vs torch.compile.

onnxruntime twice: LaraAttention as its ONNX function body, and as the fused kernel (the server's default,
`lara_serve.kernels.ort_library`) when that can be built here.

Text (`lara-text-news-bytes`): batch 1 and 8 at 1K, 4K and 16K tokens; image (`lara-vit-fashion`): batch 1
and 8. Uses the trained weights in model_repository/ when present, else random weights (latency does
not depend on the weights). The graphs are exported with each model's own config (the text model's
max_length, 65,536 bytes, covers the 16K row).
Also tries onnxruntime session options (graph optimization level, intra-op threads) on two shapes.

    .venv/bin/python -m benchmarks.models [--threads 1] [--quick] [--no-compile]

One thread by default: on a shared 2-core machine, 2 OpenMP threads of torch collapse under load
(a 30 ms forward measured at ~1 s), which would measure the neighbours, not the backends.

Writes benchmarks/results/models.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from benchmarks.common import RESULTS, environment, markdown_table, write_json
from lara_serve.model_export import create_model, load_pretrained
from lara_serve.model_export.export import exporter as ex

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"text": "lara-text-news-bytes", "image": "lara-vit-fashion"}
TEXT_LENGTHS = (1024, 4096, 16384)
BATCHES = (1, 8)


def load_model(name: str) -> tuple[nn.Module, str]:
    model_dir = ROOT / "model_repository" / name
    if (model_dir / "1" / ex.WEIGHTS).is_file():
        return load_pretrained(model_dir), "trained"
    return create_model(name).eval(), "random"


def shapes(task: str, quick: bool) -> list[ex.ParityCase]:
    if task == "image":
        return [ex.ParityCase(b) for b in BATCHES]
    lengths = TEXT_LENGTHS[:2] if quick else TEXT_LENGTHS
    return [ex.ParityCase(b, n, pad=False) for n in lengths for b in BATCHES]


def interleaved_ms(fns: dict[str, Callable[[], Any]], work_s: float) -> dict[str, tuple[float, float]]:
    """{name: (best, median) ms}: rounds run every backend once in turn, so load spikes hit all alike.

    At least 3 rounds, more within ~3 s (at most 20). The best run is the headline: on a shared
    machine the median measures the neighbours too. Every fn has run once already (warm).
    """
    times: dict[str, list[float]] = {k: [] for k in fns}
    start = time.perf_counter()
    rounds = 0
    while rounds < 3 or (work_s < 0.5 and time.perf_counter() - start < 3.0 and rounds < 20):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000)
        rounds += 1
    return {k: (min(v), statistics.median(v)) for k, v in times.items()}


def bench_task(task: str, threads: int, quick: bool, compile_: bool) -> tuple[list[dict], list[dict], dict]:
    name = MODELS[task]
    model, weights = load_model(name)
    cfg = model.cfg
    t0 = time.perf_counter()
    onnx_path, tmp = ex.export_to_tmp(model)
    info = {"model": name, "weights": weights, "export_s": round(time.perf_counter() - t0, 1)}
    if task == "text":
        info["max_length"] = cfg.max_length
    session = ex.make_session(onnx_path, threads=threads)
    try:
        fused = ex.make_session(onnx_path, threads=threads, fused=True)
    except RuntimeError as e:
        fused, info["onnxruntime_fused_error"] = None, str(e)
    # Text: one dynamic-shape compile for every length. Images have one size: compile per batch size
    # (dynamic=True fails in inductor on the ViT's depthwise conv at batch 8, torch 2.13).
    compiled = torch.compile(model, dynamic=task == "text") if compile_ else None
    rows = []
    for case in shapes(task, quick):
        feeds = ex.make_inputs(cfg, case)
        tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}
        row: dict[str, Any] = {"task": task, "batch": case.batch, "tokens": case.seq}
        fns: dict[str, Callable[[], Any]] = {
            "onnxruntime": lambda f=feeds: session.run(["logits"], f),
            "torch_eager": lambda t=tensors: model(**t),
        }
        if fused is not None:
            fns["onnxruntime_fused"] = lambda f=feeds: fused.run(["logits"], f)
        with torch.inference_mode():
            t = time.perf_counter()
            ref = model(**tensors).numpy()
            work_s = time.perf_counter() - t
            row["ort_max_abs_diff"] = float(np.abs(session.run(["logits"], feeds)[0] - ref).max())
            if compiled is not None:
                t = time.perf_counter()
                try:
                    got = compiled(**tensors).numpy()  # compiles on the first call of a new shape kind
                except Exception as e:  # noqa: BLE001 - an inductor failure is a result, not a crash
                    row["torch_compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                else:
                    row["compile_first_call_s"] = round(time.perf_counter() - t, 1)
                    row["compile_max_abs_diff"] = float(np.abs(got - ref).max())
                    fns["torch_compile"] = lambda t=tensors: compiled(**t)
            for backend, (best, median) in interleaved_ms(fns, work_s).items():
                row[f"{backend}_ms"], row[f"{backend}_median_ms"] = best, median
        row["fastest"] = min(fns, key=lambda b: row[f"{b}_ms"])
        rows.append(row)
        print(row, flush=True)
    options = ort_options(onnx_path, cfg, task, threads)
    tmp.cleanup()
    return rows, options, info


def ort_options(onnx_path: Path, cfg: Any, task: str, threads: int) -> list[dict]:
    """Latency under each graph optimization level and intra-op thread count, one mid-size shape."""
    case = ex.ParityCase(8) if task == "image" else ex.ParityCase(1, 4096, pad=False)
    feeds = ex.make_inputs(cfg, case)
    rows = []
    for level in ("disable", "basic", "extended", "all"):
        for n in sorted({1, 2, threads}):
            session = ex.make_session(onnx_path, threads=n, level=level)
            ((best, median),) = interleaved_ms({"ort": lambda s=session: s.run(["logits"], feeds)}, 0.0).values()
            row = {"task": task, "batch": case.batch, "tokens": case.seq, "level": level, "threads": n}
            rows.append({**row, "ms": best, "median_ms": median})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="threads for torch and onnxruntime alike (1: shared machine)")
    p.add_argument("--quick", action="store_true", help="skip the 16K-token documents")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--tasks", default="text,image")
    p.add_argument("--merge", action="store_true", help="keep the other tasks' rows of the existing JSON")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    env = {**environment(), "onnxruntime": ort.__version__, "load_average": os.getloadavg()}
    results, options, models = [], [], []
    tasks = args.tasks.split(",")
    for task in tasks:
        rows, opts, info = bench_task(task, args.threads, args.quick, not args.no_compile)
        results += rows
        options += opts
        models.append(info)
    env["load_average_end"] = os.getloadavg()
    envs = {task: env for task in tasks}
    if args.merge and (RESULTS / "models.json").is_file():
        old = json.loads((RESULTS / "models.json").read_text())
        keep = [m["model"] for m in old["models"] if m["model"] not in {MODELS[t] for t in tasks}]
        old_env = old.get("environments") or {t: old["environment"] for t in MODELS}
        envs = {**{t: old_env[t] for t in MODELS if MODELS[t] in keep}, **envs}
        models = [m for m in old["models"] if m["model"] in keep] + models
        results = [r for r in old["results"] if r["task"] not in tasks] + results
        options = [r for r in old["ort_options"] if r["task"] not in tasks] + options
    cols = ["onnxruntime_ms", "onnxruntime_fused_ms", "torch_eager_ms", "torch_compile_ms"]
    table = markdown_table(
        [
            "task",
            "batch",
            "tokens",
            "onnxruntime (body) ms",
            "onnxruntime (fused) ms",
            "torch eager ms",
            "torch.compile ms",
            "fastest (best of N)",
        ],  # fmt: skip
        [[r["task"], r["batch"], r["tokens"] or "28x28", *(r.get(c) for c in cols), r["fastest"]] for r in results],
    )
    opt_table = markdown_table(
        ["task", "batch", "tokens", "graph optimization", "intra-op threads", "best ms", "median ms"],
        [
            [r["task"], r["batch"], r["tokens"] or "28x28", r["level"], r["threads"], r["ms"], r["median_ms"]]
            for r in options
        ],
    )
    note = (
        "graphs exported with each model's own config (models[].max_length); ms = best of >= 3 runs after a "
        "warm-up (medians in *_median_ms); torch.compile(dynamic=True) "
        "(text; images: static shapes, one compile per batch size) compile time is excluded (compile_first_call_s)"
    )
    path = write_json(
        "models.json",
        {"environments": envs, "models": models, "note": note, "results": results, "ort_options": options,
         "table_md": table, "ort_options_md": opt_table},
    )  # fmt: skip
    print(table)
    print()
    print(opt_table)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
