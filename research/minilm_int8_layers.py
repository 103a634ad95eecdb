"""Which encoder projections can be int8 without moving `lara-text-news`'s answers? (issue 53)

    .venv/bin/python -m research.minilm_int8_layers --float runs/int8-study/float.onnx [--threads 1]

The served int8 graph (all 36 projections, per channel) agreed with the float graph on 97.7% of the test
forms and lost 1.9 points on headlines. This study quantizes subsets of the 36 MatMuls of a float export
(each layer's q, k, v, attention out, MLP up, MLP down, in graph order) and reads the build's holdout items
only (each holdout document whole, its headline and its lead: classifier.with_forms), so that the subset
the product keeps is chosen without the test split; it also times three 16 KB composites per graph.
Writes research/results/minilm_int8_layers.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from benchmarks.pretrained_cost import documents
from lara_serve.model_export.export.exporter import make_session
from lara_serve.model_export.export.quantize import quantize_file
from lara_serve.model_export.pretrained.classifier import in_holdout, with_forms
from lara_serve.model_export.pretrained.int8 import MODEL
from lara_serve.model_export.training.data import load_news
from lara_serve.server.preprocess import IDS, text_item
from lara_serve.server.repository import read_config

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "research" / "results" / "minilm_int8_layers.json"
ROLES = ("q", "k", "v", "out", "up", "down")  # the order of a layer's six projections in the exported graph


def projections(path: Path) -> list[str]:
    """The 36 float16-stored MatMuls in graph order (6 layers x ROLES)."""
    model = onnx.load(path)
    casts = {n.output[0] for n in model.graph.node if n.op_type == "Cast"}
    names = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in casts]
    if len(names) != 6 * len(ROLES):
        raise SystemExit(f"{path}: expected 36 float16-stored MatMuls, found {len(names)}")
    return names


def variants(names: list[str]) -> dict[str, list[str]]:
    """Variant -> the MatMuls left in float."""
    role = {name: ROLES[i % 6] for i, name in enumerate(names)}
    layer = {name: i // 6 for i, name in enumerate(names)}
    return {
        "all": [],
        "no_down": [n for n in names if role[n] == "down"],
        "no_qk": [n for n in names if role[n] in ("q", "k")],
        "no_first_last_layer": [n for n in names if layer[n] in (0, 5)],
        "mlp_only": [n for n in names if role[n] not in ("up", "down")],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--float", dest="float_graph", type=Path, required=True, help="a float export of the model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    work = args.float_graph.parent
    names = projections(args.float_graph)
    paths = {"float": args.float_graph}
    for name, skip in variants(names).items():
        paths[name] = work / f"int8_{name}.onnx"
        quantize_file(args.float_graph, paths[name], skip=skip)
    sessions = {name: make_session(path, threads=args.threads, fused=True) for name, path in paths.items()}
    prep = read_config(MODEL).preprocessing
    docs = [d for d in load_news("train") if in_holdout(d.text)]
    texts, ys, forms = with_forms([d.text for d in docs], [d.label for d in docs], 1)
    keep = [i for i, f in enumerate(forms) if f in ("whole", "headline", "lead")]
    probs: dict[str, list[np.ndarray]] = {name: [] for name in paths}
    for i in keep:
        ids = text_item(texts[i].encode(), prep, "head").arrays[IDS][None]
        for name, session in sessions.items():
            logits = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
            probs[name].append(torch.softmax(torch.from_numpy(logits[0]).double(), -1).numpy())
    y = np.asarray([ys[i] for i in keep])
    form = np.asarray([forms[i] for i in keep])
    ref = np.stack(probs["float"])
    rows: dict[str, Any] = {}
    for name in paths:
        p_ = np.stack(probs[name])
        rows[name] = {
            "float_matmuls": 0 if name == "float" else len(variants(names)[name]),
            "accuracy": {f: round(float((p_[form == f].argmax(1) == y[form == f]).mean()), 4) for f in dict.fromkeys(form)},
            "agreement": {f: round(float((p_[form == f].argmax(1) == ref[form == f].argmax(1)).mean()), 4) for f in dict.fromkeys(form)},
            "max_abs_prob_diff": round(float(np.abs(p_ - ref).max()), 4),
            "mean_abs_prob_diff": round(float(np.abs(p_ - ref).mean()), 5),
            "size_mb": round(paths[name].stat().st_size / 1e6, 1),
        }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in paths}
    for j, doc in enumerate(documents(16384, 3, seed=16384)):
        ids = text_item(doc.decode("utf-8", "ignore").encode(), prep, "head").arrays[IDS][None]
        order = list(paths)[j % len(paths) :] + list(paths)[: j % len(paths)]
        for name in order:
            start = time.perf_counter()
            sessions[name].run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
            times[name].append(time.perf_counter() - start)
    for name in paths:
        rows[name]["median_s_16kb"] = round(statistics.median(times[name]), 3)
        rows[name]["time_over_float"] = round(statistics.median(times[name]) / statistics.median(times["float"]), 2)
        print(name, json.dumps(rows[name]), flush=True)
    result = {
        "command": "python -m research.minilm_int8_layers --float " + str(args.float_graph),
        "n_holdout_docs": len(docs),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
