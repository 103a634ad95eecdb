"""pretrained.outlier_probe: excerpts of the stated lengths, seeded; the selection keeps a probe only when it
separates held-out negatives better than the Mahalanobis score alone, and its threshold passes 95% of the
holdout on the combined score."""

from __future__ import annotations

import random

import torch

from lara_serve.model_export.head.finalize import PASS_RATE
from lara_serve.model_export.models.ood import MahalanobisScore
from lara_serve.model_export.pretrained import outlier_probe as op


def test_excerpts_are_seeded_and_within_the_stated_lengths() -> None:
    texts = [" ".join(f"word{i}" for i in range(3000)), "short text " * 30]
    a = op.excerpts(texts, 4, random.Random(0))
    assert a == op.excerpts(texts, 4, random.Random(0))
    assert len(a) >= 4 and all(op.EXCERPT_BYTES[0] // 2 <= len(e) <= op.EXCERPT_BYTES[1] for e in a)
    assert all(not e.startswith(" ") for e in a)


def _gauss(n: int, mean: torch.Tensor, std: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return mean + std * torch.randn(n, mean.numel(), generator=g)


D = 128  # many directions of noise: one direction of difference barely moves a Mahalanobis distance
E = torch.eye(D)
WIDE = torch.ones(D) + 2.0 * E[1]  # the training data spread 3x wider along e1 than elsewhere


def _fit_and_val() -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, list[str]]]:
    fit = torch.cat([_gauss(200, 3 * E[0], WIDE, 0), _gauss(200, -3 * E[0], WIDE, 1)])
    val = torch.cat([_gauss(100, 3 * E[0], WIDE, 2), _gauss(100, -3 * E[0], WIDE, 3)])
    return fit, torch.arange(400) // 200, (val, ["whole"] * 100 + ["headline"] * 100)


def test_selection_keeps_a_probe_that_finds_what_the_class_means_miss() -> None:
    """Negatives near a class mean but 12 along the wide direction e1 (4 standard deviations there: the
    Mahalanobis distance barely moves), tightly: a linear direction finds them, on held-out negatives."""
    fit, labels, val = _fit_and_val()
    off, tight = 3 * E[0] + 12 * E[1], torch.ones(D) - 0.7 * E[1]
    train_neg = {"a": _gauss(150, off, tight, 4)}
    sel_neg = {"b": _gauss(100, off, tight, 5), "c": _gauss(100, off, tight, 6)}
    ood = MahalanobisScore.fit(fit, labels)
    chosen = op.select(ood, fit, val, train_neg, sel_neg)
    assert chosen["probe"] is not None and chosen["choice"] in op.C_GRID
    row = chosen["table"][f"C={chosen['choice']:g}"]
    assert chosen["table"]["mahalanobis"]["mean_auroc"] < 0.9
    assert row["mean_auroc"] > 0.95
    s = op.combined(ood(val[0]), chosen["probe"](val[0]), chosen["scales"])
    assert abs(float((s <= chosen["threshold"]).double().mean()) - PASS_RATE) <= 0.01


def test_selection_keeps_nothing_when_the_class_means_already_separate() -> None:
    fit, labels, val = _fit_and_val()
    ood = MahalanobisScore.fit(fit, labels)
    far = {"b": _gauss(100, 12 * E[3], torch.ones(D), 5)}  # far from both means along a narrow direction
    like = {"a": _gauss(150, 3 * E[0], WIDE, 7)}  # negatives drawn as the training data: nothing to learn
    chosen = op.select(ood, fit, val, like, far)
    assert chosen["table"]["mahalanobis"]["mean_auroc"] >= 0.999
    assert chosen["probe"] is None and chosen["choice"] is None
