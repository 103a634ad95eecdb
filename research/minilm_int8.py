"""Does int8 dynamic quantization bring `lara-text-news` within 4x the byte model's cost, and at what accuracy?

    .venv/bin/python -m research.minilm_int8 [--lengths 4096,16384,65536] [--repeats 5] [--threads 1]

Issue 53: the shipped word-piece model costs 5.3x `lara-text-news-bytes` at 64 KB on the CPU
(benchmarks.pretrained_cost). This study, on a copy under runs/minilm_int8/ (model_repository/ is only read):
1. fold: each Cast(float16 initializer -> float32) of the shipped graph becomes a float32 initializer (the
   graph onnxruntime runs after constant folding, checked in 5); onnxruntime's quantizer only sees weights
   that are initializers of the MatMul itself.
2. quantize: onnxruntime.quantization.quantize_dynamic, int8 weights with one scale per tensor ("int8") and
   per output channel ("int8_per_channel"), activations quantized per call (uint8, one scale per tensor),
   on the MatMuls whose weights the export stored in float16: the 36 encoder projections
   (q, k, v, out, MLP in, MLP out in each of 6 layers). The landmark projections, head and ood whitening
   (tiny, fp32 in the file) stay float32, and the LaraAttention nodes and their function body are checked
   byte-equal to the shipped ones.
3. cost: shipped, both int8 graphs and lara-text-news-bytes in one run, alternating document by document (order
   rotated), on benchmarks.pretrained_cost's documents, Runner and sessions (fused kernel, the server's
   preprocessing); per length the median seconds per document and the ratios to the byte model.
4. accuracy: the three minilm graphs on the BBC test split (431 documents) whole and as headlines (the first
   paragraph), through the same Runner; accuracy, agreement of argmax, max |p_int8 - p_shipped|, ood_score
   change and flips of its in-distribution decision; the byte model beside them for reference.
5. cast folding: Cast nodes left in the graph onnxruntime optimises (optimized_model_filepath) at each
   optimisation level, and the level the server's sessions use (server.backends, read off a live backend).
Writes research/results/minilm_int8.json.

It answered its question on the float graph shipped until 2026-12-05; the shipped graph is int8 since
(model_export/pretrained/int8.py, per channel, with its head refitted), so a rerun stops at step 2 with
"no MatMul reads a float16-stored weight".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from benchmarks.pretrained_cost import REPOSITORY, Runner, documents
from lara_serve.model_export.export.quantize import QuantizeError, fold_float16_casts, quantize_file
from lara_serve.server.preprocess import softmax

ROOT = Path(__file__).resolve().parent.parent
MINILM, BYTES = "lara-text-news", "lara-text-news-bytes"
SHIPPED = REPOSITORY / MINILM / "1" / "model.onnx"
WORK = ROOT / "runs" / "minilm_int8"
RESULTS = ROOT / "research" / "results" / "minilm_int8.json"
# The quantized graphs compared with the shipped one: int8 weights with one scale per tensor or per output channel.
INT8 = {"int8": False, "int8_per_channel": True}


def quantize(src: Path, work: Path) -> dict[str, Any]:
    """src -> work/<variant>.onnx for each of INT8 (export.quantize: Casts folded, the custom op checked
    unchanged) and work/fp32.onnx, the folded float graph; what was quantized."""
    work.mkdir(parents=True, exist_ok=True)
    model = onnx.load(src)
    folded = fold_float16_casts(model)
    onnx.save(model, work / "fp32.onnx")
    files = {"shipped": src, "fp32_folded": work / "fp32.onnx"}
    for name, per_channel in INT8.items():
        files[name] = work / f"{name}.onnx"
        try:
            notes = quantize_file(src, files[name], per_channel=per_channel)
        except QuantizeError as exc:
            raise SystemExit(f"{name}: {exc}") from exc
    return {"folded_casts": len(folded), "quantized_matmuls": notes["quantized_matmuls"], "lara_attention_unchanged": True,
            "file_mb": {name: round(path.stat().st_size / 1e6, 1) for name, path in files.items()}}  # fmt: skip


def _casts_after(path: Path, level: str, work: Path) -> dict[str, int]:
    import onnxruntime as ort

    from lara_serve.kernels import ort_library

    opts = ort.SessionOptions()
    if not ort_library.register(opts):
        raise SystemExit(f"the fused LaraAttention kernel is unavailable: {ort_library.unavailable_reason()}")
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    opts.intra_op_num_threads = 1
    opts.optimized_model_filepath = str(work / f"optimized_{level}.onnx")
    ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    graph = onnx.load(opts.optimized_model_filepath).graph
    inits = {i.name: i.data_type for i in graph.initializer}
    casts = [n for n in graph.node if n.op_type == "Cast"]
    return {"cast_nodes": len(casts), "casts_of_initializers": sum(n.input[0] in inits for n in casts),
            "float16_initializers": sum(t == onnx.TensorProto.FLOAT16 for t in inits.values())}  # fmt: skip


def cast_folding(work: Path) -> dict[str, Any]:
    """Does onnxruntime fold the shipped float16 -> float32 Casts, and at the server's level?"""
    from lara_serve.server.backends import create_backend
    from lara_serve.server.repository import read_config

    levels = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
    by_level = {level: _casts_after(SHIPPED, level, work) for level in levels}
    backend = create_backend("onnxruntime", REPOSITORY / MINILM, read_config(REPOSITORY / MINILM), "cpu", num_threads=1)
    server_level = str(backend.session.get_session_options().graph_optimization_level)  # type: ignore[attr-defined]
    backend.close()
    return {"shipped_graph": by_level, "server_session_level": server_level}


