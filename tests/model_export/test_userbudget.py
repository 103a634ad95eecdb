"""`lara train`'s budget and recipes (issue 54): the recipe chosen from the data's lengths, a bounded ood fit,
the phases after training reserved out of the budget, a too-small budget refused before any work."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from user_samples import TINY_IMAGE, TINY_TEXT, write_images, write_texts

from lara_serve.model_export.models.registry import build_model, get_config
from lara_serve.model_export.training.long_docs import LengthMixTask
from lara_serve.model_export.training.tasks import ImageTask
from lara_serve.model_export.your_data import budget, recipe
from lara_serve.model_export.your_data import fit as userfit
from lara_serve.model_export.your_data import wide as userwide
from lara_serve.model_export.your_data.command import main as train_main


def test_the_recipe_follows_the_median_length() -> None:
    assert recipe.choose([40, 300, 900])["recipe"] == "short"
    assert recipe.choose([40, 2000, 30_000])["recipe"] == "robust"
    assert recipe.choose([100] * 3 + [50_000] * 4)["median_bytes"] == 50_000
    short, robust = recipe.length_mix(65536, "short"), recipe.length_mix(65536)
    assert short["composite_prob"] == 0.0 and short["max_length"] <= recipe.SHORT_WINDOW < robust["max_length"]
    assert robust["composite_prob"] > 0.0
    aug = recipe.text_augment(65536, kind="short")
    assert aug is not None and aug.filler_max_ratio <= 1.0 and aug.max_total <= recipe.SHORT_WINDOW


def test_an_epoch_of_short_texts_costs_a_fraction_under_the_short_recipe() -> None:
    """Issue 54: 400-byte texts under the long-document recipe (composites of 4-16 KB, filler up to 8x) cost
    minutes an epoch; the short recipe trains on about what the texts are."""
    docs = [(b"word%d " % i) * 60 for i in range(200)]  # ~400 bytes each
    labels = torch.tensor([i % 2 for i in range(200)])
    tokens = {}
    for kind in ("short", "robust"):
        task = LengthMixTask(docs, labels, 65536, **recipe.length_mix(65536, kind))
        task.text_augment = recipe.capped(recipe.text_augment(65536, kind=kind), 65536)  # type: ignore[arg-type]
        tokens[kind] = budget.epoch_tokens(task)
    assert tokens["short"] * 4 < tokens["robust"]
    assert tokens["short"] < 2.5 * sum(map(len, docs))


def test_the_ood_fit_reads_a_bounded_seeded_sample() -> None:
    lengths = [1000] * 5000
    sample = budget.ood_sample(lengths, seed=0)
    assert len(sample) == budget.OOD_FIT_DOCS and sample == sorted(sample) and sample == budget.ood_sample(lengths, 0)
    assert sample != budget.ood_sample(lengths, seed=1)
    assert sum(lengths[i] for i in budget.ood_sample([65536] * 1000, 0)) <= budget.OOD_FIT_BYTES
    assert budget.ood_sample([10] * 7, 0) == list(range(7))  # small data: every document
    assert len(budget.ood_sample([10 * budget.OOD_FIT_BYTES], 0)) == 1  # at least one document


def test_the_least_budget_holds_every_phase() -> None:
    plan = budget.Plan(probe_s=5.0, wide_s=30.0, baseline_s=10.0, epoch_s=200.0, after_s=60.0)
    assert plan.least_budget_min() == 5.1  # 305 s, rounded up to a tenth of a minute


def test_training_stops_where_the_reserve_begins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """30 s budget, 10 s reserved for the phases after training, 4 s spent before: training and its holdout
    evaluations end at 20 s on the run's clock, the learning-rate schedule complete there."""
    docs = [(b"goal " if i % 2 else b"chip ") * (20 + i) for i in range(40)]
    task = LengthMixTask(docs, torch.tensor([i % 2 for i in range(40)]), 1024, min_length=32, max_length=256,
                         tokens_per_batch=256)  # fmt: skip
    ticks = {"cpu": 0.0}

    def cpu() -> float:
        ticks["cpu"] += 0.5
        return ticks["cpu"]

    monkeypatch.setattr(userfit.time, "process_time", cpu)
    lrs: list[float] = []
    monkeypatch.setattr(userfit, "warmup_cosine", lambda progress, warmup: lrs.append(progress) or 1.0)
    settings = userfit.FitSettings(lr=1e-3, weight_decay=0.0, label_smoothing=0.0, batch_size=0, epochs=None,
                                   time_budget_s=30.0, seed=1, clock="cpu", spent_s=4.0, reserve_s=10.0)  # fmt: skip
    model = build_model(get_config("tiny-text", num_classes=2, max_length=1024), seed=1)
    state = userfit.fit(model, task, lambda m: 0.5, settings, tmp_path / "c", {}, progress="quiet")
    used = settings.spent_s + state.train_time_s + state.eval_time_s
    assert 20.0 <= used <= 21.5 and state.eval_time_s > 0
    assert max(lrs) == pytest.approx(1.0, abs=0.06)  # the schedule's progress reaches its end at 20 s, not 30


