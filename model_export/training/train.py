"""Train a registered model: seeded, resumable (checkpoint each epoch), eval each epoch, ship artifact.

python -m lara_serve.model_export.training.train --model lara-vit-fashion --epochs 8 --out model_repository/lara-vit-fashion

This module holds the run itself: the optimizer and its warmup + cosine schedule, the epoch loop with its
checkpoints and resume, and the artifact at the end. Its flags and recorded command line live in
`train_args`, the per-dataset settings in `defaults`, what the optional flags add in `train_extras`; their
public names are imported here too, where callers have always found them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm

from lara_serve.model_export.models.hub import LIGHT_ON_BLACK, make_config_dict, save_pretrained
from lara_serve.model_export.models.layers import Attention, layer_seed
from lara_serve.model_export.models.registry import DATASETS, LABELS, build_model, get_config
from lara_serve.model_export.training.defaults import DATA_DESCRIPTION as DATA_DESCRIPTION
from lara_serve.model_export.training.defaults import DEFAULTS as DEFAULTS
from lara_serve.model_export.training.defaults import LENGTH_EVAL as LENGTH_EVAL
from lara_serve.model_export.training.defaults import LENGTH_MIX as LENGTH_MIX
from lara_serve.model_export.training.defaults import TEACHER_PARTS as TEACHER_PARTS
from lara_serve.model_export.training.distill import soft_cross_entropy
from lara_serve.model_export.training.evaluate import evaluate_task
from lara_serve.model_export.training.tasks import document_ids, load_task
from lara_serve.model_export.training.train_args import command_line as command_line
from lara_serve.model_export.training.train_args import parse_args as parse_args

# The run's helpers under the private names they have always had here (tests reach some of them by these).
from lara_serve.model_export.training.train_args import splits as _splits
from lara_serve.model_export.training.train_extras import distill_settings as _distill_settings
from lara_serve.model_export.training.train_extras import image_photometric as _image_photometric
from lara_serve.model_export.training.train_extras import init_from as _init_from
from lara_serve.model_export.training.train_extras import length_eval as _length_eval
from lara_serve.model_export.training.train_extras import photometric_eval as _photometric_eval
from lara_serve.model_export.training.train_extras import text_augment as _text_augment


def warmup_cosine(frac: float, warmup: float) -> float:
    """LR factor at training progress frac in [0, 1]: linear warmup, then cosine to zero."""
    if frac < warmup:
        return max(frac / warmup, 0.01)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (frac - warmup) / (1.0 - warmup))))


def reseed_noise(model: nn.Module, seed: int, epoch: int) -> None:
    """Each epoch's training noise stream depends only on (seed, layer, epoch): resume replays it."""
    for i, m in enumerate(x for x in model.modules() if isinstance(x, Attention)):
        m.reseed(layer_seed(seed, i, f"train-epoch{epoch}"))


def _save_ckpt(ckpt: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: Any, state: dict) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt / "model.safetensors"))
    # Optimizer state is pickled ONLY here, in the resume checkpoint outside the repository. The global
    # RNG (dropout, drop-path) goes with it, so a resumed run draws what the uninterrupted run would have.
    torch.save(
        {"opt": opt.state_dict(), "sched": sched.state_dict(), "torch_rng": torch.get_rng_state()}, ckpt / "optim.pt"
    )
    (ckpt / "state.json").write_text(json.dumps(state, indent=2))


@dataclasses.dataclass
class _Run:
    """One run's pieces, built from its arguments before the first step."""

    args: argparse.Namespace
    dataset: str
    hp: dict[str, Any]  # batch_size, lr, weight_decay, label_smoothing, epochs
    cfg: Any
    model: nn.Module
    out: Path  # the artifact directory
    ckpt: Path  # the resume checkpoint
    mix: dict[str, Any] | None  # --length-mix's window settings
    splits: tuple[str, str, str]  # (train, per-epoch validation, test) split names
    train_task: Any
    val_task: Any
    extras: dict[str, Any]  # what the optional flags add, as config.json records it (train_extras)


@dataclasses.dataclass(frozen=True)
class _Limits:
    """Where training stops: a number of steps, or with --time-budget seconds of training time on the clock."""

    steps_epoch: int
    total: int  # steps
    deadline: float | None  # seconds
    clock: Callable[[], float]

    def progress(self, step: int, elapsed: float) -> float:
        # The schedule runs on progress in [0, 1]: steps done / total, or with --time-budget the fraction of
        # the training-time budget spent (so warmup+cosine completes whatever the machine's load).
        return elapsed / self.deadline if self.deadline is not None else step / self.total

    def reached(self, step: int, elapsed: float) -> bool:
        return step >= self.total or (self.deadline is not None and elapsed >= self.deadline)


