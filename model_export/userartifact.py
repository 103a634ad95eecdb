"""The model folder of a `lara train` run: calibration, test metrics, baseline, config.json, ONNX, report.

Written into a staging folder that the caller moves into place once everything here has succeeded.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model_export.config import TextConfig
from model_export.export import export_model_dir
from model_export.hub import make_config_dict, save_pretrained
from model_export.report import accuracy_by_length, classification_metrics, reliability, softmax, write_report
from model_export.userfit import FitState


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The temperature T > 0 minimizing the NLL of softmax(logits / T) (log T by LBFGS, float64)."""
    z, y = torch.from_numpy(logits).double(), torch.from_numpy(labels)
    log_t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(z / log_t.exp(), y)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().exp().clamp(0.05, 20.0))


@torch.no_grad()
def fold_temperature(model: torch.nn.Module, t: float) -> None:
    """logits / T as weights: the head (and a wide path) are linear in the logits, so the served graph is
    calibrated and its argmax unchanged."""
    model.head.weight.div_(t)
    model.head.bias.div_(t)
    if getattr(model, "tfidf", None) is not None:
        model.tfidf.weight.div_(t)


def finish(args: argparse.Namespace, prep: Any, state: FitState, stage: Path) -> dict[str, Any]:
    """Calibrate, evaluate, export and report into `stage`; returns config.json's "metrics"."""
    model = prep.model
    t = fit_temperature(prep.holdout_logits(model).astype(np.float64), prep.holdout_y)
    raw = prep.test_logits(model).astype(np.float64)
    fold_temperature(model, t)
    probs = prep.test_logits(model).astype(np.float64)
    probs = softmax(probs)
    lara = classification_metrics(probs, prep.test_y, prep.names)
    before = softmax(raw)
    calibration = {
        "temperature": round(t, 4),
        "fitted_on": "holdout",
        "folded_into_head": True,
        "ece_before": round(_ece(before, prep.test_y), 4),
        "ece_after": lara["ece"],
        "reliability_uncalibrated": reliability(before, prep.test_y),
        "reliability": reliability(probs, prep.test_y),
    }
    baseline = None
    if not args.no_baseline:
        bprobs, bname, bsecs = prep.baseline(state.train_time_s)
        baseline = {
            "name": bname,
            "fit_time_s": round(bsecs, 1),
            **classification_metrics(bprobs, prep.test_y, prep.names),
        }
    by_length = None
    if prep.data.task == "text":
        lengths = [len(r) for r in prep.test_texts]
        by_length = {"lara": accuracy_by_length(probs, prep.test_y, lengths)}
        if baseline is not None:
            by_length["baseline"] = accuracy_by_length(bprobs, prep.test_y, lengths)
    split = prep.split.record(prep.data, prep.test, seed=args.seed, test_fraction=None if args.test else
                              args.test_fraction, holdout_fraction=args.holdout_fraction)  # fmt: skip
    how = (f"--test {args.test}" if args.test else
           f"stratified {args.test_fraction:g} of the data, seed {args.seed}")  # fmt: skip
    metrics = {
        "test_accuracy": lara["accuracy"],
        "test_macro_f1": lara["macro_f1"],
        "test_ece": lara["ece"],
        "n_test": lara["n"],
        "baseline_accuracy": baseline["accuracy"] if baseline else None,
        "holdout_accuracy": state.history[-1]["holdout_acc"] if state.history else None,
        "train_time_s": round(state.train_time_s, 1),
        "epochs": state.epoch,
        "steps": state.step,
        "history": state.history,
    }
    conf = make_config_dict(
        args.out.name,
        prep.cfg,
        prep.names,
        seed=args.seed,
        data={
            "source": str(prep.data.source),
            "task": prep.data.task,
            "examples": len(prep.data),
            "text_field": args.text_field,
            "label_field": args.label_field,
        },  # fmt: skip
        split={"how": how, "seed": args.seed, "counts": split["counts"], "file": "split.json"},
        training={
            **prep.hp,
            "init": str(prep.init) if prep.init else "none",
            "epochs": args.epochs,
            "time_budget_min": args.time_budget,
            "threads": torch.get_num_threads(),
            "schedule": "warmup+cosine",
            "command": command_line(args),
        },  # fmt: skip
        metrics=metrics,
        calibration={k: v for k, v in calibration.items() if not k.startswith("reliability")},
    )
    save_pretrained(model.eval(), conf, stage)
    max_length = prep.cfg.max_length if isinstance(prep.cfg, TextConfig) else None
    export_model_dir(stage, max_length=max_length)
    (stage / "split.json").write_text(json.dumps(split, indent=2) + "\n")
    report = {
        "name": args.out.name,
        "task": prep.data.task,
        "data": str(prep.data.source),
        "model": prep.hp["arch"],
        "split": {"how": how, **split["counts"]},
        "lara": lara,
        "baseline": baseline,
        "calibration": calibration,
        "accuracy_by_length": by_length,
        "training": {"epochs": state.epoch, "train_time_s": state.train_time_s, "history": state.history},
    }
    write_report(stage, report, prep.names)
    return metrics


def _ece(probs: np.ndarray, labels: np.ndarray) -> float:
    from model_export.report import expected_calibration_error

    return expected_calibration_error(probs, labels)


def command_line(args: argparse.Namespace) -> str:
    """The run as a `lara train` line (recorded in config.json)."""
    words = ["lara", "train", str(args.data)]
    for k, v in vars(args).items():
        if k in ("data", "api_key") or v in (None, False):
            continue
        words.append(f"--{k.replace('_', '-')}")
        if v is not True:
            words.append(str(v))
    return shlex.join(words)
