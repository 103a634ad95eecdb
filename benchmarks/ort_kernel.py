"""onnxruntime with LaraAttention's ONNX function body vs the fused kernel as a custom op (not a test).

The shipped `model.onnx` files, unchanged, in two onnxruntime sessions that differ only in
`lara_serve.kernels.ort_library.register` (the fused kernel) or not (the body, inlined at load). Text
(`lara-text-news-bytes`): random byte ids at each length, batch 1 (and batch 8 up to 4K tokens); image
(`lara-vit-fashion`): batch 1 and 8. Runs alternate between the two sessions, so load spikes hit both;
best and median of the rounds. Also the largest difference of the logits between the two.

    .venv/bin/python -m benchmarks.ort_kernel [--threads 2] [--lengths 1024,4096,16384,32768,65536] [--before REV]

`--before REV` adds a third session: the body on the `model.onnx` that commit REV shipped (read with
`git show`), to measure the graph changes and the kernel together against what users had then.

Writes benchmarks/results/ort_kernel.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.common import environment, markdown_table, shipped_onnx_at, write_json
from lara_serve.kernels import ort_library

ROOT = Path(__file__).resolve().parent.parent
REPO = ROOT / "model_repository"


def session(path: Path, threads: int, fused: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL  # as the server runs it
    if fused and not ort_library.register(options):
        raise SystemExit(f"the fused kernel is unavailable: {ort_library.unavailable_reason()}")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_at(rev: str, model: str, folder: Path) -> Path:
    """The model.onnx that commit `rev` holds for `model`, written into `folder`."""
    path = folder / f"{model}-{rev}.onnx"
    path.write_bytes(shipped_onnx_at(rev, model))
    return path


def feeds_for(task: str, batch: int, tokens: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if task == "image":
        return {"pixel_values": rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)}
    ids = rng.integers(1, 256, size=(batch, tokens)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def alternate(sessions: dict[str, ort.InferenceSession], feeds: dict[str, np.ndarray], budget_s: float) -> dict:
    """At least 5 rounds of every session in turn, more while under budget_s (at most 30)."""
    times: dict[str, list[float]] = {k: [] for k in sessions}
    outs = {k: s.run(None, feeds)[0] for k, s in sessions.items()}  # warm-up, and the outputs to compare
    start = time.perf_counter()
    rounds = 0
    while rounds < 5 or (time.perf_counter() - start < budget_s and rounds < 30):
        for name, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, feeds)
            times[name].append((time.perf_counter() - t0) * 1000)
        rounds += 1
    row: dict[str, Any] = {"rounds": rounds}
    for name, t in times.items():
        row[f"{name}_ms"] = {"best": round(min(t), 2), "median": round(statistics.median(t), 2)}
    for base in ("body", "before"):
        if base in times:
            row[f"fused_over_{base}_best"] = round(min(times["fused"]) / min(times[base]), 3)
            row[f"fused_over_{base}_median"] = round(
                statistics.median(times["fused"]) / statistics.median(times[base]), 3
            )
    row["max_abs_logit_diff"] = max(float(np.abs(outs["body"] - out).max()) for out in outs.values())
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (the server's default: 2 here)")
    p.add_argument("--lengths", default="1024,4096,16384,32768,65536", help="text lengths in tokens (bytes)")
    p.add_argument("--batch8-max", type=int, default=4096, help="also batch 8 at lengths up to this")
    p.add_argument("--budget-s", type=float, default=4.0, help="time per shape beyond the first 5 rounds")
    p.add_argument("--before", metavar="REV", help="also time the body on the model.onnx of this commit")
    p.add_argument("--out", default="ort_kernel.json")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ort-kernel-"))
    rng = np.random.default_rng(0)
    shapes: list[tuple[str, str, int, int]] = []
    for n in (int(x) for x in args.lengths.split(",")):
        shapes += [("text", "lara-text-news-bytes", 1, n)] + (
            [("text", "lara-text-news-bytes", 8, n)] if n <= args.batch8_max else []
        )
    shapes += [("image", "lara-vit-fashion", 1, 196), ("image", "lara-vit-fashion", 8, 196)]
    rows: list[dict[str, Any]] = []
    made: dict[str, dict[str, ort.InferenceSession]] = {}
    for task, model, batch, tokens in shapes:
        if model not in made:
            path = REPO / model / "1" / "model.onnx"
            made[model] = {"body": session(path, args.threads, False), "fused": session(path, args.threads, True)}
            if args.before:
                made[model]["before"] = session(onnx_at(args.before, model, tmp), args.threads, False)
        row = {"model": model, "batch": batch, "tokens": tokens}
        row |= alternate(made[model], feeds_for(task, batch, tokens, rng), args.budget_s)
        rows.append(row)
        print(row, flush=True)
    payload = {
        "benchmark": "onnxruntime: LaraAttention function body vs fused custom-op kernel",
        "threads": args.threads,
        "before": args.before,
        "onnxruntime": ort.__version__,
        "library": str(ort_library.library()),
        "environment": environment(),
        "rows": rows,
    }
    path = write_json(args.out, payload)
    headers = ["model", "batch", "tokens", "body best (ms)", "fused best (ms)", "fused/body best", "fused/body median"]
    table = [
        [r["model"], r["batch"], r["tokens"], r["body_ms"]["best"], r["fused_ms"]["best"], r["fused_over_body_best"],
         r["fused_over_body_median"]]
        for r in rows
    ]  # fmt: skip
    if args.before:
        headers += [f"before ({args.before}) best (ms)", "fused/before best", "fused/before median"]
        for line, r in zip(table, rows, strict=True):
            line += [r["before_ms"]["best"], r["fused_over_before_best"], r["fused_over_before_median"]]
    print(markdown_table(headers, table))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
