"""The training loop of `lara train`: dataset-agnostic, budgeted, interruptible, resumable to the same result.

A task (lara_serve.model_export.training.tasks.ImageTask, lara_serve.model_export.training.long_docs.LengthMixTask) yields (inputs, labels) batches
from a seeded generator per epoch; this loop knows nothing else about the data. It reuses the shipped
recipe's pieces (lara_serve.model_export.training.train: warmup + cosine on training progress, per-epoch noise reseeding).

Resume gives the uninterrupted run's weights: a checkpoint holds the weights, the optimizer, the global RNG
(dropout, drop-path), every attention layer's noise generator and the position inside the epoch; resuming
rebuilds that epoch's batch stream from its seed and skips the batches already trained on.
"""

from __future__ import annotations

import io
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save
from torch import nn

from lara_serve.model_export.models.layers import Attention
from lara_serve.model_export.training.train import reseed_noise, warmup_cosine
from lara_serve.model_export.your_data import pieces
from lara_serve.model_export.your_data.dist import Group

Progress = Literal["bar", "json", "quiet"]
# Steps timed before the epoch time is projected against --time-budget: 5% of the first epoch, at least 5;
# the first step (allocator and thread-pool warm-up) is timed apart so it does not inflate the rate.
_PROBE_SHARE, _PROBE_MIN = 0.05, 5


class TrainingStopped(RuntimeError):
    """Ctrl-C: a checkpoint was saved; the message says how to resume."""


class ResumeError(ValueError):
    """--resume without a checkpoint, or with one made by other settings."""


class BudgetTooSmall(ValueError):
    """The time budget cannot hold one epoch; `minimum_min` is the smallest budget that would."""

    def __init__(self, message: str, minimum_min: float) -> None:
        super().__init__(message)
        self.minimum_min = minimum_min


@dataclass(frozen=True)
class FitSettings:
    lr: float
    weight_decay: float
    label_smoothing: float
    batch_size: int
    epochs: int | None  # None: as many as the time budget holds
    time_budget_s: float | None  # None: --epochs decides
    seed: int
    warmup: float = 0.05
    # "wall": seconds on the clock on the wall; "cpu": this process's CPU seconds (all its threads), so a
    # budget buys the same training on a machine that other jobs share.
    clock: Literal["wall", "cpu"] = "wall"
    # Seconds of the budget spent before the encoder trains (text: the wide path's fit, lara_serve.model_export.your_data.wide).
    spent_s: float = 0.0
    # Seconds of the budget kept for the phases after training (lara_serve.model_export.your_data.budget): training
    # ends, and its learning-rate schedule completes, at time_budget_s - reserve_s.
    reserve_s: float = 0.0
    # Seconds of the budget kept per second trained, for a phase after training that lasts as long as training
    # did (images: the small CNN baseline gets the encoder's training time): each second trained costs
    # 1 + reserve_per_s of what the budget leaves.
    reserve_per_s: float = 0.0


def clock_fn(clock: str) -> Callable[[], float]:
    """The timer a --clock name stands for."""
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    return time.process_time if clock == "cpu" else time.perf_counter


@dataclass
class FitState:
    epoch: int = 0  # epochs finished
    step: int = 0  # optimizer steps over all epochs
    step_in_epoch: int = 0  # > 0 only in a checkpoint written by Ctrl-C mid-epoch
    epochs_exact: float = 0.0  # epochs trained, the last one by its share of the epoch's steps when cut short
    train_time_s: float = 0.0
    eval_time_s: float = 0.0  # the per-epoch holdout evaluations, on the run's clock (counted in the budget)
    seen: int = 0  # examples, correct predictions and summed loss of the current epoch so far
    correct: int = 0
    loss_sum: float = 0.0
    history: list[dict[str, Any]] | None = None


