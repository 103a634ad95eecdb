"""Serve `lara-text-news` with int8 encoder weights, its temperature and ood threshold refitted on them.

    python -m lara_serve.model_export.pretrained.int8 [--model model_repository/lara-text-news] [--threads 1]

Issue 53's cost target (64 KB at most 4x `lara-text-news-bytes`) is met by int8 weights (research/minilm_int8.py:
2.6x against 5.3-6.2x for the float graph, the BBC test split unchanged whole). Steps, all from the artifact's
own files (idempotent: a quantized model dir is exported to float again first):
1. export the float graph from 1/model.safetensors (exporter.export_model_dir: parity against PyTorch);
2. quantize it (export.quantize: 24 of the 36 encoder projections per channel, the query and key ones kept
   float, FLOAT_PROJECTIONS; LaraAttention untouched) into 1/model.onnx;
3. read the build's holdout items (classifier.with_forms: each holdout document whole, its headline, its lead
   and one long form, 1,048 items; and the holdout side of `topic_sources` where the build used them) and the
   same forms of the test split through both graphs, one at a time
   with the server's preprocessing;
4. refit what the float graph's head was fitted on: the ood threshold passing PASS_RATE of the holdout's int8
   scores (the Mahalanobis statistics stay: they describe the float features, and the threshold absorbs the
   int8 shift: on headlines the score rose by a median 5%); the temperature multiplied by the ratio of the
   temperatures fitted on the same holdout items read by each graph (so the build's own calibration set,
   holdout composites with filler, keeps its say), then by the ratio of the int8 temperature fitted with the
   holdout's other-source items given SHIFT_SHARE of the say to the one fitted on all items alike;
5. config.json: calibration, ood, metrics (test split by form, read by the int8 graph, only to report) and
   export.quantization with the int8 graph's agreement with the float one.
The float weights stay in 1/model.safetensors: the torch backend and `lara train`'s frozen encoder read them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from lara_serve.model_export.export.exporter import export_model_dir, make_session
from lara_serve.model_export.export.quantize import (
    FLOAT_PROJECTIONS,
    matmuls_of,
    quantize_file,
    scalar_initializer,
    set_initializer,
)
from lara_serve.model_export.head.calibration import ECE_BINS, ece_floor, expected_calibration_error, fit_temperature
from lara_serve.model_export.head.finalize import PASS_RATE
from lara_serve.model_export.models.hub import VERSION, load_config
from lara_serve.model_export.models.ood import threshold_at
from lara_serve.model_export.pretrained.classifier import accuracy_by_form, in_holdout, with_forms
from lara_serve.model_export.pretrained.teacher import WordPieces
from lara_serve.model_export.pretrained.topic_sources import topic_items
from lara_serve.model_export.training.data import load_news

MODEL = Path(__file__).resolve().parents[2] / "model_repository" / "lara-text-news"
ONNX_FILE = "model.onnx"
TEMPERATURE = "temperature"  # the serving head's initializer: logits = linear / temperature
# The share of the temperature fit's say that the holdout's other-source items get (issue 53: calibrate against
# shifted data too). Fitted on all items alike, BBC holds 91% of it and the model is underconfident off BBC
# (research/minilm_shift_temperature.py: ECE 7.4% pooled over Debian descriptions and the latest State of the
# Union addresses, mean top probability 0.87-0.89 at 94-97% accuracy); half the say is the plain prior of
# "BBC and everything else alike", not tuned on those sets.
SHIFT_SHARE = 0.5


def balanced_weights(n_bbc: int, n_other: int, share: float = SHIFT_SHARE) -> Tensor:
    """Per-item weights giving the n_other items `share` of the total and the n_bbc items the rest."""
    return torch.cat([torch.full((n_bbc,), (1 - share) / n_bbc), torch.full((n_other,), share / n_other)])


def read_items(paths: dict[str, Path], model_dir: Path, texts: Sequence[str], threads: int, desc: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Each graph's (served logits [N, C], ood_score [N]) on texts, one text at a time: the model folder's
    tokenizer.json, [CLS] + its first max_length - 2 pieces + [SEP], as the server reads it with "head"
    truncation (tests/model_export/test_shipped_minilm checks the server's pieces against this tokenizer)."""
    tok, max_length = WordPieces.from_dir(model_dir), int(load_config(model_dir)["preprocessing"]["max_length"])
    sessions = {name: make_session(path, threads=threads, fused=True) for name, path in paths.items()}
    return read_pieces(sessions, (tok.encode(text, max_length) for text in tqdm(texts, desc=desc, unit="text")))


