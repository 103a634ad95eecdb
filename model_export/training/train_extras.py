"""What train's optional flags add to a run, one function each: weights to start from (--init-from), the
cross-fitted teacher (--distill), text and image augmentation (--augment-text, --image-photometric), and
the extra holdout scores recorded per epoch (--length-mix lengths, photometric corruptions). Each checks
that its flag fits the model, and returns what config.json records of it.

May import `models` and the `training` modules below `train`; `train` imports it, never the reverse.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from torch import nn

from lara_serve.model_export.training.defaults import LENGTH_EVAL, TEACHER_PARTS
from lara_serve.model_export.training.distill import HEAD_FIT, fit_teacher
from lara_serve.model_export.training.evaluate import evaluate_task
from lara_serve.model_export.training.long_docs import LengthMixTask
from lara_serve.model_export.training.train_args import splits


def init_from(model: nn.Module, model_dir: Path) -> None:
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


def length_eval(model: nn.Module, dataset: str, args: argparse.Namespace) -> dict[str, Any]:
    """Holdout accuracy at several lengths (truncations, composites), for --length-mix runs."""
    if args.length_mix is None or dataset not in LENGTH_EVAL:
        return {}
    from lara_serve.model_export.training.long_docs import length_report
    from lara_serve.model_export.training.tasks import text_docs

    texts, labels = text_docs(dataset, splits(args)[1])
    if args.eval_limit is not None:
        texts, labels = texts[: args.eval_limit], labels[: args.eval_limit]
    rep = length_report(model, texts, labels, **LENGTH_EVAL[dataset])
    return {f"val_{k}": round(v, 4) for k, v in rep.items()}


def distill_settings(args: argparse.Namespace, task: Any, num_classes: int) -> dict[str, Any] | None:
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


def text_augment(args: argparse.Namespace, task: Any) -> dict[str, Any] | None:
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


def image_photometric(args: argparse.Namespace, task: Any) -> dict[str, Any] | None:
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


def photometric_eval(model: nn.Module, val_task: Any, photometric: dict[str, Any] | None) -> dict[str, Any]:
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
