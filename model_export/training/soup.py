"""Average the weights of several runs fine-tuned from one start (a "model soup"), as one model directory.

    python -m lara_serve.model_export.training.soup runs/news-ftF1 runs/news-ftF3 runs/news-ftF4 --out runs/news-soup [--weights 1 1 1]

Fine-tunes that share their starting weights stay in one basin of the loss, so their average is a model
of the same architecture and cost whose errors are less tied to any one run's seed (Wortsman et al.,
"Model soups", ICML 2022). Every ingredient must have the same architecture, attention, labels and
preprocessing; the average is taken in float64 and cast back to each tensor's dtype. The new config.json is
the first ingredient's, with a `training.soup` section naming the ingredients, their weights and their
training commands.

The soup is evaluated on the holdout (`--eval val`, the default); add `test` only for a soup already chosen,
because choosing among soups by their test accuracy would spend the test split.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from lara_serve.model_export.models.hub import VERSION, WEIGHTS, load_config, load_pretrained, save_pretrained

# config.json sections that must agree for an average of weights to mean anything.
SAME_SECTIONS = ("model", "attention", "labels", "preprocessing", "inputs", "outputs")


def average_state_dicts(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float] | None = None
) -> dict[str, torch.Tensor]:
    """Weighted mean of floating tensors (in float64, cast back); other tensors must be equal in every state."""
    if len(states) < 2:
        raise ValueError(f"a soup needs at least 2 ingredients, got {len(states)}")
    w = torch.tensor([1.0] * len(states) if weights is None else list(weights), dtype=torch.float64)
    if len(w) != len(states):
        raise ValueError(f"{len(w)} weights for {len(states)} ingredients")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero, got {w.tolist()}")
    w = w / w.sum()
    keys = list(states[0])
    out: dict[str, torch.Tensor] = {}
    for i, s in enumerate(states[1:], start=1):
        if set(s) != set(keys):
            diff = sorted(set(s) ^ set(keys))[:5]
            raise ValueError(f"ingredient {i} has different tensors from ingredient 0 (e.g. {diff})")
    for k in keys:
        ts = [s[k] for s in states]
        first = ts[0]
        for i, t in enumerate(ts[1:], start=1):
            if t.shape != first.shape or t.dtype != first.dtype:
                raise ValueError(
                    f"{k}: ingredient {i} is {t.dtype} {tuple(t.shape)}, ingredient 0 {first.dtype} {tuple(first.shape)}"
                )
        if first.is_floating_point():
            acc = sum(wi * t.to(torch.float64) for wi, t in zip(w.tolist(), ts, strict=True))
            out[k] = acc.to(first.dtype)
        elif k.endswith("num_batches_tracked"):
            # BatchNorm's step counter: bookkeeping that eval never reads (the layers have a momentum), and
            # runs of different lengths differ in it; the soup keeps the largest.
            out[k] = torch.stack(ts).max(0).values
        else:
            # Other integer tensors (index tables) cannot be averaged; they must already agree.
            if not all(torch.equal(first, t) for t in ts[1:]):
                raise ValueError(f"{k}: non-floating tensor differs between ingredients")
            out[k] = first.clone()
    return out


def make_soup(
    ingredients: Sequence[str | Path],
    out: str | Path,
    weights: Sequence[float] | None = None,
    command: str | None = None,
) -> Path:
    """Write the averaged model of `ingredients` (model directories) to `out`; return `out`."""
    dirs = [Path(d) for d in ingredients]
    confs = [load_config(d) for d in dirs]
    for d, c in zip(dirs[1:], confs[1:], strict=True):
        for section in SAME_SECTIONS:
            if c.get(section) != confs[0].get(section):
                raise ValueError(f"{d} differs from {dirs[0]} in config section {section!r}: not one architecture")
    states = [load_file(str(d / VERSION / WEIGHTS)) for d in dirs]
    averaged = average_state_dicts(states, weights)
    model = load_pretrained(dirs[0])
    model.load_state_dict(averaged, strict=True)
    conf = json.loads(json.dumps(confs[0]))  # a deep copy
    w = [1.0] * len(dirs) if weights is None else [float(x) for x in weights]
    conf["training"] = {
        "soup": {
            "ingredients": [str(d) for d in dirs],
            "weights": [x / sum(w) for x in w],
            "commands": [c.get("training", {}).get("command") for c in confs],
        },
        "command": command,
    }
    # The ingredients' own accuracies describe other weights; the soup's are measured by evaluate_soup.
    conf["metrics"] = {}
    return save_pretrained(model, conf, out)


def evaluate_soup(model_dir: str | Path, splits: Sequence[str]) -> dict[str, Any]:
    """Accuracy of the model in `model_dir` on each split ("val" = holdout, "test"), stored in its config."""
    from lara_serve.model_export.models.config import config_from_dict
    from lara_serve.model_export.training.evaluate import EVAL_BATCH, dataset_of, evaluate_task
    from lara_serve.model_export.training.tasks import load_task

    model_dir = Path(model_dir)
    conf = load_config(model_dir)
    cfg = config_from_dict(conf["model"], conf["attention"])
    dataset = dataset_of(conf)
    model = load_pretrained(model_dir)
    metrics = dict(conf.get("metrics", {}))
    for split in splits:
        res = evaluate_task(model, load_task(dataset, split, cfg), EVAL_BATCH.get(dataset))
        if split == "test":
            metrics.update(test_accuracy=res["accuracy"], n_test=res["n"])
        else:
            metrics.update({f"{split}_accuracy": res["accuracy"], f"n_{split}": res["n"]})
    conf["metrics"] = metrics
    (model_dir / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    return metrics


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ingredients", nargs="+", help="model directories (config.json + 1/model.safetensors)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--weights", nargs="+", type=float, default=None, help="one per ingredient (default: equal)")
    p.add_argument(
        "--eval", nargs="*", default=["val"], choices=["val", "test"], help="splits to score (default: the holdout)"
    )
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    words = ["python", "-m", "lara_serve.model_export.training.soup", *(sys.argv[1:] if argv is None else argv)]
    try:
        out = make_soup(args.ingredients, args.out, args.weights, command=shlex.join(words))
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    metrics = evaluate_soup(out, args.eval) if args.eval else {}
    print(json.dumps({"out": str(out), **metrics}))


if __name__ == "__main__":
    main()