def read_pieces(sessions: dict[str, Any], seqs: Iterable[Sequence[int]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Each session's (served logits [N, C], ood_score [N]) on word-piece sequences, one at a time (an int8
    graph quantizes activations per call: a row's answer is its own only when it runs alone)."""
    out: dict[str, tuple[list[np.ndarray], list[float]]] = {name: ([], []) for name in sessions}
    for seq in seqs:
        ids = np.asarray([seq], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        for name, session in sessions.items():
            logits, ood = session.run(None, feed)
            out[name][0].append(logits[0])
            out[name][1].append(float(ood[0]))
    return {name: (np.stack(z), np.asarray(s)) for name, (z, s) in out.items()}


def prob_agreement(ref: np.ndarray | Tensor, got: np.ndarray | Tensor) -> dict[str, Any]:
    """How far one graph's class probabilities are from another's on the same items (logits [N, C] each)."""
    p_ref, p_got = (torch.softmax(torch.as_tensor(z).double(), -1).numpy() for z in (ref, got))
    return {
        "n": len(p_ref),
        "argmax_agreement": round(float((p_ref.argmax(1) == p_got.argmax(1)).mean()), 4),
        "max_abs_prob_diff": round(float(np.abs(p_got - p_ref).max()), 4),
        "mean_abs_prob_diff": round(float(np.abs(p_got - p_ref).mean()), 5),
    }


def agreement(ref: tuple[np.ndarray, np.ndarray], got: tuple[np.ndarray, np.ndarray], thresholds: tuple[float, float]) -> dict[str, Any]:  # fmt: skip
    """How far the int8 graph's answers are from the float graph's on the same items."""
    rel = (got[1] - ref[1]) / np.abs(ref[1])
    return prob_agreement(ref[0], got[0]) | {
        "ood_median_rel_change": round(float(np.median(rel)), 4),
        "in_distribution_decision_agreement": round(
            float(((ref[1] <= thresholds[0]) == (got[1] <= thresholds[1])).mean()), 4
        ),
    }


def ece(z: np.ndarray, y: np.ndarray) -> float:
    probs = torch.softmax(torch.from_numpy(z).double(), -1)
    return round(expected_calibration_error(probs, torch.from_numpy(y), ECE_BINS), 4)


def quantize_graph(model_dir: Path, float_copy: Path) -> dict[str, Any]:
    """Step 2: the model folder's float graph (1/model.onnx, as exported) copied to float_copy and quantized
    into 1/model.onnx in place, the query and key projections kept float; what was done, for config.json."""
    served = model_dir / VERSION / ONNX_FILE
    shutil.copyfile(served, float_copy)
    skip = matmuls_of(float_copy, model_dir / VERSION / "model.safetensors", FLOAT_PROJECTIONS)
    notes = quantize_file(float_copy, served, skip=skip)
    return notes | {"float_projections": f"{', '.join(FLOAT_PROJECTIONS)} of every layer (FLOAT_PROJECTIONS)"}


def quantize_served(model_dir: Path = MODEL, threads: int = 1, limit: int = 0, seed: int = 0) -> dict[str, Any]:
    """Steps 1-5 of the module docstring; limit > 0 reads that many documents of each split (smoke runs)."""
    t0 = time.perf_counter()
    export_model_dir(model_dir)  # the float graph, from the weights (also undoes an earlier quantization)
    served = model_dir / VERSION / ONNX_FILE
    with tempfile.TemporaryDirectory(prefix="lara-int8-") as tmp:
        float_path = Path(tmp) / "float.onnx"
        notes = quantize_graph(model_dir, float_path)
        paths = {"float": float_path, "int8": served}
        t_old = scalar_initializer(float_path, TEMPERATURE)  # the float head's, from the weights (not config.json)
        train = load_news("train")
        val_docs, test_docs = [d for d in train if in_holdout(d.text)], load_news("test")
        if limit:
            val_docs, test_docs = val_docs[:limit], test_docs[:limit]
        val_t, val_y, val_f = with_forms([d.text for d in val_docs], [d.label for d in val_docs], seed + 1)
        n_bbc = len(val_t)  # BBC items first, then the other sources' (topic_items)
        if load_config(model_dir).get("training", {}).get("topic_sources"):  # the build's holdout had them too
            extra = [i for i in topic_items(seed) if in_holdout(i.key)][: limit or None]
            val_t, val_y, val_f = val_t + [i.text for i in extra], val_y + [i.label for i in extra], val_f + [i.source for i in extra]  # fmt: skip
        test_t, test_y, test_f = with_forms([d.text for d in test_docs], [d.label for d in test_docs], seed + 2)
        val = read_items(paths, model_dir, val_t, threads, "holdout")
        test = read_items(paths, model_dir, test_t, threads, "test")
    conf = load_config(model_dir)
    y_val, y_test = np.asarray(val_y), np.asarray(test_y)
    raw_val = {name: z * t_old for name, (z, _) in val.items()}  # the linear head's logits, before temperature
    fitted = {
        name: fit_temperature(torch.from_numpy(z).float(), torch.from_numpy(y_val)) for name, z in raw_val.items()
    }
    t_new = t_old * fitted["int8"] / fitted["float"]
    n_other = len(y_val) - n_bbc
    shift = 1.0
    if n_other:  # other sources in the holdout: give them half the say (balanced_weights)
        z8 = torch.from_numpy(raw_val["int8"])
        shift = fit_temperature(z8, torch.from_numpy(y_val), balanced_weights(n_bbc, n_other)) / fitted["int8"]
        t_new *= shift
    set_initializer(served, TEMPERATURE, t_new)
    threshold_float = float(conf["ood"].get("threshold_float_graph", conf["ood"]["threshold"]))
    threshold = threshold_at(torch.from_numpy(val["int8"][1]), PASS_RATE)
    z_val, z_test = val["int8"][0] * t_old, test["int8"][0] * t_old  # int8 raw logits
    conf["calibration"] |= {
        "temperature": round(t_new, 4),
        # the float weights keep t_old (the torch backend reads them): the same other-source say, without the
        # int8 ratio, is what their logits take (server.repository.ModelConfig.float_graph_temperature)
        "temperature_float_graph": round(t_old * shift, 4),
        "refit": f"int8 graph: temperature x {fitted['int8'] / fitted['float']:.4f}, the ratio of the temperatures "
        f"fitted on the same {len(y_val)} holdout items read by the int8 and the float graph"
        + (
            f"; then x {shift:.4f}, the ratio of the int8 temperature fitted with the {n_other} other-source items "
            f"weighted as much as the {n_bbc} BBC items together to the one fitted on all alike (SHIFT_SHARE)"
            if n_other
            else ""
        ),
        "ece": {
            "holdout_before": ece(z_val, y_val),
            "holdout_after": ece(z_val / t_new, y_val),
            "test_before": ece(z_test, y_test),
            "test_after": ece(z_test / t_new, y_test),
        },
        "n_test": len(y_test),
        "ece_floor_test": ece_floor(
            torch.softmax(torch.from_numpy(z_test / t_new).double(), -1).max(-1).values.numpy()
        ),
    }
    conf["ood"] |= {
        "threshold": threshold,
        "threshold_float_graph": threshold_float,
        "refit": f"int8 graph: threshold passing {PASS_RATE:.0%} of the {len(y_val)} holdout items' int8 scores; "
        "the Mahalanobis statistics are the float features'",
        "test_in_distribution_rate": round(float((test["int8"][1] <= threshold).mean()), 4),
    }
    by_form = accuracy_by_form(torch.from_numpy(z_test), torch.from_numpy(y_test), test_f)
    metrics = conf["metrics"]
    metrics.setdefault("float_graph", {"test_accuracy": metrics["test_accuracy"], "test": metrics["test"]})
    metrics |= {"test_accuracy": by_form["whole"]["accuracy"], "test": by_form,
                "graph": "int8 (export.quantization); float_graph: the same weights unquantized"}  # fmt: skip
    metrics["holdout"] |= accuracy_by_form(torch.from_numpy(z_val), torch.from_numpy(y_val), val_f)
    conf["export"]["quantization"] = notes | {
        "agreement_with_float": {
            "holdout": agreement(val["float"], val["int8"], (threshold_float, threshold)),
            "test": agreement(test["float"], test["int8"], (threshold_float, threshold)),
        },
        "command": "python -m lara_serve.model_export.pretrained.int8" + (f" --limit {limit}" if limit else ""),
    }
    conf["export"]["size_bytes"] = served.stat().st_size
    (model_dir / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    refresh_sliced_program(model_dir)
    summary = {"seconds": round(time.perf_counter() - t0, 1), "temperature": [t_old, t_new],
               "threshold": [threshold_float, threshold], "test": by_form, "quantization": conf["export"]["quantization"]}  # fmt: skip
    print(json.dumps(summary, indent=2))
    return summary


def refresh_sliced_program(model_dir: Path) -> bool:
    """Re-export `1/sliced/` when the folder exists (int8 when config.json export.quantization says the graph is):
    the server refuses a program exported for another model.onnx, and would then read documents past the whole
    graph on the whole graph. Returns whether there was one."""
    if not (model_dir / VERSION / "sliced").is_dir():
        return False
    from lara_serve.model_export.export.sliced_windows import export_windows_dir

    max_length = int(load_config(model_dir)["preprocessing"]["max_length"])
    export_windows_dir(model_dir, max_length=max_length)
    return True


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=MODEL, help="a lara-text-news model dir (rewritten in place)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="documents per split (smoke runs; 0: all)")
    args = p.parse_args(argv)
    return quantize_served(args.model, args.threads, args.limit)


if __name__ == "__main__":
    main()