def _prepare(args: argparse.Namespace) -> _Run:
    """The model (seeded, optionally initialised from another) and the tasks, with the flags' additions."""
    if args.threads:
        torch.set_num_threads(args.threads)
    dataset = DATASETS[args.model]
    hp = {**DEFAULTS[dataset]}
    for k in ("batch_size", "lr", "epochs", "label_smoothing"):
        if getattr(args, k) is not None:
            hp[k] = getattr(args, k)
    overrides = json.loads(args.override)
    if args.attention:
        overrides["attention"] = args.attention
    cfg = get_config(args.model, **overrides)
    torch.manual_seed(args.seed)
    model = build_model(cfg, seed=args.seed)
    if args.init_from:
        _init_from(model, Path(args.init_from))
    out = Path(args.out or f"runs/{args.model}-{cfg.attention.kind}")
    ckpt = Path(args.run_dir or f"runs/ckpt/{out.name}")

    mix = {**LENGTH_MIX[dataset], **json.loads(args.length_mix)} if args.length_mix is not None else None
    names = _splits(args)
    train_task = load_task(dataset, names[0], cfg, train_length=args.train_length, limit=args.limit, length_mix=mix)
    extras = _add_extras(args, train_task, model)
    val_task = load_task(dataset, names[1], cfg, limit=args.eval_limit)
    return _Run(args, dataset, hp, cfg, model, out, ckpt, mix, names, train_task, val_task, extras)


def _add_extras(args: argparse.Namespace, train_task: Any, model: nn.Module) -> dict[str, Any]:
    """The augmentation flags onto the training task, the --distill teacher, the wide path's idf; returns
    the records of the optional parts (photometric, text_augment, distill)."""
    if args.no_augment and hasattr(train_task, "augment"):
        train_task.augment = False
    for flag, attr in (("image_shift", "shift"), ("image_rotate", "rotate_deg")):
        if getattr(args, flag) is not None:
            if not hasattr(train_task, attr):
                raise SystemExit(f"--{flag.replace('_', '-')} is for image models")
            setattr(train_task, attr, getattr(args, flag))
    extras = {
        "photometric": _image_photometric(args, train_task),
        "text_augment": _text_augment(args, train_task),
        "distill": _distill_settings(args, train_task, len(LABELS[args.model])),
    }
    if getattr(model, "tfidf", None) is not None:  # the wide path's idf: from whole training documents only
        model.tfidf.fit_idf(document_ids(train_task))
    return extras


