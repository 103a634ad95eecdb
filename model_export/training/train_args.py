"""The command line of `python -m lara_serve.model_export.training.train`: its flags (`parse_args`), the line
config.json records so that a run can be repeated (`command_line`), and the split names a run uses
(`splits`, which reads --fold).

May import `training.tasks` (for --fold); nothing else of ours, so parsing needs no model code.
"""

from __future__ import annotations

import argparse
import shlex

# The --help text (the training module's usage), kept here with the flags it describes.
DESCRIPTION = """Train a registered model: seeded, resumable (checkpoint each epoch), eval each epoch, ship artifact.

python -m lara_serve.model_export.training.train --model lara-vit-fashion --epochs 8 --out model_repository/lara-vit-fashion
"""


def splits(args: argparse.Namespace) -> tuple[str, str, str]:
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
    p = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
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