def cost(runners: dict[str, Runner], lengths: list[int], repeats: int) -> list[dict[str, Any]]:
    """Median seconds per document of each variant, alternating per document (order rotated each time)."""
    rows = []
    order = list(runners)
    for length in lengths:
        times: dict[str, list[float]] = {name: [] for name in runners}
        tokens: dict[str, list[int]] = {name: [] for name in runners}
        for i, doc in enumerate(documents(length, repeats, seed=length)):
            for name in order[i % len(order) :] + order[: i % len(order)]:
                t, n = runners[name](doc)
                times[name].append(t)
                tokens[name].append(n)
        med = {name: statistics.median(v) for name, v in times.items()}
        row: dict[str, Any] = {"bytes": length}
        row |= {name: {"median_s": round(med[name], 4), "tokens": int(np.median(tokens[name]))} for name in runners}
        row |= {f"ratio_{name}_over_bytes": round(med[name] / med[BYTES], 2) for name in runners if name != BYTES}
        row |= {f"ratio_{name}_over_shipped": round(med[name] / med["shipped"], 2) for name in INT8}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _read_all(runners: dict[str, Runner], texts: list[str]) -> dict[str, dict[str, Any]]:
    """Each variant over every text, alternating per text: probabilities, ood scores and total seconds."""
    probs: dict[str, list[np.ndarray]] = {name: [] for name in runners}
    ood: dict[str, list[float]] = {name: [] for name in runners}
    seconds = dict.fromkeys(runners, 0.0)
    for text in texts:
        for name, run in runners.items():
            start = time.perf_counter()
            out, _ = run.outputs(text.encode())
            seconds[name] += time.perf_counter() - start
            probs[name].append(softmax(out[0])[0])  # the server's softmax: the temperature is in the logits
            ood[name].append(float(out[1][0]) if len(out) > 1 else float("nan"))
    return {name: {"p": np.stack(probs[name]), "ood": np.asarray(ood[name]), "s": seconds[name]} for name in runners}