def test_a_budget_too_small_for_the_run_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_texts(tmp_path / "d.jsonl", per_label=20)

    def no_fit(*a, **k):
        raise AssertionError("the wide path was fitted before the budget was checked")

    monkeypatch.setattr(userwide, "detach_and_fit", no_fit)
    args = [str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m"), *TINY_TEXT, "--time-budget", "0.2"]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --time-budget 0.2 min is too small")
    least = float(err[0].split("use --time-budget ")[1].split()[0])
    assert least > 0.2 and "after training" in err[0]  # the phases after training count
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]  # nothing written, no work folder


def test_the_run_records_its_phases_recipe_and_served_part(tmp_path: Path) -> None:
    write_texts(tmp_path / "d.jsonl", per_label=12)
    out = tmp_path / "m"
    assert train_main([str(tmp_path / "d.jsonl"), "--out", str(out), *TINY_TEXT, "--epochs", "1"]) == 0
    conf = json.loads((out / "config.json").read_text())
    assert conf["preprocessing"]["truncate"] == "head"  # trained on heads: served so unless a request says no
    training = conf["training"]
    assert {"wide", "baseline", "training", "blend", "serving head", "export", "report"} <= set(training["phases_s"])
    assert training["run_s"] >= sum(training["phases_s"].values()) - 1.0
    assert training["recipe_choice"]["recipe"] == "short" and "short text" in training["recipe"]
    assert training["ood_fit"]["documents"] == training["ood_fit"]["of"]  # small data: all of it
    served = conf["metrics"]["parts"]["served"]
    assert served["part"] in ("blend", "wide", "encoder") and served["why"]
    report = (out / "report.md").read_text()
    assert "Recipe: short" in report and f"| {served['part'].replace('wide', 'wide path')} (served) |" in report
    assert "Time by phase" in report


def _ticking_cpu(monkeypatch: pytest.MonkeyPatch, tick: float) -> None:
    """The CPU clock as a counter that every reading advances by `tick` seconds: a run's phases then cost what
    the code reads of the clock (a step of training or of the baseline: one reading), whatever the machine's load."""
    ticks = {"cpu": 0.0}

    def cpu() -> float:
        ticks["cpu"] += tick
        return ticks["cpu"]

    monkeypatch.setattr(userfit.time, "process_time", cpu)  # the time module: fit, baseline and budget read it


