"""`lara train DATA --out DIR`: the user's labelled texts or images to a served, calibrated LARA model.

    lara train tickets.jsonl --out model_repository/tickets            # 15 minutes, then serve it
    lara train photos/ --out model_repository/photos --epochs 10 --image-size 32

Steps: read and check the data (lara_serve.model_export.your_data.loader), split it, build the model (text: the shipped
text encoder's weights with a new head; images: the shipped ViT architecture), train (lara_serve.model_export.your_data.fit),
text: fit the wide path (hashed word 1-2-gram tf-idf logistic regression inside the graph, lara_serve.model_export.your_data.wide)
before the encoder trains and blend the two on the holdout; fit the serving head (calibration temperature,
ood score; lara_serve.model_export.head.finalize), export ONNX with the fused LaraAttention node
(lara_serve.model_export.export.exporter), score the test set and a plain baseline, write the report (lara_serve.model_export.your_data.report).

Everything is built in a work folder beside DIR (.<name>.lara-train/) and moved into DIR only when all of
it is done, so a failed or interrupted run leaves DIR as it was. The work folder keeps the checkpoint that
`--resume` continues from.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import shutil
import sys
from collections.abc import Callable
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
from lara_serve.model_export.training.long_docs import LengthMixTask, length_groups, to_ids
from lara_serve.model_export.training.tasks import ImageTask
from lara_serve.model_export.training.train import DEFAULTS
from lara_serve.model_export.your_data import budget
from lara_serve.model_export.your_data import dist as userdist
from lara_serve.model_export.your_data import loader as ud
from lara_serve.model_export.your_data import recipe as recipe
from lara_serve.model_export.your_data import wide as userwide
from lara_serve.model_export.your_data.artifact import SHIPPED as SHIPPED  # where --init finds shipped models
from lara_serve.model_export.your_data.artifact import finish
from lara_serve.model_export.your_data.baseline import IMAGE_BASELINE, TEXT_BASELINE, image_baseline, text_baseline
from lara_serve.model_export.your_data.fit import (
    BudgetTooSmall,
    FitSettings,
    ResumeError,
    TrainingStopped,
    check_resume,
    clock_fn,
    fit,
    resume_notes,
)
from lara_serve.model_export.your_data.options import (
    DEFAULT_ARCH,
    DEFAULT_INIT,
    MAX_DEFAULT_IMAGE,
    UsageError,
    add_arguments,
    check_options,
    check_out,
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


def _text_logits(model: nn.Module, raws: list[bytes], max_length: int) -> np.ndarray:
    """Logits [N, C] of whole documents (cut at max_length, as the server's head truncation), in input order."""
    model.eval()
    cut = [r[:max_length] for r in raws]
    out = np.zeros((len(raws), model.cfg.num_classes), dtype=np.float32)
    with torch.inference_mode():
        for idx in length_groups(cut, 8):
            ids, mask = pad_batch([to_ids(cut[i]) for i in idx])
            out[idx] = model(input_ids=ids, attention_mask=mask).numpy()
    return out


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


def prepare(args: argparse.Namespace, group: userdist.Group = userdist.Group()) -> Prepared:
    """Read and check everything (data, labels, split, architecture) before any file is written."""
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
    if data.task == "text":
        model, cfg, init, taken = build(args, "text", names, None)
        choice = recipe.choose([len(data.texts[i]) for i in split.train])  # short texts or long documents
        mix = recipe.length_mix(cfg.max_length, choice["recipe"])
        train_task: Any = LengthMixTask([data.texts[i] for i in split.train], y_train, cfg.max_length, **mix)
        bank, filler_sha = recipe.filler_bank(group.share) if not args.no_augment else (None, None)
        aug = recipe.text_augment(cfg.max_length, enabled=not args.no_augment, bank=bank, kind=choice["recipe"])
        train_task.text_augment = None if aug is None else recipe.capped(aug, cfg.max_length)
        hold_raws, test_raws = [data.texts[i] for i in split.holdout], [test.texts[i] for i in test_idx]
        hold_fn = lambda m: _text_logits(m, hold_raws, cfg.max_length)  # noqa: E731
        hp = {**DEFAULTS["news"], "length_mix": mix, "recipe": recipe.recipe_line(cfg.pooling, choice["recipe"]),
              "recipe_choice": choice, "augment": not args.no_augment,
              "text_augment": recipe.augment_record(aug), "filler_sha256": filler_sha}  # fmt: skip
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
            z, f = text_outputs(m.eval(), parts[part][0])
            return z, f, torch.tensor(parts[part][1])

        train_texts, train_y = [data.texts[i] for i in split.train], y_all[split.train].tolist()
        units = {"holdout": sum(map(len, parts["holdout"][0])), "test": sum(map(len, parts["test"][0])),
                 "ood": sum(map(len, parts["train"][0])), "train_bytes": sum(map(len, train_raws)),
                 "train_docs": len(train_raws), "wide": int(bool(cfg.tfidf_buckets)),
                 "baseline": int(not args.no_baseline)}  # fmt: skip
        input_scores = lambda: text_input_scores(train_raws, parts["holdout"][0], parts["test"][0],  # noqa: E731
                                                 bool(cfg.case_fold))  # fmt: skip

        wide = None
        if cfg.tfidf_buckets:
            wide = userwide.WideData(train_raws, y_all[split.train].tolist(), parts["holdout"][0], hold_y.tolist(),
                                     parts["test"][0], test_y.tolist())  # fmt: skip

        def baseline(secs: float) -> tuple[np.ndarray, str, float]:
            del secs  # a linear model fits in seconds: no time to match
            probs, fit_s = text_baseline(train_texts, train_y, test_raws)
            return probs, TEXT_BASELINE, fit_s
    else:
        side, chans = ud.image_shape([data.images[i] for i in split.train])
        size = args.image_size or min(MAX_DEFAULT_IMAGE, side + side % 2)
        images = ud.read_images(data.images, size, chans)
        test_images = images if args.test is None else ud.read_images(test.images, size, chans)
        pixels = images[split.train].float() / 255.0
        mean, std = round(float(pixels.mean()), 4), round(max(float(pixels.std()), 1e-3), 4)
        model, cfg, init, taken = build(args, "image", names, (size, chans, mean, std))
        hp = {**DEFAULTS["fashion"], "augment": not args.no_augment}
        hp["batch_size"] = args.batch_size or min(hp["batch_size"], max(2, len(split.train) // 4))
        train_task = ImageTask(images[split.train], y_train, mean, std, augment=not args.no_augment)
        hold_task = ImageTask(images[split.holdout], torch.from_numpy(hold_y), mean, std, augment=False)
        test_task = ImageTask(test_images[test_idx], torch.from_numpy(test_y), mean, std, augment=False)
        hold_fn = lambda m: _image_logits(m, hold_task)  # noqa: E731
        test_raws = []
        parts = {"train": ImageTask(images[split.train], y_train, mean, std, augment=False),
                 "holdout": hold_task, "test": test_task}  # fmt: skip

        def outputs(m: nn.Module, part: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return task_outputs(m.eval(), parts[part])

        input_scores = lambda: image_input_scores(parts["train"], hold_task, test_task)  # noqa: E731
        wide = None
        units = {"holdout": len(split.holdout), "test": len(test_idx), "ood": len(split.train), "train_bytes": 0,
                 "train_docs": 0, "wide": 0, "baseline": 0}  # fmt: skip

        def baseline(secs: float) -> tuple[np.ndarray, str, float]:
            probs, fit_s = image_baseline(train_task, test_task, len(names), secs, args.seed, args.clock)
            return probs, IMAGE_BASELINE, fit_s

    if args.lr is not None:
        hp["lr"] = args.lr
    hp["arch"] = args.arch or (init.name if init is not None else DEFAULT_ARCH[data.task])
    hp["init_tensors"] = taken
    return Prepared(
        data,
        test,
        split,
        names,
        model,
        cfg,
        init,
        train_task,
        hold_fn,
        hold_y,
        test_y,
        hp,
        baseline,
        outputs,
        test_raws,
        input_scores,
        wide,
        units=units,
    )


def _fit_settings(args: argparse.Namespace, hp: dict[str, Any]) -> FitSettings:
    return FitSettings(
        lr=hp["lr"],
        weight_decay=hp["weight_decay"],
        label_smoothing=hp["label_smoothing"],
        batch_size=hp["batch_size"],
        epochs=args.epochs,
        time_budget_s=None if args.time_budget is None else args.time_budget * 60.0,
        seed=args.seed,
        clock=args.clock,
    )


def _fit_wide(prep: Prepared, settings: FitSettings) -> tuple[Any, FitSettings]:
    """Fit the wide path (taken out of the model while the encoder trains); its time, on the run's clock,
    comes out of the time budget. Returns ((head, fit), the encoder's settings)."""
    timer = clock_fn(settings.clock)
    t0 = timer()
    head, wide_fit = userwide.detach_and_fit(prep.model, prep.wide)  # type: ignore[arg-type]
    spent = timer() - t0
    prep.hp["wide_fit_s"] = round(spent, 2)
    return (head, wide_fit), dataclasses.replace(settings, spent_s=spent)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole pipeline; returns config.json's "metrics". Raises DataError, UsageError, BudgetTooSmall,
    TrainingStopped with messages meant for the user."""
    check_options(args)
    check_out(args.out, args.overwrite)
    timer = clock_fn(args.clock)
    phases = budget.Phases(timer, 0.0 if args.clock == "cpu" else timer())
    if args.threads:
        torch.set_num_threads(args.threads)
    group = userdist.setup()  # one process, or this one's place under torchrun
    prep = prepare(args, group)
    progress = "quiet" if args.quiet else "json" if args.json_lines else "bar"
    work = work_dir(args.out)
    settings = _fit_settings(args, prep.hp)
    if group.main:
        warn_long(prep)  # on stderr, also with --quiet: it is about the data
    meta = {
        "data_sha256": ud.fingerprint(prep.data.source),
        "test_sha256": ud.fingerprint(prep.test.source),
        "split": prep.split.record(prep.data, prep.test)["ids"],
        "config": dataclasses.asdict(prep.cfg),
        "init": str(prep.init),
        "fit": dataclasses.asdict(settings),
        "augment": prep.hp["augment"],
        # text: the filler text the augmentation reads from the installed packages (a pip install changes it)
        "filler_sha256": prep.hp.get("filler_sha256"),
    }
    if args.resume:  # before the wide path's fit: a refused resume costs nothing
        for note in resume_notes(check_resume(work / "ckpt", meta), meta):
            print(f"warning: --resume: {note}", file=sys.stderr)
    plan = budget.check_first(prep, settings, phases, group, args.time_budget, args.clock)
    created = group.main and not work.exists()
    try:
        if group.main:
            work.mkdir(parents=True, exist_ok=True)
        metrics = _train_and_write(args, prep, settings, work, meta, progress, group, phases, plan)
    except TrainingStopped:
        raise
    except BaseException as exc:
        if group.main:
            _clean_up(work, created, full=isinstance(exc, OSError) and exc.errno == errno.ENOSPC)
        raise
    return metrics


def work_dir(out: Path) -> Path:
    """The hidden folder beside --out where a run builds everything (and keeps its checkpoint)."""
    return out.parent / f".{out.name}.lara-train"


def _clean_up(work: Path, created: bool, full: bool) -> None:
    """After a failed run: the half-written model goes; the checkpoint stays for --resume, unless the disk is
    full (freeing it comes first) or there is none (then the folder this run made goes too)."""
    shutil.rmtree(work / "stage", ignore_errors=True)
    shutil.rmtree(work / "ckpt.tmp", ignore_errors=True)
    if full or not (work / "ckpt").exists():
        shutil.rmtree(work / "ckpt", ignore_errors=True)
        if created or full:
            shutil.rmtree(work, ignore_errors=True)


def _train_and_write(args, prep: Prepared, settings: FitSettings, work: Path, meta: dict[str, Any], progress: str,
                     group: userdist.Group, phases: budget.Phases, plan: budget.Plan | None) -> dict[str, Any]:  # fmt: skip
    """Fit the wide path and the baseline, train the encoder in what the budget leaves after the estimate of
    the phases after it, then (process 0) write the model folder and move it into place."""
    wide = None
    if prep.wide is not None:
        with phases.phase("wide"):
            wide, settings = _fit_wide(prep, settings)
    if prep.data.task == "text" and not args.no_baseline:  # a text baseline does not depend on LARA's training
        with phases.phase("baseline"):
            early = prep.baseline(0.0)
        prep.baseline = lambda secs: early
    spent = float(group.share(phases.elapsed()))  # type: ignore[arg-type]
    settings = dataclasses.replace(settings, spent_s=spent, reserve_s=plan.after_s if plan is not None else 0.0)
    try:
        with phases.phase("training"):
            state = fit(prep.model, prep.train_task,
                        lambda m: float((prep.holdout_logits(m).argmax(1) == prep.holdout_y).mean()),
                        settings, work / "ckpt", meta, resume=args.resume, progress=progress, group=group)  # fmt: skip
    finally:
        userdist.teardown(group)
    if not group.main:
        return {}  # process 0 writes the model folder
    budget.release_memory()
    if wide is not None:
        deep = lambda m, docs: _text_logits(m, docs, prep.cfg.max_length)  # noqa: E731
        with phases.phase("blend"):
            prep.parts = userwide.attach(prep.model, *wide, prep.wide, deep)
    stage = work / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    metrics = finish(args, prep, state, stage, phases)
    budget.record_time(stage, phases, args.time_budget)
    if args.out.exists():
        shutil.rmtree(args.out)  # check_out allowed it: --overwrite, or an empty folder
    stage.rename(args.out)
    shutil.rmtree(work)
    return metrics


def warn_long(prep: Prepared) -> None:
    """Training reads a document's first max_length bytes (the server's truncate=head); say how many are cut."""
    limit = getattr(prep.cfg, "max_length", None)
    if limit is None or prep.data.task != "text":
        return
    long = [i for i, t in enumerate(prep.data.texts) if len(t) > limit]
    if long:
        worst = max(long, key=lambda i: len(prep.data.texts[i]))
        print(
            f"warning: {len(long)} of {len(prep.data)} documents in {prep.data.source} are longer than the model's "
            f"{limit:,} bytes (the longest: {len(prep.data.texts[worst]):,} bytes, {prep.data.ids[worst]}); training "
            f"reads their first {limit:,} bytes, and so does the served model (config.json preprocessing.truncate = "
            "head; a request with truncate=false gets 413 instead); raise --max-length to read more",
            file=sys.stderr,
        )


Loader = Callable[[str, str, "str | None"], str]  # (url, model name, api key) -> what happened
Probe = Callable[[str, "str | None"], None]  # (url, api key): raises with a message if it cannot load models


def main(argv: list[str] | None = None, load: Loader | None = None, probe: Probe | None = None) -> int:
    """`lara train ...`: 0 on success, 2 for bad data or options, 1 when the disk is full or --load-into
    fails after training, 130 after Ctrl-C (one line; a checkpoint kept if one was saved). `load` adds the
    model to a running server (--load-into), `probe` checks that server before any work; the CLI passes the
    client's."""
    parser = argparse.ArgumentParser(
        prog="lara train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.load_into and load is None:
        parser.error("--load-into needs the lara client (run it as `lara train`)")
    try:
        if args.load_into and probe is not None:
            try:
                probe(args.load_into, args.api_key)
            except Exception as exc:  # the client's errors carry the server's message
                raise UsageError(f"--load-into {args.load_into}: {exc}; start the server or drop --load-into") from None
        metrics = run(args)
    except (ud.DataError, UsageError, BudgetTooSmall, ResumeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrainingStopped as exc:
        print(f"{exc}; rerun the same command with --resume to continue", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        ckpt = work_dir(args.out) / "ckpt"
        kept = f"; checkpoint kept in {ckpt}: rerun the same command with --resume" if ckpt.exists() else ""
        print(f"interrupted{kept or '; nothing written'}", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        print(f"error: no space left on device: {exc.filename or work_dir(args.out)}", file=sys.stderr)
        return 1
    if not metrics:
        return 0  # not process 0 of a torchrun group: it reported nothing and wrote nothing
    done = {"event": "done", "out": str(args.out), **{k: v for k, v in metrics.items() if k != "history"}}
    if args.json_lines:
        print(json.dumps(done), flush=True)
    elif not args.quiet:
        base = metrics["baseline_accuracy"]
        print(
            f"wrote {args.out}: test accuracy {metrics['test_accuracy']:.4f}, macro-F1 {metrics['test_macro_f1']:.4f}"
            + (f" (baseline {base:.4f})" if base is not None else "")
            + f"; report: {args.out / 'report.md'}"
        )
    if args.load_into:
        try:
            message = load(args.load_into, args.out.name, args.api_key)  # type: ignore[misc]
        except Exception as exc:  # the client's errors carry the server's message
            print(f"error: the model is in {args.out} but loading it into {args.load_into} failed: {exc}",
                  file=sys.stderr)  # fmt: skip
            return 1
        if not args.quiet:
            print(message)
    return 0