def _optimizer(model: nn.Module, hp: dict[str, Any], pool_lr_mult: float) -> torch.optim.Optimizer:
    """AdamW: weight decay on matrices only; the attention pooling's scores in a group of their own lr."""
    decay, no_decay, pool = [], [], []
    for n_, p_ in model.named_parameters():
        if pool_lr_mult != 1.0 and n_.startswith("pool."):
            pool.append(p_)
        else:
            (no_decay if p_.ndim <= 1 or "pos_embed" in n_ else decay).append(p_)
    groups = [{"params": decay, "weight_decay": hp["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    if pool:
        # The pooling scores start near zero, where softmax pooling over thousands of tokens is a mean and
        # its gradient is a tiny covariance: at the base lr they stay uniform through a whole fine-tune
        # (score std 0.04 after 40 CPU-min, measured). Their own lr lets the readout become selective.
        groups.append({"params": pool, "weight_decay": 0.0, "lr_mult": pool_lr_mult})
    return torch.optim.AdamW(groups, lr=hp["lr"])


def _resume(ckpt: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: Any) -> dict[str, Any]:
    """Weights, optimizer, schedule and RNG from the checkpoint; returns the run's state as it was saved."""
    model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
    o = torch.load(ckpt / "optim.pt", weights_only=True)
    opt.load_state_dict(o["opt"])
    sched.load_state_dict(o["sched"])
    if "torch_rng" in o:  # checkpoints written before it was saved resume statistically, not bitwise
        torch.set_rng_state(o["torch_rng"])
    state = json.loads((ckpt / "state.json").read_text())
    print(f"resumed from {ckpt} at epoch {state['epoch']}", flush=True)
    return state


def _train_epoch(
    run: _Run, opt: torch.optim.Optimizer, sched: Any, limits: _Limits, state: dict[str, Any], epoch: int
) -> tuple[int, int, float]:
    """One epoch's steps, cut short at the limits; advances state's step and training time. Returns the
    examples seen, those answered right and their summed loss."""
    args, hp, model = run.args, run.hp, run.model
    loss_fn = nn.CrossEntropyLoss(label_smoothing=hp["label_smoothing"])
    model.train()
    reseed_noise(model, args.seed, epoch)
    g = torch.Generator().manual_seed(args.seed * 1000 + epoch)
    t0, seen, correct, loss_sum = limits.clock(), 0, 0, 0.0
    batches = run.train_task.train_batches(hp["batch_size"], g)
    bar = tqdm(batches, total=limits.steps_epoch, desc=f"epoch {epoch + 1}", mininterval=10.0)
    for inputs, labels, *teacher in bar:
        frac = limits.progress(state["step"], state["train_time_s"] + limits.clock() - t0)
        for group in opt.param_groups:
            group["lr"] = hp["lr"] * group.get("lr_mult", 1.0) * warmup_cosine(frac, 0.05)
        logits = model(**inputs)
        loss = loss_fn(logits, labels)
        if teacher:
            loss = (1.0 - args.distill) * loss + args.distill * soft_cross_entropy(logits, teacher[0])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        state["step"] += 1
        seen += len(labels)
        correct += int((logits.argmax(-1) == labels).sum())
        loss_sum += loss.item() * len(labels)
        el = limits.clock() - t0
        bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{correct / seen:.3f}", ex_s=f"{seen / el:.1f}")
        if limits.reached(state["step"], state["train_time_s"] + el):
            break
    state["train_time_s"] += limits.clock() - t0
    return seen, correct, loss_sum


def _run_epochs(run: _Run, opt: torch.optim.Optimizer, sched: Any, limits: _Limits, state: dict[str, Any]) -> None:
    """Epochs from state's until the limits; after each one the holdout scores and a checkpoint."""
    for epoch in range(state["epoch"], run.hp["epochs"]):
        if limits.reached(state["step"], state["train_time_s"]):
            break
        seen, correct, loss_sum = _train_epoch(run, opt, sched, limits, state, epoch)
        val = evaluate_task(run.model, run.val_task)
        state["epoch"] = epoch + 1
        state["history"].append(
            {
                "epoch": epoch + 1,
                "train_loss": loss_sum / max(seen, 1),
                "train_acc": correct / max(seen, 1),
                "val_acc": val["accuracy"],
                "train_time_s": state["train_time_s"],
                **_length_eval(run.model, run.dataset, run.args),
                **_photometric_eval(run.model, run.val_task, run.extras["photometric"]),
            }
        )
        print(json.dumps(state["history"][-1]), flush=True)
        _save_ckpt(run.ckpt, run.model, opt, sched, state)


def _training_record(run: _Run) -> dict[str, Any]:
    """config.json's "training": how the run was made, with the command line that repeats it."""
    args, dataset = run.args, run.dataset
    image_augment = dataset == "fashion" and not args.no_augment
    return {
        **run.hp,
        "train_length": args.train_length if dataset != "fashion" and not args.length_mix else None,
        "length_mix": run.mix,
        "distill": run.extras["distill"],
        "text_augment": run.extras["text_augment"],
        "train_split": run.splits[0],
        "limit": args.limit,
        "time_budget_min": args.time_budget,
        "clock": args.clock,
        "augment": image_augment,
        "image_augment": {
            "shift": run.train_task.shift,
            "rotate_deg": run.train_task.rotate_deg,
            "photometric": run.extras["photometric"],
        }
        if image_augment
        else None,
        "threads": torch.get_num_threads(),
        "schedule": "warmup+cosine",
        "pool_lr_mult": args.pool_lr_mult,
        "command": command_line(args),
    }


def _write_artifact(run: _Run, state: dict[str, Any], steps_epoch: int) -> dict[str, Any]:
    """Score the test split (unless --no-test), write config.json and the weights; returns the metrics."""
    args = run.args
    metrics: dict[str, Any] = {
        "train_time_s": round(state["train_time_s"], 1),
        "epochs": state["epoch"],
        "steps": state["step"],
        "epochs_done": round(state["step"] / steps_epoch, 2),  # fractional: a time budget ends mid-epoch
        "val_accuracy": state["history"][-1]["val_acc"] if state["history"] else None,
        "history": state["history"],  # per epoch: loss, accuracy, holdout accuracy at several lengths
    }
    if not args.no_test:
        test = evaluate_task(run.model, load_task(run.dataset, run.splits[2], run.cfg, limit=args.eval_limit))
        metrics.update(test_accuracy=test["accuracy"], n_test=test["n"])
    conf = make_config_dict(
        run.out.name,
        run.cfg,
        LABELS[args.model],
        # Fashion-MNIST's convention, kept on retraining
        preparation=LIGHT_ON_BLACK if run.dataset == "fashion" else None,
        seed=args.seed,
        data={"dataset": run.dataset, "split": DATA_DESCRIPTION[run.dataset]},
        training=_training_record(run),
        metrics=metrics,
    )
    save_pretrained(run.model.eval(), conf, run.out)
    print(json.dumps({"out": str(run.out), **metrics}), flush=True)
    return metrics


def train(args: argparse.Namespace) -> dict[str, Any]:
    """One run as its arguments say (parse_args): trains, checkpoints each epoch, writes the artifact;
    returns the metrics config.json records."""
    run = _prepare(args)
    steps_epoch = run.train_task.steps_per_epoch(run.hp["batch_size"])
    total = steps_epoch * run.hp["epochs"]
    limits = _Limits(
        steps_epoch,
        total if args.max_steps is None else min(args.max_steps, total),
        None if args.time_budget is None else args.time_budget * 60.0,
        time.process_time if args.clock == "cpu" else time.perf_counter,
    )
    opt = _optimizer(run.model, run.hp, args.pool_lr_mult)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)  # lr set per step (_train_epoch)
    state: dict[str, Any] = {"epoch": 0, "step": 0, "train_time_s": 0.0, "history": []}
    if args.resume and (run.ckpt / "state.json").is_file():
        state = _resume(run.ckpt, run.model, opt, sched)
    _run_epochs(run, opt, sched, limits, state)
    return _write_artifact(run, state, steps_epoch)


def main(argv: list[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
