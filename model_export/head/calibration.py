"""Calibrated probabilities: temperature scaling fitted on a holdout, expected calibration error, a reliability
diagram.

A classifier trained with cross-entropy (and label smoothing) answers with about the same confidence whatever
the input; temperature scaling (Guo et al., 2017) divides the logits by one scalar T > 0 chosen to minimise the
holdout's negative log-likelihood. It never changes the predicted label, only how sure the model says it is.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

ECE_BINS = 15
_T_MIN, _T_MAX = 0.05, 20.0


def fit_temperature(logits: Tensor, labels: Tensor, weights: Tensor | None = None) -> float:
    """T minimising the mean NLL of softmax(logits / T) on (logits [N, C], labels [N]), searched over
    log T by golden-section (the NLL is unimodal in log T for a fixed set of logits). weights [N] (> 0): a
    weighted mean instead, so that a group of items can have a say of its own whatever its size."""
    if logits.ndim != 2 or labels.shape != logits.shape[:1] or len(labels) == 0:
        raise ValueError(
            f"need logits [N, C] and labels [N] with N > 0, got {tuple(logits.shape)}, {tuple(labels.shape)}"
        )
    if weights is not None and (weights.shape != labels.shape or not bool((weights > 0).all())):
        raise ValueError(f"weights must be [N] and positive, got {tuple(weights.shape)}")
    z = logits.detach().double()
    y = labels.long()
    w = None if weights is None else weights.double() / weights.double().sum()

    def nll(log_t: float) -> float:
        if w is None:
            return float(torch.nn.functional.cross_entropy(z / math.exp(log_t), y))
        return float((torch.nn.functional.cross_entropy(z / math.exp(log_t), y, reduction="none") * w).sum())

    lo, hi = math.log(_T_MIN), math.log(_T_MAX)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(80):  # the bracket shrinks by 0.618 per step: 80 steps reach float precision
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = nll(b)
    return math.exp((lo + hi) / 2)


def _as_numpy(x: Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)


def calibration_bins(probs: Tensor | np.ndarray, labels: Tensor | np.ndarray, bins: int = ECE_BINS) -> list[dict]:
    """Equal-width confidence bins over (0, 1]: per bin the count, mean confidence and accuracy of the
    items whose top probability falls in it (bin i holds confidences in (i/bins, (i+1)/bins])."""
    p, y = _as_numpy(probs).astype(np.float64), _as_numpy(labels).astype(np.int64)
    conf, pred = p.max(axis=1), p.argmax(axis=1)
    # ceil(conf * bins) - 1: a confidence exactly on an edge belongs to the bin below it; 0 joins bin 0
    idx = np.clip(np.ceil(conf * bins).astype(np.int64) - 1, 0, bins - 1)
    out = []
    for i in range(bins):
        sel = idx == i
        n = int(sel.sum())
        out.append(
            {
                "lo": i / bins,
                "hi": (i + 1) / bins,
                "n": n,
                "confidence": float(conf[sel].mean()) if n else None,
                "accuracy": float((pred[sel] == y[sel]).mean()) if n else None,
            }
        )
    return out


def expected_calibration_error(probs: Tensor | np.ndarray, labels: Tensor | np.ndarray, bins: int = ECE_BINS) -> float:
    """ECE: sum over bins of (items in bin / N) x |accuracy - mean confidence| of the top label."""
    table = calibration_bins(probs, labels, bins)
    total = sum(b["n"] for b in table)
    if total == 0:
        raise ValueError("expected_calibration_error needs at least one item")
    return float(sum(b["n"] / total * abs(b["accuracy"] - b["confidence"]) for b in table if b["n"]))


def ece_floor(confidences: np.ndarray, bins: int = ECE_BINS, draws: int = 2000, seed: int = 0) -> dict[str, float]:
    """The ECE a perfectly calibrated model would show on these items: each item's top label drawn right with
    probability equal to its confidence, ECE measured, `draws` times. Returns the mean and the 95th
    percentile. On a hundred items the binned estimate is far from 0 even then (a few items per bin), so
    an ECE near this floor is within what the test split can resolve."""
    conf = np.asarray(confidences, dtype=np.float64)
    if conf.ndim != 1 or len(conf) == 0 or conf.min() < 0.0 or conf.max() > 1.0:
        raise ValueError(f"need a non-empty 1-D array of confidences in [0, 1], got shape {conf.shape}")
    idx = np.clip(np.ceil(conf * bins).astype(np.int64) - 1, 0, bins - 1)  # as calibration_bins
    conf_sum = np.bincount(idx, weights=conf, minlength=bins)
    rng = np.random.default_rng(seed)
    right = rng.random((draws, len(conf))) < conf  # [draws, N]
    right_sum = np.stack([np.bincount(idx, weights=r, minlength=bins) for r in right.astype(np.float64)])
    eces = np.abs(right_sum - conf_sum).sum(1) / len(conf)  # sum over bins of n_b/N x |acc_b - conf_b|
    return {"mean": round(float(eces.mean()), 4), "p95": round(float(np.quantile(eces, 0.95)), 4)}


def reliability_diagram(
    probs: Tensor | np.ndarray, labels: Tensor | np.ndarray, path: str | Path, title: str = "", bins: int = ECE_BINS
) -> Path:
    """Accuracy against confidence per bin (bars), the diagonal, and the share of items per bin; PNG at path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = calibration_bins(probs, labels, bins)
    ece = expected_calibration_error(probs, labels, bins)
    fig, (ax, ax_n) = plt.subplots(2, 1, figsize=(5, 6), height_ratios=[3, 1], sharex=True)
    mids = [(b["lo"] + b["hi"]) / 2 for b in table]
    ax.bar(mids, [b["accuracy"] or 0.0 for b in table], width=1 / bins, edgecolor="black", label="accuracy")
    ax.plot([0, 1], [0, 1], "k--", label="perfect calibration")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title} ECE {100 * ece:.1f}% ({bins} bins)".strip())
    ax.legend(loc="upper left")
    total = max(sum(b["n"] for b in table), 1)
    ax_n.bar(mids, [b["n"] / total for b in table], width=1 / bins, color="grey")
    ax_n.set_xlabel("confidence of the top label")
    ax_n.set_ylabel("share")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
