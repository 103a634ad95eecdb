"""The model folder of a `lara train` run: calibration, test metrics, baseline, config.json, ONNX, report.

Written into a staging folder that the caller moves into place once everything here has succeeded.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from lara_serve.model_export.export.exporter import export_model_dir
from lara_serve.model_export.head.finalize import holdout_temperature, serving_sections
from lara_serve.model_export.models.config import TextConfig
from lara_serve.model_export.models.hub import VERSION, WEIGHTS, make_config_dict, save_pretrained
from lara_serve.model_export.models.ood import ServingModel
from lara_serve.model_export.your_data.budget import Phases
from lara_serve.model_export.your_data.fit import FitState
from lara_serve.model_export.your_data.report import (
    accuracy_by_length,
    classification_metrics,
    reliability,
    softmax,
    write_report,
)

SHIPPED = Path(__file__).resolve().parents[2] / "model_repository"


def init_record(init: Path | None) -> str:
    """How config.json names the weights a run started from: "none", a shipped model by its name (an
    absolute path would name this machine's checkout), or the folder as the user gave it."""
    if init is None:
        return "none"
    if init.resolve().parent == SHIPPED:
        return init.name
    return str(init)


def serving_head(model: torch.nn.Module, prep: Any) -> tuple[ServingModel, dict[str, Any], dict[str, Any], Any]:
    """The shipped models' serving head (lara_serve.model_export.head.finalize) for this run: a temperature fitted on the
    holdout, a Mahalanobis out-of-distribution score fitted on training features combined with an input-space
    score fitted on the training inputs (lara_serve.model_export.models.ood_input), with the threshold that passes 95% of the
    holdout. Returns (serving model, calibration section, ood section, test outputs)."""
    val = prep.outputs(model, "holdout")
    temperature, note = holdout_temperature(val[0], val[2])
    train, test = prep.outputs(model, "train"), prep.outputs(model, "test")
    heads = ", documents whole and first 512 / 2,048 bytes" if prep.data.task == "text" else ""
    input_score, scores = None, None
    if prep.input_scores is not None:  # None: the feature score alone
        input_score, s_val, s_test = prep.input_scores()
        scores = (s_val, s_test)
    ood, calibration, ood_section = serving_sections(val, train, test, temperature, heads, note, scores)
    z_test = test[0]
    scales = tuple(ood_section["scales"]) if input_score is not None else None
    serving = ServingModel.wrap(model, temperature, ood, input_score, scales)
    return serving.eval(), calibration, ood_section, z_test


def finish(
    args: argparse.Namespace, prep: Any, state: FitState, stage: Path, phases: Phases | None = None
) -> dict[str, Any]:
    """Fit the serving head, evaluate, export and report into `stage`; returns config.json's "metrics".
    `phases` times each step on the run's clock (lara_serve.model_export.your_data.budget)."""
    phases = phases or Phases(time.perf_counter)
    model = prep.model.eval()
    with phases.phase("serving head"):
        serving, calibration, ood_section, z_test = serving_head(model, prep)
    probs, lara, calibration_report = test_scores(prep, z_test, serving.temperature.item(), calibration)
    baseline = None
    if not args.no_baseline:
        with phases.phase("baseline"):  # text: fitted before training, returned here
            bprobs, bname, bsecs = prep.baseline(state.train_time_s)
        baseline = {
            "name": bname,
            "fit_time_s": round(bsecs, 1),
            **classification_metrics(bprobs, prep.test_y, prep.names),
        }
    by_length = None
    lengths = [len(r) for r in prep.test_texts] if prep.data.task == "text" else []
    if lengths:
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
        "clock": args.clock,  # what train_time_s counts: wall-clock or this process's CPU seconds
        "epochs": epochs_trained(state),
        "steps": state.step,
        "history": state.history,
    }
    if prep.parts is not None:
        metrics["parts"] = prep.parts
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
            "init": init_record(prep.init),
            "epochs": args.epochs,
            "time_budget_min": args.time_budget,
            "clock": args.clock,
            "threads": torch.get_num_threads(),
            "schedule": prep.hp.get("schedule", "warmup+cosine"),
            "command": command_line(args),
        },  # fmt: skip
        metrics=metrics,
        calibration=calibration,
        ood=ood_section,
    )
    conf["outputs"] = [*conf["outputs"], {"name": "ood_score", "datatype": "FP32", "shape": [-1]}]
    if prep.data.task == "text":
        # Training read no document past its first max_length bytes: the server does the same with a longer
        # one unless the request says otherwise (truncate=false: 413), instead of refusing what training read.
        conf["preprocessing"]["truncate"] = "head"
    if getattr(prep, "save", None) is not None:  # a word-piece model (pretrained_init): float16, its tokenizer
        prep.save(model, conf, stage, serving)
    else:
        save_pretrained(model, conf, stage)
        weights = stage / VERSION / WEIGHTS
        tensors = {**load_file(str(weights)), **serving.serving_state()}
        # A new file made by a plain write: mode 0666 less the umask (0644 usually), readable by the container's
        # user, as the shipped models are; safetensors' save_file creates 0600 files.
        weights.unlink()
        weights.write_bytes(save(tensors, metadata={"format": "pt"}))
    max_length = prep.cfg.max_length if isinstance(prep.cfg, TextConfig) else None
    with phases.phase("export"):
        export_model_dir(stage, max_length=max_length)
    if getattr(args, "int8", False):  # a frozen word-piece encoder served with int8 weights: its own head and metrics
        from lara_serve.model_export.your_data import quantized  # onnxruntime's quantizer: only when asked

        with phases.phase("int8"):
            head = quantized.quantize_run(stage, prep, serving.temperature.item(), ood_section,
                                          torch.get_num_threads(), bar=not (args.quiet or args.json_lines))  # fmt: skip
        float_metrics = {"test_accuracy": lara["accuracy"], "test_macro_f1": lara["macro_f1"], "test_ece": lara["ece"]}
        probs, lara, calibration_report = test_scores(prep, head.z_test, head.temperature, head.calibration)
        calibration, ood_section = head.calibration, head.ood
        metrics |= {"test_accuracy": lara["accuracy"], "test_macro_f1": lara["macro_f1"], "test_ece": lara["ece"],
                    "graph": "int8 (export.quantization)", "float_graph": float_metrics}  # fmt: skip
        if by_length is not None:
            by_length["lara"] = accuracy_by_length(probs, prep.test_y, lengths)
        quantized.patch_config(stage, head, metrics)
    if getattr(prep, "after_export", None) is not None:  # a word-piece model: documents past the whole graph
        with phases.phase("export"):
            prep.after_export(stage)  # int8 when the whole graph is (config.json export.quantization)
    (stage / "split.json").write_text(json.dumps(split, indent=2) + "\n")
    report = {
        "name": args.out.name,
        "task": prep.data.task,
        "data": str(prep.data.source),
        "model": prep.hp["arch"],
        "split": {"how": how, **split["counts"]},
        "lara": lara,
        "baseline": baseline,
        "calibration": calibration_report,
        "ood": ood_section,
        "accuracy_by_length": by_length,
        "parts": prep.parts,
        # per test example, in split.json's test order: true and predicted label indices (paired comparisons)
        "predictions": {
            "true": prep.test_y.tolist(),
            "lara": probs.argmax(-1).tolist(),
            "baseline": bprobs.argmax(-1).tolist() if baseline else None,
        },
        "training": {
            "epochs": epochs_trained(state),
            "train_time_s": state.train_time_s,
            "clock": args.clock,
            "history": state.history,
            "recipe": prep.hp.get("recipe_choice"),
            "time_budget_s": None if args.time_budget is None else args.time_budget * 60.0,
            "phases_s": phases.seconds,
        },  # fmt: skip
    }
    with phases.phase("report"):
        write_report(stage, report, prep.names)
    return metrics


def test_scores(prep: Any, z_test: Any, temperature: float, calibration: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:  # fmt: skip
    """(test probabilities, the report's "lara" metrics, its "calibration" with reliability diagrams) of raw test
    logits z_test read at `temperature`."""
    raw = z_test.double().numpy()
    probs = softmax(raw / temperature)
    report = {
        **calibration,
        "reliability_uncalibrated": reliability(softmax(raw), prep.test_y),
        "reliability": reliability(probs, prep.test_y),
    }
    return probs, classification_metrics(probs, prep.test_y, prep.names), report


def epochs_trained(state: FitState) -> int | float:
    """Epochs trained: whole epochs as an int, a budget-cut last epoch by its share (1.3)."""
    exact = state.epochs_exact or float(state.epoch)
    return int(exact) if exact == int(exact) else exact


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