def test_an_image_plan_reserves_the_baseline_that_trains_as_long_as_the_encoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 54: an image run's baseline (a small CNN) trains after the encoder for the encoder's training time;
    the plan counts it per second trained, and the image phases after training read each split twice."""
    _ticking_cpu(monkeypatch, 0.5)
    images = torch.randint(0, 256, (32, 1, 12, 12), dtype=torch.uint8)
    task = ImageTask(images, torch.tensor([i % 2 for i in range(32)]), 0.5, 0.25)
    model = build_model(get_config("tiny-vit", num_classes=2, image_size=12, in_chans=1), seed=0)
    units = {"holdout": 8, "test": 8, "ood": 32, "train_bytes": 0, "train_docs": 0, "wide": 0, "baseline": 0}
    plans = [budget.make_plan(model, task, 8, time.process_time, {**units, "matched_baseline": m}, 2) for m in (0, 1)]
    alone, matched = plans
    assert (alone.baseline_share, matched.baseline_share) == (0.0, 1.0)
    assert matched.epoch_s == alone.epoch_s and matched.epoch_s > 0
    assert matched.after_s == pytest.approx(alone.after_s + budget.IMAGE_BASELINE_S)
    _, forward = budget.probe(model, task, 8, time.process_time)  # per image: the same readings, the same rate
    fixed = budget.IMAGE_EXPORT_S + budget.REPORT_S
    assert alone.after_s == pytest.approx(budget.after_training_s(forward, 8, 8, 32, (3, 2, 2), fixed))  # no blend
    need = matched.probe_s + 2 * matched.epoch_s + matched.after_s  # one epoch for each of the two models
    assert matched.least_budget_min() == math.ceil(need / 6.0) / 10.0
    assert alone.least_budget_min() == math.ceil((alone.probe_s + alone.epoch_s + alone.after_s) / 6.0) / 10.0


def test_an_image_run_ends_within_its_budget_the_baseline_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54: image runs took up to 2x --time-budget, the baseline training after the budget's end for as
    long as the encoder had trained. With every reading of the CPU clock one second, the whole run (probe,
    training with its holdout evaluations, serving head, baseline, export, report) ends within the budget and
    the baseline trains as long as the encoder did."""
    write_images(tmp_path / "images", per_label=40)  # 28 steps an epoch of 2: the epoch's own readings are few
    monkeypatch.setattr(budget, "IMAGE_EXPORT_S", 2.0)  # the phases that read the clock a few times cost seconds
    monkeypatch.setattr(budget, "REPORT_S", 2.0)
    monkeypatch.setattr(budget, "OOD_FIT_IMAGES", 30)  # the ood fit reads a seeded sample of the training images
    _ticking_cpu(monkeypatch, 1.0)
    out = tmp_path / "m"
    args = [str(tmp_path / "images"), "--out", str(out), *TINY_IMAGE, "--time-budget", "1.5", "--clock", "cpu",
            "--batch-size", "2"]  # fmt: skip
    assert train_main(args) == 0
    conf = json.loads((out / "config.json").read_text())
    training, trained = conf["training"], conf["metrics"]["train_time_s"]
    phases = training["phases_s"]
    assert training["budget_plan_s"]["baseline_share"] == 1.0
    assert training["ood_fit"]["images"] == 30 and training["ood_fit"]["of"] > 30
    assert training["run_s"] <= 90.0 * 1.1, phases  # was 90 s + the baseline's training time
    assert trained > 15.0 and trained <= phases["baseline"] <= trained + 5.0, phases  # the same time, a step more


def test_the_text_baseline_fits_only_the_filled_buckets_with_the_same_answers() -> None:
    """baseline.text_baseline drops the hashed columns no training text fills (memory of L-BFGS); the
    probabilities equal a fit over every column (L2: an all-zero column's weight stays 0)."""
    import numpy as np
    from sklearn.feature_extraction.text import HashingVectorizer, TfidfTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    from lara_serve.model_export.your_data.baseline import HASHED_FEATURES, text_baseline

    words = ["market", "shares", "goal", "match", "film", "actor", "code", "chip", "vote", "party"]
    rng = np.random.default_rng(0)
    train = [" ".join(rng.choice(words[2 * (i % 5) : 2 * (i % 5) + 2], 6)) + f" x{i}" for i in range(40)]
    test = [" ".join(rng.choice(words, 5)) + " unseen" for _ in range(10)]
    y = [i % 5 for i in range(40)]
    got, _ = text_baseline([t.encode() for t in train], y, [t.encode() for t in test])
    vec = make_pipeline(HashingVectorizer(ngram_range=(1, 2), n_features=HASHED_FEATURES, alternate_sign=False,
                                          norm=None), TfidfTransformer(sublinear_tf=True))  # fmt: skip
    full = LogisticRegression(C=10.0, max_iter=2000).fit(vec.fit_transform(train), y)
    np.testing.assert_allclose(got, full.predict_proba(vec.transform(test)), atol=1e-6)


def test_the_cnn_baselines_learning_rate_anneals_to_zero_over_its_budget() -> None:
    """baseline.image_baseline's rate: the full rate at the start, half at mid-budget, 0 at and past the end
    (its last step is where training settled, not a draw from the constant rate's oscillation)."""
    from lara_serve.model_export.your_data.baseline import LR, annealed_lr

    assert annealed_lr(LR, 0.0) == pytest.approx(LR) and annealed_lr(LR, -1.0) == pytest.approx(LR)
    assert annealed_lr(LR, 0.5) == pytest.approx(LR / 2)
    assert annealed_lr(LR, 1.0) == pytest.approx(0.0, abs=1e-12) and annealed_lr(LR, 3.0) == pytest.approx(
        0.0, abs=1e-12
    )
    rates = [annealed_lr(LR, k / 20) for k in range(21)]
    assert all(a > b for a, b in zip(rates, rates[1:], strict=False))
