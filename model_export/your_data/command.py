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

import torch

from lara_serve.model_export.your_data import budget, pretrained_init
from lara_serve.model_export.your_data import dist as userdist
from lara_serve.model_export.your_data import loader as ud
from lara_serve.model_export.your_data import recipe as recipe
from lara_serve.model_export.your_data import wide as userwide
from lara_serve.model_export.your_data.artifact import SHIPPED as SHIPPED  # where --init finds shipped models
from lara_serve.model_export.your_data.artifact import finish
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
from lara_serve.model_export.your_data.options import UsageError, add_arguments, check_options, check_out
from lara_serve.model_export.your_data.prepare import Prepared as Prepared
from lara_serve.model_export.your_data.prepare import build as build
from lara_serve.model_export.your_data.prepare import prepare as prepare
from lara_serve.model_export.your_data.prepare import text_logits


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
    if isinstance(prep, pretrained_init.Frozen):  # a word-piece encoder kept frozen: no training loop
        return _run_frozen(args, prep, phases, group)
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


def _run_frozen(args: argparse.Namespace, prep: pretrained_init.Frozen, phases: budget.Phases,
                group: userdist.Group) -> dict[str, Any]:  # fmt: skip
    """--init names a word-piece model: every document read once through its frozen encoder and a head fitted
    (pretrained_init), in the work folder a training run uses, moved into place when all of it is done."""
    if group.world > 1:
        userdist.teardown(group)
        raise UsageError(f"--init {args.init} keeps its encoder frozen and runs in one process: start it without "
                         "torchrun")  # fmt: skip
    pretrained_init.plan(prep, phases, args.time_budget, args.clock)  # BudgetTooSmall before any work
    work = work_dir(args.out)
    created, stage = not work.exists(), work / "stage"
    try:
        work.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(stage, ignore_errors=True)
        progress = "quiet" if args.quiet else "json" if args.json_lines else "bar"
        state = pretrained_init.fit(prep, phases, progress)
        metrics = _publish(args, prep, state, stage, work, phases)
    except BaseException as exc:
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
    budget.release_memory()  # what the wide path and the baseline freed, before training's activations
    spent = float(group.share(phases.elapsed()))  # type: ignore[arg-type]
    settings = dataclasses.replace(settings, spent_s=spent, reserve_s=plan.after_s if plan is not None else 0.0,
                                   reserve_per_s=plan.baseline_share if plan is not None else 0.0)  # fmt: skip
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
        deep = lambda m, docs: text_logits(m, docs, prep.cfg.max_length)  # noqa: E731
        with phases.phase("blend"):
            prep.parts = userwide.attach(prep.model, *wide, prep.wide, deep)
    stage = work / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    return _publish(args, prep, state, stage, work, phases)


def _publish(
    args: argparse.Namespace, prep: Any, state: Any, stage: Path, work: Path, phases: budget.Phases
) -> dict[str, Any]:
    """The serving head, export and report into the stage folder, its time recorded, then the stage moved into
    --out (replacing what check_out allowed to be replaced) and the work folder removed."""
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
