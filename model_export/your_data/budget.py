"""The time budget of `lara train`: every phase timed, the phases after training reserved before it starts.

--time-budget covers the whole run on the run's clock (wall or this process's CPU seconds): the wide path,
the plain baseline, training, then the holdout blend, calibration, the ood fit, export and the report. An image
run has no wide path and no blend, and its baseline (a small CNN) trains after the encoder for as long as the
encoder trained: the budget keeps that second's worth for every second trained (`Plan.baseline_share`).
Before any of it, a probe times a few training batches and a forward pass of the model on this machine;
with the data's sizes that gives an estimate of each phase (`Plan`). A budget below the estimate of one
epoch plus every other phase is refused then, in one line with the least budget that fits. Training gets
the budget less what the phases before it spent and less the estimate of the phases after it (the reserve),
so the run ends within the budget (+10%, the target docs/train-your-data.md states and measures).

Everything after training reads a bounded amount: the holdout and test documents (a fixed share of the data)
and a seeded sample of the training documents for the ood fit (OOD_FIT_DOCS documents, OOD_FIT_BYTES bytes
at most), so its time is linear in the data and its memory bounded whatever the data's size.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lara_serve.model_export.training.long_docs import length_batches
from lara_serve.model_export.your_data import pieces
from lara_serve.model_export.your_data.dist import Group
from lara_serve.model_export.your_data.fit import BudgetTooSmall, FitSettings
from lara_serve.model_export.your_data.pieces import release_memory

# The ood fit (lara_serve.model_export.head.finalize.serving_sections) reads at most this many training documents,
# each whole and as its first 512 and 2,048 bytes, and at most this many bytes of them: its covariance needs
# hundreds of feature vectors, not every document (the issue measured 19 CPU-minutes over all of them).
OOD_FIT_DOCS = 1000
OOD_FIT_BYTES = 4 << 20  # 64 whole documents of 64 KB: forward passes over them cost minutes on 2 cores
# Images: at most this many training images (a 60,000-image set's features and logits would otherwise be held
# whole; 10,000 vectors estimate a 192-dim covariance per class as well as the fit needs).
OOD_FIT_IMAGES = 10_000
# Seconds of the phases whose cost does not grow with the data (CPU seconds measured on 2 cores, rounded
# up): ONNX export with its checks and the comparison run (17 s for the default text model, 6 s for the default
# image model on 32x32 digits), the report.
EXPORT_S, REPORT_S, IMAGE_EXPORT_S = 25.0, 5.0, 10.0
# Forward passes after training, per document the phase reads (lara_serve.model_export.your_data.wide.attach and
# lara_serve.model_export.your_data.artifact.serving_head): the holdout and test splits 3x (the blend, then logits
# and pooled features), the ood sample's cuts (whole, first 512 and 2,048 bytes) 2x; the holdout once more for
# the last epoch's evaluation, which runs after the budget has cut training. Images: no blend, so holdout, test
# and training images 2x each, the holdout once more.
HOLDOUT_PASSES, TEST_PASSES, OOD_PASSES = 4, 3, 2
IMAGE_PASSES = (3, 2, 2)
# Seconds of the image baseline besides its training (it trains for the encoder's training time): building
# the CNN and scoring the test split (well under a second for thousands of 32x32 images, measured).
IMAGE_BASELINE_S = 2.0
SAFETY = 1.25  # estimates are multiplied by this: padding in length-sorted batches, a busy machine
EVAL_BATCH = 8  # documents per batch after training (lara_serve.model_export.head.finalize.text_outputs)
PROBE_TOKENS = 16384  # tokens (text) the probe trains on, at least one batch (about 5 s of a 4-minute budget)


@dataclass
class Phases:
    """Seconds per phase on the run's clock, in the order they ran (config.json training.phases_s). `origin`:
    the clock's reading when the run began (0 for the CPU clock: the process's CPU seconds, imports and
    reading the data included)."""

    clock: Callable[[], float]
    origin: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)
    peak_rss_mib: dict[str, float] = field(default_factory=dict)  # the process's peak RSS when each phase ended

    def elapsed(self) -> float:
        """Seconds of the run so far, every phase and what ran between them."""
        return self.clock() - self.origin

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = self.clock()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + self.clock() - t0, 2)
            # A phase entered again (text: the baseline fitted before training, its result taken after it)
            # keeps the peak of its first end: overwritten, it showed training's peak beside the baseline.
            self.peak_rss_mib.setdefault(name, peak_rss_mib())

    def total(self) -> float:
        return round(sum(self.seconds.values()), 2)


@dataclass(frozen=True)
class Plan:
    """The estimate of each phase (seconds on the run's clock), made before any work."""

    probe_s: float
    wide_s: float
    baseline_s: float  # the text baseline's fit, before training
    epoch_s: float
    after_s: float  # everything after training: blend, serving head, the image baseline's fixed part, export, report
    # Seconds of baseline training per second of the encoder's training (images: 1, the CNN gets equal time;
    # text: 0). Training ends where it and this share of it fill what the budget leaves.
    baseline_share: float = 0.0

    def least_budget_min(self) -> float:
        """The smallest --time-budget (minutes, rounded up to 0.1) that holds one epoch and every other phase."""
        need = self.probe_s + self.wide_s + self.baseline_s + self.epoch_s * (1.0 + self.baseline_share) + self.after_s
        return math.ceil(need / 6.0) / 10.0

    def record(self) -> dict[str, float]:
        return {k: round(v, 1) for k, v in self.__dict__.items()}


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, MiB (0 where the platform does not say)."""
    try:
        import resource
    except ImportError:  # not on Linux or macOS
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20) if sys.platform == "darwin" else peak / 1024, 1)  # bytes on macOS, KiB on Linux


def ood_sample(
    lengths: Sequence[int], seed: int, max_docs: int = OOD_FIT_DOCS, max_bytes: int = OOD_FIT_BYTES
) -> list[int]:
    """Indices (ascending) of a seeded sample of documents for the ood fit: at most max_docs of them and at most
    max_bytes together (`lengths` as the fit reads them, cut at max_length); at least one document."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    kept, total = [], 0
    for i in order[:max_docs]:
        if kept and total + lengths[i] > max_bytes:
            continue
        kept.append(i)
        total += lengths[i]
    return sorted(kept)


def epoch_tokens(task: Any) -> int:
    """Padded tokens (text: length x count per batch) of one epoch of a LengthMixTask's plan; images: images."""
    if hasattr(task, "_plan"):
        return sum(max(len(raw) for raw, _, _ in batch) * len(batch) for batch in task._plan(0))
    return len(task)


def _units(inputs: dict[str, torch.Tensor]) -> int:
    x = inputs.get("input_ids", inputs.get("pixel_values"))
    return int(x.shape[0] * x.shape[1]) if "input_ids" in inputs else int(x.shape[0])  # type: ignore[union-attr]


def probe(model: nn.Module, task: Any, batch_size: int, clock: Callable[[], float]) -> tuple[float, float]:
    """(seconds per training unit, seconds per forward unit) on this machine: a few of the epoch's batches
    trained (gradients dropped, no optimizer step) and run forward; text also the longest batch of whole
    documents the phases after training read, the slower rate kept. Units: padded tokens (text), images.
    The weights, the RNG streams and the model's mode are as before: the run trains exactly as without it."""
    batches = iter(task.train_batches(batch_size, torch.Generator().manual_seed(12345)))
    taken, units = [], 0
    for inputs, *_ in batches:
        taken.append(inputs)
        units += _units(inputs)
        if units >= PROBE_TOKENS or len(taken) >= 4:
            break
    was_training = model.training
    with torch.random.fork_rng(devices=[]):
        model.train()
        t0 = clock()
        for inputs in taken:  # in the pieces training computes (lara_serve.model_export.your_data.pieces)
            for _, piece in pieces.split(inputs, getattr(task, "tokens_per_batch", None)):
                model(**piece).float().logsumexp(-1).sum().backward()
        train_s = clock() - t0
        model.zero_grad(set_to_none=True)
        model.eval()
        with torch.inference_mode():
            model(**taken[0])  # the first inference call pays one-time costs (measured: 2x the rate after)
            t0 = clock()
            for inputs in taken:
                model(**inputs)
            forward_s = clock() - t0
    model.train(was_training)
    return train_s / max(units, 1), forward_s / max(units, 1)


def whole_document_rate(model: nn.Module, task: Any, clock: Callable[[], float]) -> float:
    """Seconds per padded token of one forward pass over the longest evaluation batch of a text task's training
    documents (cut at max_length, batched as the blend, the holdout and the serving head batch them): the
    slowest per token those phases meet (activations past 32 MiB are each mapped and page-faulted afresh by
    glibc, an overhead the training batches' rate does not show)."""
    cut = [d[: task.eval_length] for d in task.docs]
    inputs, _ = deque(length_batches(cut, [0] * len(cut), EVAL_BATCH), maxlen=1)[0]  # sorted: the last is longest
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            t0 = clock()
            model(**inputs)
            return (clock() - t0) / max(_units(inputs), 1)
    finally:
        model.train(was_training)


def make_plan(
    model: nn.Module, task: Any, batch_size: int, clock: Callable[[], float], units: dict[str, int], classes: int
) -> Plan:
    """The estimate of every phase. `units`: "holdout", "test", "ood" (what the phases after training read: text
    tokens cut at max_length, or images), "train_bytes" and "train_docs" (text; 0 for images), "wide" and
    "baseline" (1 when the run fits them before training, else 0), "matched_baseline" (1 when a baseline
    trains after the encoder for as long as it did: images). The text model's wide path is out of the model
    while the probe runs, as while the encoder trains."""
    t0 = clock()
    wide_head = getattr(model, "tfidf", None)
    if wide_head is not None:
        model.tfidf = None
    try:
        train_rate, forward_rate = probe(model, task, batch_size, clock)
        text = hasattr(task, "eval_length")
        after_rate, safety = forward_rate, SAFETY
        # Text: documents from heads to max_length cost between the training batches' rate and the longest
        # batch's (speeches, CPU us/token: 13-16.5 and 22; the serving head averaged 16.5, where the training
        # batches' rate with the 25% margin had left the phases after training 13% short).
        if text:
            after_rate, safety = (forward_rate + whole_document_rate(model, task, clock)) / 2, 1.0
    finally:
        if wide_head is not None:
            model.tfidf = wide_head
    probe_s = clock() - t0
    matched = bool(units.get("matched_baseline", 0))
    if text:
        passes, fixed = (HOLDOUT_PASSES, TEST_PASSES, OOD_PASSES), EXPORT_S + REPORT_S
    else:  # images: no blend; the matched baseline runs after training, its fixed part reserved there
        passes, fixed = IMAGE_PASSES, IMAGE_EXPORT_S + REPORT_S + (IMAGE_BASELINE_S if matched else 0.0)
    return Plan(
        probe_s=probe_s,
        wide_s=wide_s(units["train_bytes"], units["train_docs"], classes) if units["wide"] else 0.0,
        baseline_s=baseline_s(units["train_bytes"], units["train_docs"], classes) if units["baseline"] else 0.0,
        epoch_s=SAFETY * train_rate * epoch_tokens(task) + after_rate * units["holdout"],
        after_s=after_training_s(after_rate, units["holdout"], units["test"], units["ood"], passes, fixed, safety),
        baseline_share=1.0 if matched else 0.0,
    )


def after_training_s(
    forward_per_unit: float,
    holdout: int,
    test: int,
    ood: int,
    passes: tuple[int, int, int] = (HOLDOUT_PASSES, TEST_PASSES, OOD_PASSES),
    fixed_s: float | None = None,
    safety: float = SAFETY,
) -> float:
    """Estimated seconds of everything after training, from the forward rate and the documents' sizes
    (tokens, each cut at max_length; images: counts) read `passes` times each (holdout, test, ood), plus
    `fixed_s`, what does not grow with the data (default: the text model's export and the report), the
    forward time multiplied by `safety`."""
    units = passes[0] * holdout + passes[1] * test + passes[2] * ood
    return safety * forward_per_unit * units + (EXPORT_S + REPORT_S if fixed_s is None else fixed_s)


def wide_s(train_bytes: int, docs: int, classes: int) -> float:
    """Estimated seconds of the wide path's fit (lara_serve.model_export.your_data.wide): gram counting linear in
    the bytes, then 13 logistic regressions on at most CV_MAX_EXAMPLES documents, each costing about their number
    times the weight columns (one for two classes). Fitted on 2 cores, CPU seconds: 22 s measured for 1,440
    subject lines of 2 classes (31 estimated), 141 s for 1,440 messages of 5 classes in ~100 languages (144)."""
    columns = classes if classes > 2 else 1
    return SAFETY * (train_bytes * 2e-6 + 13 * min(docs, 2000) * columns * 1.2e-3 + 2.0)


def baseline_s(train_bytes: int, docs: int, classes: int) -> float:
    """Estimated seconds of the text baseline (TF-IDF word 1-2-grams + logistic regression): one fit. Per byte
    as the hashed grams cost (lara_serve.model_export.your_data.baseline: 2.1-4.2 s on 5.6 MB of speeches, where
    the vocabulary version's 3e-6 s/byte estimated 24 s); per document and class 38 s for 1,440 texts, 5 classes."""
    return SAFETY * (train_bytes * 1e-6 + docs * max(classes, 2) * 4e-3 + 1.0)


def check_first(prep: Any, settings: FitSettings, phases: Phases, group: Group, budget_min: float | None,
                clock: str) -> Plan | None:  # fmt: skip
    """With a time budget: the estimate of every phase (a few seconds of probing) for `prep` (a
    lara_serve.model_export.your_data.command.Prepared), and BudgetTooSmall now, before any work, when the
    budget cannot hold one epoch and the rest of the run. Every process of a group uses process 0's plan."""
    if settings.time_budget_s is None or budget_min is None:
        return None
    with phases.phase("probe"):
        plan = make_plan(prep.model, prep.train_task, settings.batch_size, phases.clock, prep.units, len(prep.names))
    release_memory()  # the probe's activations, before the wide path and the baseline allocate theirs
    plan = group.share(plan)  # type: ignore[assignment]
    least = plan.least_budget_min()
    if least > budget_min:
        p = plan.record()
        raise BudgetTooSmall(
            f"--time-budget {budget_min:g} min is too small to finish one epoch here with the rest of the run "
            f"(estimated on the {clock} clock: one epoch {p['epoch_s']:.0f} s, wide path {p['wide_s']:.0f} s, "
            f"baseline {p['baseline_s'] + p['baseline_share'] * p['epoch_s']:.0f} s, after training "
            f"{p['after_s']:.0f} s); use --time-budget {least:g} "
            "or more",
            least,
        )
    prep.hp["budget_plan_s"] = plan.record()
    return plan


def record_time(stage: Path, phases: Phases, budget_min: float | None) -> None:
    """Every phase's seconds, the report's own included (known only once it is written), and the whole run's,
    into config.json's and report.json's "training" sections in `stage`."""
    for name in ("config.json", "report.json"):
        path = stage / name
        doc = json.loads(path.read_text())
        doc["training"]["phases_s"] = phases.seconds
        doc["training"]["peak_rss_mib"] = phases.peak_rss_mib
        doc["training"]["run_s"] = round(phases.elapsed(), 1)
        doc["training"]["time_budget_s"] = None if budget_min is None else budget_min * 60.0
        path.write_text(json.dumps(doc, indent=2) + "\n")
