"""The options of `lara train` and the checks made on them before anything is read or written."""

from __future__ import annotations

import argparse
from pathlib import Path

from lara_serve.model_export.export.exporter import EXPORT_SEQ
from lara_serve.model_export.models.config import POOLINGS
from lara_serve.model_export.your_data import recipe
from lara_serve.model_export.your_data.artifact import SHIPPED

DEFAULT_ARCH = {"text": "lara-text-news-bytes", "image": "lara-vit-fashion"}
DEFAULT_INIT = {"text": "lara-text-news-bytes", "image": "none"}  # what trains when the default text encoder cannot
# The default text encoder: the converted all-MiniLM-L6-v2, kept frozen, with the wide path beside it
# (your_data.pretrained_init). Measured on the user-like sets (docs/train-your-data.md): 2.8-8.3 points above
# the byte encoder's served accuracy on three, 0.4 under on e-mails, in less CPU time and memory.
DEFAULT_TEXT_ENCODER = "lara-text-news"
# The options of the byte encoder's training that mean nothing for a frozen encoder (pretrained_init refuses
# them with --init lara-text-news), and why; given without --init they ask for the byte encoder.
NOT_FOR_FROZEN = {
    "epochs": "the encoder is not trained: there are no epochs (--time-budget bounds the run)",
    "lr": "the encoder is not trained (the head is a logistic regression)",
    "batch_size": "the encoder is not trained (documents are read in batches of pieces)",
    "resume": "a frozen-encoder run has no training loop and keeps no checkpoint; run it again",
    "no_augment": "the encoder is not trained, so nothing is augmented",
    "no_case_fold": "its word-piece tokenizer lower-cases every text before the encoder reads it (uncased)",
    "arch": "the architecture is the --init model's",
}
DEFAULT_BUDGET_MIN = 15.0
MAX_DEFAULT_IMAGE = 64  # default --image-size is the data's most common side, at most this


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", type=Path, help="a .jsonl/.csv/.tsv file, or a folder with one subfolder per label")
    p.add_argument("--out", type=Path, required=True, help="the model folder to write (inside a model repository)")
    p.add_argument("--task", choices=["text", "image"], default=None, help="default: inferred from DATA")
    p.add_argument("--text-field", default="text")
    p.add_argument("--label-field", default="label")
    p.add_argument("--test", type=Path, default=None, help="a test file/folder (else a stratified split of DATA)")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--holdout-fraction", type=float, default=0.1, help="of train: per-epoch validation, calibration")
    p.add_argument("--init", default=None, help="none | a shipped model NAME | a model DIR (default: text "
                   "lara-text-news, or lara-text-news-bytes when an option of the byte encoder's training is given; "
                   "images none); a word-piece model (lara-text-news) is kept frozen and a head and the wide path "
                   "are fitted on it; otherwise tensors whose name and shape fit are copied, the head is new")  # fmt: skip
    p.add_argument("--arch", default=None, help="registered architecture (default: that of --init, else "
                   "lara-text-news-bytes / lara-vit-fashion)")  # fmt: skip
    p.add_argument("--max-length", type=int, default=None, help="text: longest document served, bytes (word "
                   "pieces with a word-piece --init)")  # fmt: skip
    p.add_argument("--image-size", type=int, default=None, help="images: side after resizing (default: the data's)")
    p.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                   help=f"training time; the schedule fits it (default {DEFAULT_BUDGET_MIN:g} unless --epochs)")  # fmt: skip
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="what --time-budget counts: wall-clock seconds, or this process's CPU seconds (the same "
                   "training however busy the machine is; the image baseline gets the same)")  # fmt: skip
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None, help="images: examples per step (text batches by tokens)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--no-augment", action="store_true", help="no augmentation: text, no casing / whitespace / "
                   "markup / typo noise and no unrelated filler (lara_serve.model_export.training.augment); images, no crop / flip")  # fmt: skip
    p.add_argument("--no-case-fold", action="store_true", help="text: keep letter case (default: folded in the graph)")
    p.add_argument("--pooling", choices=POOLINGS, default=recipe.POOLING, help="text: how the encoder "
                   "reads a document out: attention (learned token weights), passages (each 512-byte passage "
                   "scored, log-mean-exp over them: filler cannot dilute it), mean")  # fmt: skip
    p.add_argument("--no-wide", action="store_true", help="text: the encoder alone, without the wide path (hashed "
                   "word 1-2-gram tf-idf + logistic regression, fitted first and blended on the holdout)")  # fmt: skip
    p.add_argument("--no-baseline", action="store_true", help="skip the plain baseline")
    p.add_argument("--int8", action="store_true", help="text with a frozen word-piece encoder (the default "
                   "lara-text-news): serve int8 encoder weights as lara-text-news does (about 1.7x faster on CPU); "
                   "the temperature, ood threshold and test metrics are refitted and measured on the int8 graph")  # fmt: skip
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint of an interrupted run")
    p.add_argument("--overwrite", action="store_true", help="replace a model already in DIR")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--json-lines", action="store_true", help="progress as JSON lines on stdout")
    p.add_argument("--load-into", default=None, metavar="URL", help="then load it into the server at URL")
    p.add_argument("--api-key", default=None, help="for --load-into")


