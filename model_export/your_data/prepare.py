"""`lara train`'s first step: the user's data read, checked and split, the model built for it, and every
piece the later steps read (`Prepared`: training task, holdout and test scoring, the wide path's documents,
the baseline, the ood inputs, the budget's units), all before any file is written.

Text reads as the shipped text recipe (lara_serve.model_export.your_data.recipe), images as the shipped
ViT's. May import `models`, `training`, `head` and the `your_data` modules below `command`; `command` imports
it, never the reverse.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lara_serve.model_export.head.finalize import TEXT_HEADS, task_outputs, text_outputs
from lara_serve.model_export.models.config import TextConfig, config_from_dict
from lara_serve.model_export.models.ood_input import image_input_scores, text_input_scores
from lara_serve.model_export.models.registry import build_model, get_config
from lara_serve.model_export.training.data import pad_batch
from lara_serve.model_export.training.defaults import DEFAULTS
from lara_serve.model_export.training.long_docs import LengthMixTask, length_groups, to_ids
from lara_serve.model_export.training.tasks import ImageTask
from lara_serve.model_export.your_data import budget, pieces, pretrained_init, recipe
from lara_serve.model_export.your_data import dist as userdist
from lara_serve.model_export.your_data import loader as ud
from lara_serve.model_export.your_data import wide as userwide
from lara_serve.model_export.your_data.baseline import IMAGE_BASELINE, TEXT_BASELINE, image_baseline, text_baseline
from lara_serve.model_export.your_data.options import (
    DEFAULT_ARCH,
    DEFAULT_INIT,
    DEFAULT_TEXT_ENCODER,
    MAX_DEFAULT_IMAGE,
    UsageError,
    default_text_init,
    resolve_init,
)


def build(args: argparse.Namespace, task: str, labels: list[str], image: tuple[int, int, float, float] | None):
    """(model, cfg, init path, init record): the architecture, resized for the labels and the data (text: with
    the robust recipe's pooling and case folding, lara_serve.model_export.your_data.recipe), with --init's weights."""
    init = resolve_init(args.init or DEFAULT_INIT[task])
    if args.arch:
        cfg = get_config(args.arch)
    elif init is not None:
        conf = json.loads((init / "config.json").read_text())
        cfg = config_from_dict(conf["model"], conf["attention"])
    else:
        cfg = get_config(DEFAULT_ARCH[task])
    if isinstance(cfg, TextConfig) != (task == "text"):
        raise UsageError(f"the architecture ({cfg.arch}) does not fit {task} data; choose --arch / --init")
    if isinstance(cfg, TextConfig):
        cfg = dataclasses.replace(cfg, num_classes=len(labels), max_length=args.max_length or cfg.max_length)
        cfg = recipe.text_config(cfg, case_fold=not args.no_case_fold, pooling=args.pooling)
        wide = 0 if args.no_wide else userwide.wide_buckets(len(labels))
        cfg = dataclasses.replace(cfg, tfidf_buckets=wide, tfidf_utf8=bool(wide))
    else:
        size, chans, mean, std = image  # type: ignore[misc]
        cfg = dataclasses.replace(cfg, num_classes=len(labels), image_size=size, in_chans=chans, mean=mean, std=std)
    torch.manual_seed(args.seed)
    model = build_model(cfg, seed=args.seed)
    taken = None
    if init is not None:
        from safetensors.torch import load_file

        taken = recipe.copy_matching(model, load_file(str(init / "1" / "model.safetensors")))
    return model, cfg, init, taken


def text_logits(model: nn.Module, raws: list[bytes], max_length: int) -> np.ndarray:
    """Logits [N, C] of whole documents (cut at max_length, as the server's head truncation), in input order."""
    model.eval()
    cut = [r[:max_length] for r in raws]
    out = np.zeros((len(raws), model.cfg.num_classes), dtype=np.float32)
    with torch.inference_mode():
        for idx in length_groups(cut, 8):
            ids, mask = pad_batch([to_ids(cut[i]) for i in idx])
            out[idx] = model(input_ids=ids, attention_mask=mask).numpy()
    return out


# Documents per text_outputs call after training, freed memory handed back between calls: every batch of up to
# 64 K tokens lays activations of new sizes beside the freed ones (speeches, the serving head's holdout, test
# and ood sample in one call each: peak 0.37 -> 2.01 GiB; in chunks of 16 documents 1.27 GiB).
OUTPUT_CHUNK = 16


def chunked_outputs(model: nn.Module, raws: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """text_outputs (logits [N, C], pooled features [N, D]) over length-sorted chunks of OUTPUT_CHUNK documents,
    in input order."""
    if len(raws) <= OUTPUT_CHUNK:
        return text_outputs(model, raws)
    order = sorted(range(len(raws)), key=lambda i: len(raws[i]))
    zs, fs = [], []
    for start in range(0, len(order), OUTPUT_CHUNK):
        z, f = text_outputs(model, [raws[i] for i in order[start : start + OUTPUT_CHUNK]])
        zs.append(z)
        fs.append(f)
        pieces.release_memory(collect=False)
    back = torch.empty(len(raws), dtype=torch.long)
    back[torch.tensor(order)] = torch.arange(len(raws))
    return torch.cat(zs)[back], torch.cat(fs)[back]


def _image_logits(model: nn.Module, task: ImageTask) -> np.ndarray:
    model.eval()
    with torch.inference_mode():
        return torch.cat([model(**x) for x, _ in task.eval_batches(256)]).numpy()


@dataclasses.dataclass
class Prepared:
    """The data, split and model of a run, ready for training."""

    data: ud.UserData
    test: ud.UserData
    split: ud.Split
    names: list[str]
    model: nn.Module
    cfg: Any
    init: Path | None
    train_task: Any
    holdout_logits: Any  # (model) -> logits [n_holdout, C]
    holdout_y: np.ndarray
    test_y: np.ndarray
    hp: dict[str, Any]
    baseline: Any  # (seconds LARA trained) -> (test probabilities, baseline name, fit seconds)
    outputs: Any  # (model, "train" | "holdout" | "test") -> (logits [N, C], pooled features [N, D], labels [N])
    test_texts: list[bytes]  # text: the test documents (accuracy vs length)
    input_scores: Any = None  # () -> (input-space ood score fitted on train, its holdout values, its test values)
    wide: userwide.WideData | None = (
        None  # text with the wide path: its documents (lara_serve.model_export.your_data.wide)
    )
    parts: dict[str, Any] | None = None  # after training: the wide path's blend and each part alone
    # What the phases after training read (lara_serve.model_export.your_data.budget.make_plan's units)
    units: dict[str, int] | None = None


@dataclasses.dataclass(frozen=True)
class _Labelled:
    """The data read, checked and split; labels as class numbers (the order of `names`)."""

    data: ud.UserData
    test: ud.UserData  # the --test file's data, or `data` itself when the test split comes from it
    split: ud.Split
    names: list[str]
    test_idx: list[int]  # the test examples' indices into `test`
    y_all: np.ndarray  # [len(data)]
    test_y: np.ndarray  # [len(test_idx)]
    hold_y: np.ndarray  # [len(split.holdout)]
    y_train: torch.Tensor  # [len(split.train)]


def _read(args: argparse.Namespace) -> _Labelled:
    data = ud.load_data(args.data, args.task, args.text_field, args.label_field)
    ud.check_labels(data)
    names = data.label_names()
    test = data
    if args.test is not None:
        test = ud.load_data(args.test, data.task, args.text_field, args.label_field)
        ud.check_test_labels(test, names)
    split = ud.make_split(data, args.test_fraction, args.holdout_fraction, args.seed, args.test is not None)
    test_idx = split.test if args.test is None else list(range(len(test)))
    if not test_idx:
        raise ud.DataError(f"{data.source}: no test examples; give each label at least 2 examples or pass --test")
    code = {label: i for i, label in enumerate(names)}
    y_all = np.array([code[v] for v in data.labels])
    test_y = np.array([code[test.labels[i]] for i in test_idx])
    hold_y = y_all[split.holdout]
    y_train = torch.from_numpy(y_all[split.train])
    return _Labelled(data, test, split, names, test_idx, y_all, test_y, hold_y, y_train)


def prepare(args: argparse.Namespace, group: userdist.Group = userdist.Group()) -> Prepared | pretrained_init.Frozen:
    """Read and check everything (data, labels, split, architecture) before any file is written. With --init
    naming a word-piece model, its encoder kept frozen (pretrained_init.Frozen: no training task)."""
    d = _read(args)
    chosen = None
    if args.init is None and d.data.task == "text":  # the default encoder depends on what the run asks for
        args.init, chosen = default_text_init(args, group.world)
    if pretrained_init.applies(args):
        frozen = pretrained_init.prepare(args, d)
        frozen.hp["init_choice"] = chosen or "--init"
        return frozen
    if getattr(args, "int8", False):
        what = f"trains the byte encoder ({args.init})" if d.data.task == "text" else "trains an image model"
        raise UsageError(f"--int8 quantizes a frozen word-piece encoder (--init {DEFAULT_TEXT_ENCODER}); this run "
                         f"{what}: drop --int8" + (f" ({chosen})" if chosen else ""))  # fmt: skip
    prep, taken = _prepare_text(args, d, group) if d.data.task == "text" else _prepare_image(args, d)
    if args.lr is not None:
        prep.hp["lr"] = args.lr
    prep.hp["arch"] = args.arch or (prep.init.name if prep.init is not None else DEFAULT_ARCH[d.data.task])
    prep.hp["init_tensors"] = taken
    prep.hp["init_choice"] = chosen or ("--init" if args.init else "the default")
    return prep


def _text_task(args: argparse.Namespace, d: _Labelled, cfg: Any, group: userdist.Group) -> tuple[Any, dict]:
    """The training task of the text recipe (short texts or long documents) and its hyperparameters."""
    data, split = d.data, d.split
    choice = recipe.choose([len(data.texts[i]) for i in split.train])  # short texts or long documents
    mix = recipe.length_mix(cfg.max_length, choice["recipe"])
    train_task: Any = LengthMixTask([data.texts[i] for i in split.train], d.y_train, cfg.max_length, **mix)
    bank, filler_sha = recipe.filler_bank(group.share) if not args.no_augment else (None, None)
    aug = recipe.text_augment(cfg.max_length, enabled=not args.no_augment, bank=bank, kind=choice["recipe"])
    train_task.text_augment = None if aug is None else recipe.capped(aug, cfg.max_length)
    hp = {**DEFAULTS["news"], "length_mix": mix, "recipe": recipe.recipe_line(cfg.pooling, choice["recipe"]),
          "recipe_choice": choice, "augment": not args.no_augment,
          "text_augment": recipe.augment_record(aug), "filler_sha256": filler_sha}  # fmt: skip
    return train_task, hp


def _prepare_text(args: argparse.Namespace, d: _Labelled, group: userdist.Group) -> tuple[Prepared, Any]:
    data, test, split, y_all, hold_y, test_y = d.data, d.test, d.split, d.y_all, d.hold_y, d.test_y
    model, cfg, init, taken = build(args, "text", d.names, None)
    train_task, hp = _text_task(args, d, cfg, group)
    hold_raws, test_raws = [data.texts[i] for i in split.holdout], [test.texts[i] for i in d.test_idx]
    # The out-of-distribution fit reads training documents whole and as heads (what head-truncating
    # clients send), as lara_serve.model_export.head.finalize does for the shipped models: a seeded sample of
    # them, so its time and memory stay bounded whatever the data's size (lara_serve.model_export.your_data.budget).
    train_raws = [data.texts[i][: cfg.max_length] for i in split.train]
    sample = budget.ood_sample([len(r) for r in train_raws], args.seed)
    ood_raws, ood_y = [train_raws[i] for i in sample], y_all[split.train][sample].tolist()
    hp["ood_fit"] = {"documents": len(sample), "of": len(train_raws), "bytes": sum(map(len, ood_raws)),
                     "at_most": {"documents": budget.OOD_FIT_DOCS, "bytes": budget.OOD_FIT_BYTES}}  # fmt: skip
    parts = {
        "train": ([r[:n] for n in (None, *TEXT_HEADS) for r in ood_raws], ood_y * 3),
        "holdout": ([r[: cfg.max_length] for r in hold_raws], hold_y.tolist()),
        "test": ([r[: cfg.max_length] for r in test_raws], test_y.tolist()),
    }

    def outputs(m: nn.Module, part: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z, f = chunked_outputs(m.eval(), parts[part][0])
        return z, f, torch.tensor(parts[part][1])

    train_texts, train_y = [data.texts[i] for i in split.train], y_all[split.train].tolist()
    units = {"holdout": sum(map(len, parts["holdout"][0])), "test": sum(map(len, parts["test"][0])),
             "ood": sum(map(len, parts["train"][0])), "train_bytes": sum(map(len, train_raws)),
             "train_docs": len(train_raws), "wide": int(bool(cfg.tfidf_buckets)),
             "baseline": int(not args.no_baseline), "matched_baseline": 0}  # fmt: skip
    wide = None
    if cfg.tfidf_buckets:
        wide = userwide.WideData(train_raws, y_all[split.train].tolist(), parts["holdout"][0], hold_y.tolist(),
                                 parts["test"][0], test_y.tolist())  # fmt: skip

    def baseline(secs: float) -> tuple[np.ndarray, str, float]:
        del secs  # a linear model fits in seconds: no time to match
        probs, fit_s = text_baseline(train_texts, train_y, test_raws)
        return probs, TEXT_BASELINE, fit_s

    prep = Prepared(data, test, split, d.names, model, cfg, init, train_task,
                    holdout_logits=lambda m: text_logits(m, hold_raws, cfg.max_length), holdout_y=hold_y,
                    test_y=test_y, hp=hp, baseline=baseline, outputs=outputs, test_texts=test_raws,
                    input_scores=lambda: text_input_scores(train_raws, parts["holdout"][0], parts["test"][0],
                                                           bool(cfg.case_fold)),
                    wide=wide, units=units)  # fmt: skip
    return prep, taken


def _prepare_image(args: argparse.Namespace, d: _Labelled) -> tuple[Prepared, Any]:
    data, test, split, y_train = d.data, d.test, d.split, d.y_train
    side, chans = ud.image_shape([data.images[i] for i in split.train])
    size = args.image_size or min(MAX_DEFAULT_IMAGE, side + side % 2)
    images = ud.read_images(data.images, size, chans)
    test_images = images if args.test is None else ud.read_images(test.images, size, chans)
    pixels = images[split.train].float() / 255.0
    mean, std = round(float(pixels.mean()), 4), round(max(float(pixels.std()), 1e-3), 4)
    model, cfg, init, taken = build(args, "image", d.names, (size, chans, mean, std))
    hp = {**DEFAULTS["fashion"], "augment": not args.no_augment}
    hp["batch_size"] = args.batch_size or min(hp["batch_size"], max(2, len(split.train) // 4))
    train_task = ImageTask(images[split.train], y_train, mean, std, augment=not args.no_augment)
    hold_task = ImageTask(images[split.holdout], torch.from_numpy(d.hold_y), mean, std, augment=False)
    test_task = ImageTask(test_images[d.test_idx], torch.from_numpy(d.test_y), mean, std, augment=False)
    ood = torch.as_tensor(budget.ood_sample([1] * len(split.train), args.seed, budget.OOD_FIT_IMAGES, 1 << 62))
    train_idx = torch.as_tensor(split.train)[ood]
    parts = {"train": ImageTask(images[train_idx], y_train[ood], mean, std, augment=False),
             "holdout": hold_task, "test": test_task}  # fmt: skip
    hp["ood_fit"] = {"images": len(ood), "of": len(split.train), "at_most": budget.OOD_FIT_IMAGES}

    def outputs(m: nn.Module, part: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.inference_mode():  # as text_outputs: no graph kept per batch, the probe's forward rate
            return task_outputs(m.eval(), parts[part])

    # The CNN baseline trains after the encoder, for as long as it did (matched): reserved per second trained.
    units = {"holdout": len(split.holdout), "test": len(d.test_idx), "ood": len(ood), "train_bytes": 0,
             "train_docs": 0, "wide": 0, "baseline": 0, "matched_baseline": int(not args.no_baseline)}  # fmt: skip

    def baseline(secs: float) -> tuple[np.ndarray, str, float]:
        probs, fit_s = image_baseline(train_task, test_task, len(d.names), secs, args.seed, args.clock)
        return probs, IMAGE_BASELINE, fit_s

    prep = Prepared(data, test, split, d.names, model, cfg, init, train_task,
                    holdout_logits=lambda m: _image_logits(m, hold_task), holdout_y=d.hold_y, test_y=d.test_y,
                    hp=hp, baseline=baseline, outputs=outputs, test_texts=[],
                    input_scores=lambda: image_input_scores(parts["train"], hold_task, test_task),
                    wide=None, units=units)  # fmt: skip
    return prep, taken