class Reporter:
    """What a person (tqdm bar with ETA, a line per epoch) or a script (JSON lines) sees of the run. The bar
    counts steps, or whole seconds of a time budget."""

    def __init__(self, mode: Progress, total: float, unit: str) -> None:
        self.mode, self.bar, self.total = mode, None, int(total)
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit=unit, dynamic_ncols=True, mininterval=1.0, leave=False)

    def step(self, position: float, loss: float, acc: float) -> None:
        """position: steps done, or seconds of the budget spent (never past the total: tqdm drops it then)."""
        if self.bar is not None:
            self.bar.update(min(self.total, int(position)) - self.bar.n)
            self.bar.set_postfix(loss=f"{loss:.3f}", acc=f"{acc:.3f}", refresh=False)

    def event(self, record: dict[str, Any]) -> None:
        if self.mode == "json":
            print(json.dumps(record), flush=True)
        elif self.mode == "bar" and record.get("event") == "epoch":
            self.bar.write(  # type: ignore[union-attr]
                f"epoch {record['epoch']}: loss {record['train_loss']:.4f}  train acc {record['train_acc']:.4f}  "
                f"holdout acc {record['holdout_acc']:.4f}  ({record['train_time_s']:.0f} s)"
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _attention_generators(model: nn.Module) -> list[torch.Generator]:
    return [m.generator for m in model.modules() if isinstance(m, Attention)]


def save_checkpoint(ckpt: Path, model: nn.Module, opt: torch.optim.Optimizer, state: FitState, meta: dict) -> None:
    """Written next to a temporary name and renamed: an interrupt while saving leaves the previous one whole.
    Each file is serialized in memory and written with a plain write, so a full disk raises OSError(ENOSPC)
    naming the file (torch.save's zip writer reports it as "unexpected pos ...")."""
    tmp = ckpt.with_name(ckpt.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "model.safetensors").write_bytes(save({k: v.detach().contiguous() for k, v in model.state_dict().items()}))
    # Pickled optimizer and RNG state lives only here, in the resume checkpoint, never in the model folder.
    buffer = io.BytesIO()
    torch.save(
        {
            "opt": opt.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "noise_rng": [g.get_state() for g in _attention_generators(model)],
        },
        buffer,
    )
    (tmp / "optim.pt").write_bytes(buffer.getvalue())
    (tmp / "state.json").write_text(json.dumps({"state": asdict(state), "meta": meta}, indent=2))
    if ckpt.exists():
        for f in ckpt.iterdir():
            f.unlink()
        ckpt.rmdir()
    tmp.rename(ckpt)


def check_resume(ckpt: Path, meta: dict) -> dict[str, Any]:
    """The checkpoint's saved record, if `ckpt` holds one made with these settings; else ResumeError. Cheap:
    `lara train --resume` calls it before any work. Settings are compared as state.json holds them (JSON: a
    tuple in `meta` equals the list it was saved as)."""
    if not (ckpt / "state.json").is_file():
        raise ResumeError(f"--resume: no checkpoint in {ckpt}; start without --resume")
    saved = json.loads((ckpt / "state.json").read_text())
    now = json.loads(json.dumps(meta))
    differs = sorted(k for k in now if k not in _ADVISORY and saved["meta"].get(k) != now[k])
    if differs:
        raise ResumeError(
            f"--resume: the checkpoint in {ckpt} was made with other settings ({', '.join(differs)}); "
            "rerun the original command with --resume, or start again without it"
        )
    return saved


# Settings a resume continues across, with a warning: what changed is the machine, not the command.
_ADVISORY = {
    "filler_sha256": "the installed Python packages changed since the checkpoint (the augmentation's filler "
    "text is read from them): training continues, but not to the uninterrupted run's exact weights",
}


def resume_notes(saved: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """Warnings for the advisory settings (_ADVISORY) that differ between a checkpoint and this run."""
    return [note for k, note in _ADVISORY.items() if k in meta and saved["meta"].get(k) != meta[k]]


def load_checkpoint(ckpt: Path, model: nn.Module, opt: torch.optim.Optimizer, meta: dict) -> tuple[FitState, list]:
    """Restore weights, optimizer and global RNG; returns the state and the attention noise states."""
    saved = check_resume(ckpt, meta)
    model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
    o = torch.load(ckpt / "optim.pt", weights_only=True)
    opt.load_state_dict(o["opt"])
    torch.set_rng_state(o["torch_rng"])
    return FitState(**saved["state"]), o["noise_rng"]


def make_optimizer(model: nn.Module, s: FitSettings) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or "pos_embed" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.lr)


class _StopFlag:
    """Ctrl-C sets the flag (the step in flight finishes, then a checkpoint is written); a second Ctrl-C
    gets Python's default behaviour and stops at once."""

    def __init__(self) -> None:
        self.set = False
        self._previous: Any = None

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.set = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def fit(
    model: nn.Module,
    task: Any,
    holdout_accuracy: Callable[[nn.Module], float],
    s: FitSettings,
    ckpt: Path,
    meta: dict[str, Any],
    resume: bool = False,
    progress: Progress = "bar",
    group: Group = Group(),
) -> FitState:
    """Train `model` on `task`; returns the final state (history: one record per epoch). With a group of
    several processes (lara_serve.model_export.your_data.dist) each trains on its share of every batch; process 0 saves."""
    steps_epoch = task.steps_per_epoch(s.batch_size)
    max_epochs = s.epochs if s.epochs is not None else 1_000_000
    total = steps_epoch * max_epochs
    opt = make_optimizer(model, s)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=s.label_smoothing)
    state, noise = FitState(history=[]), None
    if resume:
        state, noise = load_checkpoint(ckpt, model, opt, meta)

    def progress_at(elapsed: float) -> float:
        # Epochs done (the current one by its share of the estimated steps: a length-mix epoch's step count
        # varies a little) or the share of the time budget spent, whichever is further.
        by_epochs = (state.epoch + min(1.0, state.step_in_epoch / steps_epoch)) / max_epochs if s.epochs else 0.0
        end = max(s.time_budget_s - s.reserve_s, 1e-9) if s.time_budget_s else 0.0
        return max(by_epochs, (s.spent_s + state.eval_time_s + charged(elapsed)) / end if end else 0.0)

    def charged(elapsed: float) -> float:  # the budget a training time uses, the matched baseline's included
        return elapsed * (1.0 + s.reserve_per_s)

    def out_of_time(elapsed: float) -> bool:
        return (s.time_budget_s is not None
                and s.spent_s + s.reserve_s + state.eval_time_s + charged(elapsed) >= s.time_budget_s)  # fmt: skip

    budgeted = s.time_budget_s is not None and s.epochs is None
    timer = clock_fn(s.clock)
    rep = Reporter(progress if group.main else "quiet", s.time_budget_s if budgeted else total,
                   "s" if budgeted else "step")  # fmt: skip
    rep.step(s.spent_s + state.train_time_s if budgeted else state.step, 0.0, 0.0)
    try:
        with _StopFlag() as stop:
            for epoch in range(state.epoch, max_epochs):
                # A fresh run always starts epoch 0, even when the time spent before the encoder (spent_s)
                # already fills the budget: its first steps project the epoch and say the budget is too small.
                if out_of_time(state.train_time_s) and (epoch > 0 or state.step_in_epoch > 0):
                    break
                whole = _run_epoch(model, task, opt, loss_fn, s, state, epoch, noise, stop, rep, progress_at,
                                   out_of_time, steps_epoch, ckpt, meta, group)  # fmt: skip
                noise = None
                # An epoch cut by the budget counts its share of the (estimated) steps, below 1.
                state.epochs_exact = round(epoch + (1.0 if whole else min(0.99, state.step_in_epoch / steps_epoch)), 2)
                t_eval = timer()
                holdout = holdout_accuracy(model)
                pieces.release_memory()  # the epoch's and the evaluation's freed activations (counted with the evaluation)
                state.eval_time_s += float(group.share(timer() - t_eval))  # type: ignore[arg-type]
                record = {
                    "event": "epoch",
                    "epoch": epoch + 1,
                    "steps": state.step,
                    "train_loss": state.loss_sum / max(state.seen, 1),
                    "train_acc": state.correct / max(state.seen, 1),
                    "holdout_acc": holdout,
                    "train_time_s": round(state.train_time_s, 3),
                    "clock": s.clock,
                }
                if not whole:
                    record["epoch_fraction"] = round(state.epochs_exact - epoch, 2)
                state.history.append(record)  # type: ignore[union-attr]
                state.epoch, state.step_in_epoch, state.seen, state.correct, state.loss_sum = epoch + 1, 0, 0, 0, 0.0
                if group.main:
                    save_checkpoint(ckpt, model, opt, state, meta)
                rep.event(record)
    finally:
        rep.close()
    return state


