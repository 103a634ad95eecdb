"""Give `lara-news-minilm`'s attention pool the outlier probe's view of each window (bert_lara.WindowGate).

    python -m lara_serve.model_export.pretrained.window_gate [--model DIR] [--strength 8] [--threads 1]

The served model reads a long text in windows of 510 pieces and pools every window's pieces with one learned
score per piece, so English prose around an article (a documentation page, an essay) still outvotes it: the
robustness suite's documentation prose at 20 KB, 70-75% right. The serving head's outlier probe (models.ood.
OutlierProbe, built by outlier_probe.py) tells English non-news prose from news on a mean vector; asked about
each window's mean, it says which windows are not the article. Steps, from the model folder's own files:
1. the classifier rebuilt with config.json model.window_gate = strength, the probe's weight and bias copied
   into its gate (the probe itself stays in the serving head, unchanged: the ood score reads the mean);
2. saved as shipped (classifier.save_half), then int8.quantize_served: the float graph exported (parity with
   PyTorch), quantized, its temperature and ood threshold refitted on the holdout, the test split scored by form.
Idempotent: a gated model gets the probe's current weights and the new strength.

STRENGTH 8: the best holdout count in research/minilm_window_gate.py (60 articles with 10 / 20 KB of the probe's
selection sources, manual pages and Brown belles-lettres and government documents: 75.0 / 61.7 -> 91.7 / 93.3%),
but it costs long forms whose wrapper fills a window of its own (articles with a table 98.3 -> 94.9%, web pages
96.1 -> 92.2% on the holdout), so the shipped model does not have it yet (docs/pretrained-encoder.md).
Run it again after outlier_probe.py --write: the gate holds a copy of the probe.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import torch

from lara_serve.model_export.models.bert_lara import LaraBertClassifier
from lara_serve.model_export.models.hub import load_config, load_pretrained
from lara_serve.model_export.models.ood import ServingModel
from lara_serve.model_export.pretrained.classifier import save_half

MODEL = Path(__file__).resolve().parents[2] / "model_repository" / "lara-news-minilm"
STRENGTH = 8.0


def gated(serving: ServingModel, strength: float, seed: int = 0) -> ServingModel:
    """The same serving model with its classifier's pool gated by the serving head's outlier probe."""
    if serving.probe is None or serving.probe_scales is None:
        raise ValueError("the model's serving head has no outlier probe (outlier_probe.py --write builds one)")
    base = serving.model
    cfg = dataclasses.replace(base.cfg, window_gate=strength)
    model = LaraBertClassifier(cfg, seed=seed)
    state = {k: v for k, v in base.state_dict().items() if not k.startswith("gate.")}
    state |= {"gate.weight": serving.probe.weight.clone(), "gate.bias": serving.probe.bias.clone()}
    model.load_state_dict(state, strict=True)
    scales = tuple(float(v) for v in serving.probe_scales)
    return ServingModel.wrap(model.eval(), float(serving.temperature), serving.ood, probe=serving.probe,
                             probe_scales=scales)  # type: ignore[arg-type]  # fmt: skip


def install(model_dir: Path = MODEL, strength: float = STRENGTH, threads: int = 1) -> dict[str, Any]:
    """Steps 1-2 of the module docstring; returns int8.quantize_served's summary."""
    from lara_serve.model_export.pretrained.int8 import quantize_served

    conf = load_config(model_dir)
    serving = gated(load_pretrained(model_dir, serving=True), strength, seed=int(conf.get("seed", 0)))
    conf["model"]["window_gate"] = strength
    conf.setdefault("training", {})["window_gate"] = {
        "strength": strength,
        "what": "every piece of window j gets strength x log sigmoid(-g_j) added to its attention-pool score, g_j "
        "the serving head's outlier probe on window j's mean (models.bert_lara.WindowGate)",
        "chosen_on": "holdout articles with 10 / 20 KB of the probe's selection sources (research/minilm_window_gate.py)",
        "command": "python -m lara_serve.model_export.pretrained.window_gate"
        + ("" if model_dir == MODEL else f" --model {model_dir}") + f" --strength {strength:g}",
    }  # fmt: skip
    save_half(serving.model, conf, model_dir, serving)
    return quantize_served(model_dir, threads=threads)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=MODEL, help="a lara-news-minilm model dir (rewritten in place)")
    p.add_argument("--strength", type=float, default=STRENGTH)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    return install(args.model, args.strength, args.threads)


if __name__ == "__main__":
    main()
