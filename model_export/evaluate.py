"""Evaluate a model on a split; the last line printed is one JSON object.

    python -m model_export.evaluate --model lara-vit-fashion --split test [--limit N]

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

from model_export.hub import load_config, load_pretrained

EVAL_BATCH = {"fashion": 500, "news": 8}


@torch.inference_mode()
def evaluate_task(model: nn.Module, task: Any, batch_size: int | None = None) -> dict[str, Any]:
    """Accuracy of `model` (switched to eval mode) over all of `task`'s eval batches."""
    from model_export.tasks import ImageTask

    was_training = model.training
    model.eval()
    bs = batch_size or (500 if isinstance(task, ImageTask) else 8)
    n = correct = 0
    t0 = time.perf_counter()
    for inputs, labels in task.eval_batches(bs):
        pred = model(**inputs).argmax(-1)
        correct += int((pred == labels).sum())
        n += len(labels)
    model.train(was_training)
    return {"n": n, "accuracy": correct / max(n, 1), "eval_time_s": round(time.perf_counter() - t0, 2)}


def resolve_model_dir(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if (p / "config.json").is_file():
        return p
    repo = Path(__file__).resolve().parent.parent / "model_repository" / name_or_path
    if (repo / "config.json").is_file():
        return repo
    raise FileNotFoundError(f"no model directory at {p} or {repo} (train it with python -m model_export.train)")


def main(argv: list[str] | None = None) -> None:
    from model_export.config import config_from_dict
    from model_export.tasks import load_task

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--split", default="test", choices=["test", "val", "train"])
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = resolve_model_dir(args.model)
    conf = load_config(model_dir)
    cfg = config_from_dict(conf["model"], conf["attention"])
    dataset = conf.get("data", {}).get("dataset") or ("fashion" if conf["task"] == "image" else "news")
    model = load_pretrained(model_dir)
    task = load_task(dataset, args.split, cfg, limit=args.limit)
    res = evaluate_task(model, task, EVAL_BATCH.get(dataset))
    print(json.dumps({"model": conf["name"], "path": str(model_dir), "split": args.split, "dataset": dataset, **res}))


if __name__ == "__main__":
    main()