class UsageError(ValueError):
    """A bad option or output folder; the message says what to do."""


def check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        what = "a model" if (out / "config.json").exists() or (out / "1").exists() else "files"
        raise UsageError(f"--out {out} already holds {what}; pass --overwrite to replace it, or choose another folder")


def resolve_init(init: str) -> Path | None:
    if init == "none":
        return None
    for candidate in (Path(init), SHIPPED / init):
        if (candidate / "config.json").is_file():
            return candidate
    raise UsageError(f"--init {init}: no model folder {init} nor {SHIPPED / init}; use none, a shipped name or a DIR")


def check_options(args: argparse.Namespace) -> None:
    for name in ("time_budget", "epochs", "max_length", "image_size", "batch_size", "threads"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.max_length is not None and args.max_length < EXPORT_SEQ:  # the export traces EXPORT_SEQ tokens
        raise UsageError(
            f"--max-length must be at least {EXPORT_SEQ} (the export traces {EXPORT_SEQ} tokens), got {args.max_length}"
        )
    if args.image_size is not None and args.image_size < 4:
        raise UsageError(f"--image-size must be at least 4, got {args.image_size}")
    if args.epochs is None and args.time_budget is None:
        args.time_budget = DEFAULT_BUDGET_MIN


def default_text_init(args: argparse.Namespace, processes: int) -> tuple[str, str]:
    """(--init, why) for text data given without --init: the frozen pretrained encoder, unless the run asks for
    what only the trained byte encoder has (an option of its training, several processes), or the model is not
    in this install (a lean image); then lara-text-news-bytes, fine-tuned as before."""
    # the options a frozen encoder refuses are the ones that ask for the byte encoder's training
    asked = [f"--{k.replace('_', '-')}" for k in NOT_FOR_FROZEN if getattr(args, k) not in (None, False)]
    if args.pooling != recipe.POOLING:
        asked.append(f"--pooling {args.pooling}")
    byte = DEFAULT_INIT["text"]
    if asked:
        return byte, f"{', '.join(asked)} train(s) the byte encoder: {byte} fine-tuned"
    if processes > 1:
        return byte, f"{processes} processes train the byte encoder ({DEFAULT_TEXT_ENCODER} runs in one): {byte}"
    if not (SHIPPED / DEFAULT_TEXT_ENCODER / "1" / "model.safetensors").is_file():
        return byte, f"{DEFAULT_TEXT_ENCODER} is not in {SHIPPED}: the byte encoder, {byte} fine-tuned"
    return DEFAULT_TEXT_ENCODER, f"the default: {DEFAULT_TEXT_ENCODER} frozen, a head and the wide path fitted"
