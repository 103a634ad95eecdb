"""`lara train --int8`: a frozen word-piece encoder's run served with int8 weights, its serving head refitted on
what the int8 graph reads.

The shipped `lara-text-news` serves int8 encoder weights (pretrained.int8): 24 of its 36 projections quantized
per channel by onnxruntime, the query and key ones kept float, 1.7x faster on CPU for the same answers on the BBC
test split. A `lara train --init lara-text-news` run exports the float graph; with --int8, after the float export
and its parity check against PyTorch:
1. the graph is quantized as the shipped model's is (pretrained.int8.quantize_graph);
2. the holdout and test documents are read through it one at a time, the same word pieces the float head read;
3. the temperature is refitted on the int8 holdout logits and the ood threshold set to pass PASS_RATE of the int8
   holdout scores: the float graph's own rules (head.finalize), on the graph that is served;
4. the test metrics, calibration and ood sections describe the int8 graph; config.json export.quantization says
   what was quantized and how far the int8 graph's test answers are from the float head's.
The float weights stay in 1/model.safetensors (the torch backend reads them, and `lara train --init DIR` starts
from them).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lara_serve.model_export.export.exporter import make_session
from lara_serve.model_export.export.quantize import ensure_temperature, set_initializer
from lara_serve.model_export.head.finalize import PASS_RATE, calibration_section, holdout_temperature
from lara_serve.model_export.models.hub import VERSION
from lara_serve.model_export.models.ood import threshold_at
from lara_serve.model_export.pretrained.int8 import (
    ONNX_FILE,
    TEMPERATURE,
    prob_agreement,
    quantize_graph,
    read_pieces,
)


@dataclasses.dataclass
class Int8Head:
    """What the int8 graph changes in a run's model folder."""

    z_test: Tensor  # the test split's logits before the temperature, as the int8 graph computes them
    temperature: float
    calibration: dict[str, Any]
    ood: dict[str, Any]
    quantization: dict[str, Any]


def session(path: Path, threads: int) -> Any:
    """The session the server would run here: the fused LaraAttention kernel where it is built, else the function
    body (on an int8 graph the two differ by more than on a float one, so read as served)."""
    try:
        return make_session(path, threads=threads, fused=True)
    except RuntimeError:
        return make_session(path, threads=threads)


def read(path: Path, seqs: Sequence[Sequence[int]], threads: int, desc: str, bar: bool) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(served logits [N, C], ood_score [N]) of word-piece sequences, one at a time."""
    items: Any = seqs
    if bar:
        from tqdm import tqdm

        items = tqdm(seqs, desc=desc, unit="doc", dynamic_ncols=True, mininterval=1.0, leave=False)
    logits, ood = read_pieces({"int8": session(path, threads)}, items)["int8"]
    return logits.astype(np.float64), ood


def quantize_run(stage: Path, prep: Any, temperature: float, ood: dict[str, Any], threads: int, bar: bool) -> Int8Head:  # fmt: skip
    """Steps 1-3 of the module docstring on the exported model folder `stage` of a frozen-encoder run (`prep`:
    pretrained_init.Frozen, its holdout and test pieces and the float head's cached logits); `temperature` and
    `ood` are the float head's (the exact temperature the graph divides by, config.json's ood section)."""
    served = stage / VERSION / ONNX_FILE
    with tempfile.TemporaryDirectory(prefix="lara-train-int8-") as tmp:
        notes = quantize_graph(stage, Path(tmp) / "float.onnx")
    ensure_temperature(served)  # a float head kept at T = 1 exports without the division; the int8 one may need it
    z_val, s_val = read(served, prep.seqs["holdout"], threads, "int8 graph, holdout", bar)
    z_test, s_test = read(served, prep.seqs["test"], threads, "int8 graph, test", bar)
    raw_val, raw_test = torch.from_numpy(z_val * temperature), torch.from_numpy(z_test * temperature)
    y_val, y_test = (torch.from_numpy(np.asarray(prep.labels[p])).long() for p in ("holdout", "test"))
    t_new, note = holdout_temperature(raw_val.float(), y_val)
    set_initializer(served, TEMPERATURE, t_new)
    threshold = threshold_at(torch.from_numpy(s_val), PASS_RATE)
    float_test = prep.cached["test"][0].double()
    ood = ood | {
        "threshold": threshold,
        "threshold_float_graph": ood["threshold"],
        "refit": f"int8 graph: threshold passing {PASS_RATE:.0%} of the {len(y_val)} holdout items' int8 scores; "
        "the Mahalanobis statistics are the float features'",
        "test_in_distribution_rate": round(float((s_test <= threshold).mean()), 4),
    }
    quantization = notes | {
        "agreement_with_float_head": {
            "test": prob_agreement(float_test / temperature, raw_test / temperature)
            | {
                "accuracy_float": round(float((float_test.argmax(1) == y_test).double().mean()), 4),
                "accuracy_int8": round(float((raw_test.argmax(1) == y_test).double().mean()), 4),
            },
            "note": "both at the float head's temperature; float: the PyTorch head's logits",
        },
        "float_head_temperature": round(temperature, 4),  # the weights keep it: the torch backend's
        "command": "lara train ... --int8 (lara_serve.model_export.your_data.quantized)",
    }
    calibration = calibration_section(raw_val, y_val, raw_test, y_test, t_new, note)
    calibration["refit"] = "int8 graph: the temperature fitted on its holdout logits"
    return Int8Head(raw_test.float(), t_new, calibration, ood, quantization)


def patch_config(stage: Path, head: Int8Head, metrics: dict[str, Any]) -> None:
    """config.json after the export: the int8 graph's metrics, calibration, ood section and export record."""
    path = stage / "config.json"
    conf = json.loads(path.read_text())
    conf["metrics"] = metrics
    conf["calibration"] = head.calibration
    conf["ood"] = head.ood
    conf.setdefault("export", {})["quantization"] = head.quantization
    conf["export"]["size_bytes"] = (stage / VERSION / ONNX_FILE).stat().st_size
    path.write_text(json.dumps(conf, indent=2) + "\n")
