"""Evaluate a model on a split; the last line printed is one JSON object.

    python -m lara_serve.model_export.training.evaluate --model lara-vit-fashion --split test [--limit N] [--plot confusion.png]

--model is a registered name (loads model_repository/<name>) or a model directory.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lara_serve.model_export.models.hub import load_config, load_pretrained

EVAL_BATCH = {"fashion": 500, "news": 8}


@torch.inference_mode()
def evaluate_task(model: nn.Module, task: Any, batch_size: int | None = None) -> dict[str, Any]:
    """Accuracy of `model` (switched to eval mode) over all of `task`'s eval batches."""
    from lara_serve.model_export.training.tasks import ImageTask

    was_training = model.training
    model.eval()
    bs = batch_size or (500 if isinstance(task, ImageTask) else 8)
    preds, golds = [], []
    t0 = time.perf_counter()
    for inputs, labels in task.eval_batches(bs):
        preds.append(model(**inputs).argmax(-1))
        golds.append(labels)
    model.train(was_training)
    pred, gold = (torch.cat(preds), torch.cat(golds)) if preds else (torch.zeros(0, dtype=torch.long),) * 2
    n = len(gold)
    k = int(max(pred.max().item(), gold.max().item())) + 1 if n else 0
    # confusion[true][predicted]
    confusion = torch.bincount(gold * k + pred, minlength=k * k).reshape(k, k) if n else torch.zeros(0, 0)
    return {
        "n": n,
        "accuracy": int((pred == gold).sum()) / max(n, 1),
        "eval_time_s": round(time.perf_counter() - t0, 2),
        "confusion": confusion.tolist(),
    }


def per_class(confusion: list[list[int]], labels: list[str]) -> dict[str, float]:
    """Recall per class (accuracy on the examples whose true label it is), by label name."""
    return {labels[i]: round(row[i] / max(sum(row), 1), 4) for i, row in enumerate(confusion)}


def top_confusions(confusion: list[list[int]], labels: list[str], n: int = 5) -> list[dict[str, Any]]:
    """The n largest off-diagonal cells: which true class went to which predicted class, how often."""
    cells = [(c, t, p) for t, row in enumerate(confusion) for p, c in enumerate(row) if t != p and c]
    return [{"true": labels[t], "predicted": labels[p], "count": c} for c, t, p in sorted(cells, reverse=True)[:n]]


def plot_confusion(confusion: list[list[int]], labels: list[str], title: str, out: Path) -> None:
    """Row-normalized confusion matrix as a PNG (counts printed in the cells)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = torch.tensor(confusion, dtype=torch.float64)
    rates = counts / counts.sum(1, keepdim=True).clamp_min(1)
    fig, ax = plt.subplots(figsize=(1.0 + 0.62 * len(labels), 0.8 + 0.55 * len(labels)))
    ax.imshow(rates.numpy(), cmap="Blues", vmin=0, vmax=1)
    for t in range(len(labels)):
        for p in range(len(labels)):
            if counts[t, p]:
                ax.text(p, t, int(counts[t, p]), ha="center", va="center", fontsize=7,
                        color="white" if rates[t, p] > 0.5 else "black")  # fmt: skip
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def dataset_of(conf: dict[str, Any]) -> str:
    """The dataset a model directory's config was trained on (older configs name none: by task)."""
    return conf.get("data", {}).get("dataset") or ("fashion" if conf["task"] == "image" else "news")


def resolve_model_dir(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if (p / "config.json").is_file():
        return p
    repo = Path(__file__).resolve().parents[2] / "model_repository" / name_or_path
    if (repo / "config.json").is_file():
        return repo
    raise FileNotFoundError(
        f"no model directory at {p} or {repo} (train it with python -m lara_serve.model_export.training.train)"
    )


def main(argv: list[str] | None = None) -> None:
    from lara_serve.model_export.models.config import config_from_dict
    from lara_serve.model_export.training.tasks import load_task

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--split", default="test", choices=["test", "val", "train"])
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--plot", type=Path, default=None, help="write the confusion matrix as a PNG here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = resolve_model_dir(args.model)
    conf = load_config(model_dir)
    cfg = config_from_dict(conf["model"], conf["attention"])
    dataset = dataset_of(conf)
    model = load_pretrained(model_dir)
    task = load_task(dataset, args.split, cfg, limit=args.limit)
    res = evaluate_task(model, task, EVAL_BATCH.get(dataset))
    labels = conf["labels"]
    res["per_class"] = per_class(res["confusion"], labels)
    res["top_confusions"] = top_confusions(res["confusion"], labels)
    if args.plot:
        title = f"{conf['name']} on {dataset} {args.split} ({res['n']}): {100 * res['accuracy']:.2f}%"
        plot_confusion(res["confusion"], labels, title, args.plot)
    print(json.dumps({"model": conf["name"], "path": str(model_dir), "split": args.split, "dataset": dataset, **res}))


if __name__ == "__main__":
    main()