def _run_epoch(model, task, opt, loss_fn, s, state, epoch, noise, stop, rep, progress_at, out_of_time,
               steps_epoch, ckpt, meta, group) -> bool:  # fmt: skip
    """One epoch from state.step_in_epoch on; updates `state` in place; Ctrl-C saves and raises. Returns
    False when the time budget cut the epoch short."""
    model.train()
    reseed_noise(model, s.seed, epoch)
    if noise is not None:  # resumed mid-epoch: the noise streams continue where they were
        for g, st in zip(_attention_generators(model), noise, strict=True):
            g.set_state(st)
    batches = iter(task.train_batches(s.batch_size, torch.Generator().manual_seed(s.seed * 1000 + epoch)))
    for _ in range(state.step_in_epoch):  # replays the generator's draws (order, augmentation) untrained
        next(batches)
    timer = clock_fn(s.clock)
    max_tokens = getattr(task, "tokens_per_batch", None)  # text: the plan's token budget
    t0, base = timer(), state.train_time_s
    first = None  # seconds at the end of the first step (epoch 0, not resumed)
    for batch_inputs, batch_labels, *_ in batches:
        elapsed = state.train_time_s  # the clock as of the last step (the same in every process)
        for param_group in opt.param_groups:
            param_group["lr"] = s.lr * warmup_cosine(progress_at(elapsed), s.warmup)
        inputs, labels, share = group.shard(batch_inputs, batch_labels)
        opt.zero_grad(set_to_none=True)
        if len(labels):  # a batch past the plan's token budget in pieces: the same gradient, less memory
            correct, loss_sum = pieces.train_step(model, inputs, labels, loss_fn, share, max_tokens)
        else:  # a batch smaller than the group: this process adds zero gradients
            correct, loss_sum = 0, 0.0
        group.reduce_gradients(model)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        correct, loss_sum, seen, now, stopping = group.reduce_step(
            correct, loss_sum, len(labels), base + timer() - t0, stop.set
        )
        state.step += 1
        state.step_in_epoch += 1
        state.seen += seen
        state.correct += correct
        state.loss_sum += loss_sum
        rep.step(s.spent_s + now if s.epochs is None and s.time_budget_s else state.step, state.loss_sum / state.seen,
                 state.correct / state.seen)  # fmt: skip
        state.train_time_s = now
        if epoch == 0 and state.step_in_epoch == 1:
            first = now
        probe = max(_PROBE_MIN, round(_PROBE_SHARE * steps_epoch))
        if epoch == 0 and first is not None and (state.step_in_epoch == min(probe, steps_epoch) or out_of_time(now)):
            rate = (now - first) / (state.step_in_epoch - 1) if state.step_in_epoch > 1 else now
            if group.main:
                _check_budget(s, first + rate * (steps_epoch - 1))
        if stopping:
            if group.main:
                save_checkpoint(ckpt, model, opt, state, meta)
            raise TrainingStopped(f"interrupted at step {state.step}; checkpoint saved in {ckpt}")
        if out_of_time(now):
            return next(batches, None) is None  # the budget ran out on the epoch's last step: still whole
    return True


def _check_budget(s: FitSettings, epoch_s: float) -> None:
    """After the first steps: when what the budget leaves for training holds less than the epoch, say so and
    train that part of it. Never a refusal here, after the work before training: a budget too small for the
    whole run is refused before any work (lara_serve.model_export.your_data.budget), on an estimate this
    projection refines."""
    if s.time_budget_s is None:
        return
    share = 1.0 + s.reserve_per_s  # the matched baseline trains as long again after it
    left = (s.time_budget_s - s.reserve_s - s.spent_s) / share
    if epoch_s > left:
        print(
            f"warning: one epoch takes about {epoch_s / 60:.2f} min here and the budget leaves "
            f"{max(left, 0.0) / 60:.2f} min for training: training {max(left, 0.0) / epoch_s:.0%} of an epoch; a "
            f"larger --time-budget trains more (one whole epoch: about "
            f"{math.ceil((s.time_budget_s + (epoch_s - left) * share) / 6.0) / 10.0:g})",
            file=sys.stderr,
        )