def compare(got: dict[str, dict[str, Any]], labels: np.ndarray, ood_threshold: float) -> dict[str, Any]:
    """Accuracy of each variant; each int8 graph against shipped: argmax agreement, probability and ood_score
    change (in distribution: score <= the config's threshold)."""
    pred = {name: v["p"].argmax(axis=1) for name, v in got.items()}
    out: dict[str, Any] = {"n": len(labels)}
    out["accuracy"] = {name: round(float((p == labels).mean()), 4) for name, p in pred.items()}
    out["seconds_total"] = {name: round(v["s"], 2) for name, v in got.items()}
    s = got["shipped"]
    inside = {name: got[name]["ood"] <= ood_threshold for name in ("shipped", *INT8)}
    out["in_distribution_rate"] = {name: round(float(v.mean()), 4) for name, v in inside.items()}
    out["vs_shipped"] = {}
    for name in INT8:
        q, flips = got[name], np.flatnonzero(pred[name] != pred["shipped"])
        rel = (q["ood"] - s["ood"]) / np.abs(s["ood"])  # signed: + is further from the training data
        out["vs_shipped"][name] = {
            "agreement": round(float(1 - len(flips) / len(labels)), 4),
            "right_to_wrong": int(((pred["shipped"] == labels) & (pred[name] != labels)).sum()),
            "wrong_to_right": int(((pred["shipped"] != labels) & (pred[name] == labels)).sum()),
            "flipped": [
                {"doc": int(i), "label": int(labels[i]), "shipped": int(pred["shipped"][i]), name: int(pred[name][i])}
                for i in flips
            ],  # fmt: skip
            "max_abs_prob_diff": round(float(np.abs(q["p"] - s["p"]).max()), 5),
            "mean_abs_prob_diff": round(float(np.abs(q["p"] - s["p"]).mean()), 6),
            "ood_max_rel_diff": round(float(np.abs(rel).max()), 5),
            "ood_median_rel_change": round(float(np.median(rel)), 5),
            "ood_share_rising": round(float((rel > 0).mean()), 4),
            "ood_decision_flips": int((inside[name] != inside["shipped"]).sum()),
        }
    return out


def accuracy(runners: dict[str, Runner], limit: int) -> dict[str, Any]:
    from lara_serve.model_export.pretrained.wrappers import paragraphs
    from lara_serve.model_export.training.data import load_news

    docs = load_news("test")[: limit or None]
    labels = np.asarray([d.label for d in docs])
    threshold = float(json.loads((REPOSITORY / MINILM / "config.json").read_text())["ood"]["threshold"])
    forms = {"whole": [d.text for d in docs], "headline": [paragraphs(d.text)[0] for d in docs]}
    result = {}
    for form, texts in forms.items():
        result[form] = compare(_read_all(runners, texts), labels, threshold)
        short = {name: {k: v for k, v in d.items() if k != "flipped"} for name, d in result[form]["vs_shipped"].items()}
        print(
            form,
            json.dumps({k: v for k, v in result[form].items() if k != "vs_shipped"}),
            json.dumps(short),
            flush=True,
        )
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="4096,16384,65536")
    p.add_argument("--repeats", type=int, default=5, help="documents per length (each a different composite)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="first N test documents only (0: all 431)")
    p.add_argument("--work", type=Path, default=WORK, help="where the folded and quantized copies go")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if REPOSITORY.resolve() in args.work.resolve().parents:
        raise SystemExit("--work must not be inside model_repository/")
    started = time.perf_counter()
    result: dict[str, Any] = {"command": " ".join(["python -m research.minilm_int8", *(sys.argv[1:] if argv is None else argv)]),
                              "threads": args.threads, "repeats": args.repeats}  # fmt: skip
    result["quantization"] = quantize(SHIPPED, args.work)
    print(json.dumps(result["quantization"]), flush=True)
    result["cast_folding"] = cast_folding(args.work)
    print(json.dumps(result["cast_folding"]), flush=True)
    runners = {"shipped": Runner(MINILM, args.threads)}
    runners |= {name: Runner(MINILM, args.threads, args.work / f"{name}.onnx") for name in INT8}
    runners[BYTES] = Runner(BYTES, args.threads)
    for run in runners.values():  # warm-up: arenas and kernels
        run(b"warm up " * 64)
    result["cost"] = cost(runners, [int(x) for x in args.lengths.split(",")], args.repeats)
    result["accuracy"] = accuracy(runners, args.limit)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} ({result['wall_s']} s)")
    return result


if __name__ == "__main__":
    main()
