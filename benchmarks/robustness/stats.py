"""Figures with their uncertainty: every number the suite reports carries n and a 95% interval.

- accuracies and shares: Wilson score interval;
- AUROC: Mann-Whitney estimate (ties count one half) with the Hanley-McNeil (1982) standard error;
- ECE: percentile bootstrap over items (seeded).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lara_serve.model_export.head.calibration import ECE_BINS, expected_calibration_error

Z95 = 1.959963984540054


def figure(value: float, n: int, lo: float, hi: float, interval: str) -> dict[str, Any]:
    return {"value": round(value, 4), "n": n, "lo": round(lo, 4), "hi": round(hi, 4), "interval": interval}


def wilson(k: int, n: int) -> dict[str, Any]:
    """The share k/n with its 95% Wilson score interval."""
    if n <= 0:
        raise ValueError("a share needs n > 0")
    p = k / n
    den = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / den
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / den
    return figure(p, n, max(0.0, centre - half), min(1.0, centre + half), "wilson")


def accuracy(pred: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    return wilson(int((np.asarray(pred) == np.asarray(labels)).sum()), len(labels))


def auroc_value(in_scores: np.ndarray, out_scores: np.ndarray) -> float:
    """P(score of a random out-of-domain item > score of a random in-distribution item), ties counting 1/2:
    1.0 separates perfectly, 0.5 is chance. Ranks of the pooled scores (average ranks for ties)."""
    a, b = np.asarray(in_scores, np.float64), np.asarray(out_scores, np.float64)
    if len(a) == 0 or len(b) == 0:
        raise ValueError("AUROC needs at least one item on each side")
    pooled = np.concatenate([a, b])
    order = np.argsort(pooled, kind="mergesort")
    ranks = np.empty(len(pooled))
    sorted_scores = pooled[order]
    i = 0
    while i < len(pooled):  # average rank over each run of equal scores
        j = i
        while j + 1 < len(pooled) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = ranks[len(a) :].sum() - len(b) * (len(b) + 1) / 2
    return float(u / (len(a) * len(b)))


def auroc(in_scores: np.ndarray, out_scores: np.ndarray) -> dict[str, Any]:
    """AUROC with the Hanley-McNeil 95% interval; n is the out-of-domain set's size (n_in beside it)."""
    auc = auroc_value(in_scores, out_scores)
    n1, n2 = len(out_scores), len(in_scores)
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n1 - 1) * (q1 - auc * auc) + (n2 - 1) * (q2 - auc * auc)) / (n1 * n2)
    half = Z95 * math.sqrt(max(var, 0.0))
    return {**figure(auc, n1, max(0.0, auc - half), min(1.0, auc + half), "hanley-mcneil"), "n_in": n2}


def ece(probs: np.ndarray, labels: np.ndarray, resamples: int = 300, seed: int = 0) -> dict[str, Any]:
    """Expected calibration error (15 bins) with a percentile bootstrap 95% interval, widened to hold the value:
    resampling duplicates items, which makes bins noisier and raises ECE on average, so the resamples' 2.5th
    percentile can lie above the value itself (seen: 0.1012 against 0.1006)."""
    probs, labels = np.asarray(probs, np.float64), np.asarray(labels)
    value = expected_calibration_error(probs, labels, ECE_BINS)
    rng = np.random.default_rng(seed)
    boots = [
        expected_calibration_error(probs[idx], labels[idx], ECE_BINS)
        for idx in (rng.integers(0, len(labels), len(labels)) for _ in range(resamples))
    ]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return figure(value, len(labels), min(float(lo), value), max(float(hi), value), f"bootstrap ({resamples})")


CONFIDENT = 0.9  # a wrong answer at this top probability or above, not flagged out, passes as a sure one


def passed_wrong(
    probs: np.ndarray, labels: np.ndarray, ood: np.ndarray | None = None, threshold: float | None = None
) -> dict[str, Any] | None:
    """Of the wrong answers, the share that passes as a sure answer: top probability >= CONFIDENT and, where
    the model has an ood score and threshold, in distribution (score <= threshold). None without wrong answers."""
    probs, labels = np.asarray(probs, np.float64), np.asarray(labels)
    wrong = probs.argmax(1) != labels
    if not wrong.any():
        return None
    passes = probs.max(1) >= CONFIDENT
    if ood is not None and threshold is not None:
        passes &= np.asarray(ood) <= threshold
    return wilson(int((passes & wrong).sum()), int(wrong.sum()))


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)
