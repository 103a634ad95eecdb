"""The wide path of `lara train`'s text models (Wide & Deep): a hashed word 1-2-gram tf-idf linear head inside
the model (lara_serve.model_export.models.text.TfidfHead), fitted to convergence before the encoder trains, then blended with
the encoder's logits by two weights chosen on the holdout.

Why: at a 15-minute budget on two cores the byte-level encoder sees a few epochs; a linear model over word
grams converges in seconds and is what a bag-of-words baseline is. Measured without it
(benchmarks/results/your_data.md before this module): the encoder alone trailed TF-IDF + logistic regression
by 7 to 42 points on four user-like text sets. With the wide path in the same graph the served model keeps
what the bag of words knows and the encoder adds what it reads; config.json's "metrics"."parts" reports
each part alone on the test split, so a user sees what the encoder adds on their data.

The fit: the features are exactly those TfidfHead computes (the head's own gram hashing and idf: sublinear
tf x idf over distinct grams, L2-normalized), so the fitted weights are the served ones; a multinomial
logistic regression (scikit-learn) fits them on the training split (the holdout stays out), its min_df and C
chosen by 3-fold cross-validation on that split; its intercept joins the encoder head's bias.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from lara_serve.model_export.models.text import TFIDF_GAIN, TfidfHead, smoothed_idf
from lara_serve.model_export.training.data import stratified_folds

# The wide table holds buckets x classes floats; this many at most (8 MiB of float32 in each of
# model.safetensors and model.onnx), at most 2**18 buckets (fewer colliding grams than the ~10**5-10**6
# distinct word 1-2-grams of a few thousand documents would need beyond that).
MAX_TABLE_FLOATS = 2**21
MAX_BUCKETS = 2**18
LOGREG_C = 10.0  # the text baseline's (lara_serve.model_export.your_data.baseline): the default when there is too little to choose
MIN_DF = 2  # grams in fewer training documents get idf 0 (TfidfHead.fit_idf's default)
# min_df and C are chosen per data set by k-fold cross-validation on the training split (never the holdout or
# the test split): on the user-like sets of benchmarks.your_data subject lines kept their rare grams (min_df 1),
# e-mails, speeches and messages dropped them (min_df 2).
MIN_DF_GRID = (1, 2)
C_GRID = (10.0, 30.0)  # C = 3 never won on the five user-like sets; each grid point costs CV_FOLDS fits
CV_FOLDS = 3
CV_MAX_EXAMPLES = 2000  # more training examples: the choice is made on a seeded subset of this many
# The blend a * encoder + b * wide is chosen on the holdout's NLL from this grid (0 drops a part).
BLEND_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


def wide_buckets(num_classes: int) -> int:
    """The largest power of two <= MAX_BUCKETS whose table of num_classes columns fits MAX_TABLE_FLOATS."""
    room = max(2, MAX_TABLE_FLOATS // max(num_classes, 1))
    return min(MAX_BUCKETS, 2 ** int(math.log2(room)))


def counts(head: TfidfHead, docs: Sequence[bytes] | Sequence[Sequence[int]]):  # -> csr_matrix [N, buckets]
    """How often each of the head's gram buckets occurs in each document (the head's own hashing): byte
    documents, or the ids the head reads (a word-piece model's pieces, bert_lara.PieceTfidfHead)."""
    from scipy.sparse import csr_matrix

    rows, cols, vals = [], [], []
    with torch.inference_mode():
        for i, raw in enumerate(docs):
            if not len(raw):
                continue
            ids = _ids(raw) if isinstance(raw, bytes) else torch.as_tensor(raw, dtype=torch.long)
            bucket, real = head.grams(ids[None])
            grams, c = np.unique(bucket[real].numpy(), return_counts=True)
            rows.append(np.full(len(grams), i))
            cols.append(grams)
            vals.append(c.astype(np.float64))
    if not rows:
        return csr_matrix((len(docs), head.buckets))
    data = (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols)))
    return csr_matrix(data, shape=(len(docs), head.buckets))


def tfidf(c, idf: np.ndarray):  # (csr counts, [buckets]) -> csr [N, buckets]
    """TfidfHead's features from counts: (1 + ln count) x idf, each row L2-normalized (an all-zero row stays 0)."""
    x = c.copy()
    x.data = (1.0 + np.log(x.data)) * idf[x.indices]
    x.eliminate_zeros()
    norms = np.sqrt(np.asarray(x.multiply(x).sum(1)).ravel())
    x.data /= np.repeat(np.where(norms > 0, norms, 1.0), np.diff(x.indptr))
    return x


def features(head: TfidfHead, docs: Sequence[bytes] | Sequence[Sequence[int]]):  # -> csr_matrix [N, buckets]
    """The head's L2-normalized tf-idf vectors of documents (`counts`; without TFIDF_GAIN), as a sparse matrix:
    head(ids) == TFIDF_GAIN * features @ head.weight up to float rounding."""
    return tfidf(counts(head, docs), head.idf.double().numpy())


def _ids(raw: bytes) -> torch.Tensor:
    """Bytes -> ids (byte + 1), the server's preprocessing."""
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long() + 1


@dataclass(frozen=True)
class WideData:
    """The documents (cut at the model's max_length) and labels of the three parts of a `lara train` split."""

    train: list[bytes]
    train_y: list[int]
    holdout: list[bytes]
    holdout_y: list[int]
    test: list[bytes]
    test_y: list[int]


@dataclass(frozen=True)
class WideChoice:
    min_df: int
    C: float
    cv_accuracy: dict[str, float]  # "min_df=1,C=10" -> pooled k-fold accuracy; empty: the defaults, untried

    def record(self) -> dict[str, Any]:
        return {"min_df": self.min_df, "logreg_C": self.C, "chosen_on": f"{CV_FOLDS}-fold CV on the training split"
                if self.cv_accuracy else "defaults (too few examples per class to cross-validate)",
                "cv_accuracy": self.cv_accuracy}  # fmt: skip


@dataclass(frozen=True)
class WideFit:
    coef: np.ndarray  # [C, buckets]: logits = features @ coef.T + intercept
    intercept: np.ndarray  # [C]
    choice: WideChoice

    def logits(self, feats) -> np.ndarray:
        return np.asarray(feats @ self.coef.T) + self.intercept


def _idf(c, min_df: int) -> np.ndarray:
    df = torch.from_numpy(np.asarray((c > 0).sum(0)).ravel().astype(np.float64))
    return smoothed_idf(df, c.shape[0], min_df).numpy()


def _logreg(c_value: float):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c_value, max_iter=2000)


def choose_settings(c, y: np.ndarray, seed: int = 0) -> WideChoice:
    """(min_df, C) from MIN_DF_GRID x C_GRID by pooled k-fold accuracy on the training counts `c` (idf refitted
    on each fold's own training part); ties go to the defaults (MIN_DF, LOGREG_C), then to grid order. With
    fewer than CV_FOLDS examples of some class, the defaults. The choice's CPU time counts against the run's
    budget (it is part of the wide fit): 30-170 s on the user-like sets of benchmarks.your_data."""
    if len(y) > CV_MAX_EXAMPLES:
        keep = np.sort(np.random.default_rng(seed).choice(len(y), CV_MAX_EXAMPLES, replace=False))
        c, y = c[keep], y[keep]
    if len(y) == 0 or np.bincount(y).min() < CV_FOLDS or len(set(y.tolist())) < 2:
        return WideChoice(MIN_DF, LOGREG_C, {})
    folds = np.asarray(stratified_folds(y.tolist(), CV_FOLDS, seed))
    grid = [(MIN_DF, LOGREG_C)] + [p for p in itertools.product(MIN_DF_GRID, C_GRID) if p != (MIN_DF, LOGREG_C)]
    scores: dict[str, float] = {}
    best, pick = -1.0, grid[0]
    for min_df, c_value in grid:
        correct = 0
        for k in range(CV_FOLDS):
            tr, va = folds != k, folds == k
            idf = _idf(c[tr], min_df)
            clf = _logreg(c_value).fit(tfidf(c[tr], idf), y[tr])
            correct += int((clf.predict(tfidf(c[va], idf)) == y[va]).sum())
        accuracy = correct / len(y)
        scores[f"min_df={min_df},C={c_value:g}"] = round(accuracy, 4)
        if accuracy > best + 1e-12:
            best, pick = accuracy, (min_df, c_value)
    return WideChoice(pick[0], pick[1], scores)


def fit_wide(
    head: TfidfHead, train_docs: Sequence[bytes] | Sequence[Sequence[int]], train_y: list[int], num_classes: int
) -> WideFit:
    """Choose min_df and C by cross-validation on the training documents, set the head's idf from all of them,
    then fit a multinomial logistic regression on its features."""
    c, y = counts(head, train_docs), np.asarray(train_y)
    choice = choose_settings(c, y)
    idf = _idf(c, choice.min_df)
    head.idf.copy_(torch.from_numpy(idf).to(head.idf.dtype))
    clf = _logreg(choice.C).fit(tfidf(c, idf), y)
    coef = np.zeros((num_classes, head.buckets))
    intercept = np.zeros(num_classes)
    if len(clf.classes_) == 2 and num_classes == 2:  # one score column: +w for class 1, -w for class 0
        coef[1], coef[0] = clf.coef_[0] / 2, -clf.coef_[0] / 2
        intercept[1], intercept[0] = clf.intercept_[0] / 2, -clf.intercept_[0] / 2
    else:
        coef[clf.classes_], intercept[clf.classes_] = clf.coef_, clf.intercept_
    return WideFit(coef, intercept, choice)


def _nll(z: np.ndarray, y: np.ndarray) -> float:
    return float(nn.functional.cross_entropy(torch.from_numpy(z), torch.from_numpy(y)))


def choose_blend(z_deep: np.ndarray, z_wide: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) from BLEND_GRID minimizing the holdout NLL of a * z_deep + b * z_wide (not both 0); ties go
    to the earlier pair in grid order, a before b."""
    best, pair = math.inf, (1.0, 1.0)
    for a, b in itertools.product(BLEND_GRID, BLEND_GRID):
        if a == 0.0 and b == 0.0:
            continue
        nll = _nll(a * z_deep + b * z_wide, y)
        if nll < best - 1e-9:
            best, pair = nll, (a, b)
    return pair


def choose_served(
    z_deep: np.ndarray, z_wide: np.ndarray, y: np.ndarray, weights: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    """Which of `weights` (part -> (a, b) on encoder and wide logits; the blend first) the model serves: the
    highest holdout accuracy, ties to the lower holdout NLL, then to the earlier part. The blend's weights
    minimize the holdout NLL, which a part alone can beat on accuracy (issue 54: the blend served 1.7 points
    under its own wide path); serving the best part keeps the model at least as good as each of its parts
    on the holdout. Returns config.json's metrics.parts.served."""
    if not len(y):
        a, b = weights["blend"]
        return {"part": "blend", "encoder_weight": a, "wide_weight": b, "why": "no holdout to compare the parts on"}
    scores = {}
    for part, (a, b) in weights.items():
        z = a * z_deep + b * z_wide
        scores[part] = (float((z.argmax(1) == y).mean()), _nll(z, y))
    best = min(scores, key=lambda p: (-scores[p][0], scores[p][1]))
    others = ", ".join(f"{p} {scores[p][0]:.4f}" for p in scores if p != best)
    a, b = weights[best]
    return {
        "part": best,
        "encoder_weight": a,
        "wide_weight": b,
        "why": f"highest holdout accuracy ({scores[best][0]:.4f}; {others}), ties to the lower holdout NLL",
        "holdout": {p: {"accuracy": round(acc, 4), "nll": round(nll, 4)} for p, (acc, nll) in scores.items()},
    }


@torch.no_grad()
def install(model: nn.Module, head: TfidfHead, fit: WideFit, a: float, b: float) -> None:
    """model.forward becomes a * encoder logits + b * (wide logits + intercept): the encoder head scaled by a,
    the wide weights by b / TFIDF_GAIN (TfidfHead multiplies by the gain), the intercept into the head's bias."""
    model.head.weight.mul_(a)
    model.head.bias.mul_(a).add_(torch.as_tensor(b * fit.intercept, dtype=model.head.bias.dtype))
    head.weight.copy_(torch.as_tensor(b * fit.coef.T / TFIDF_GAIN, dtype=head.weight.dtype))
    model.tfidf = head


def detach_and_fit(model: nn.Module, data: WideData) -> tuple[TfidfHead, WideFit]:
    """Take the wide head out of `model` (the encoder then trains alone, on its own logits) and fit it."""
    head = model.tfidf
    if head is None:
        raise ValueError("the model has no wide path (config tfidf_buckets = 0)")
    model.tfidf = None
    return head, fit_wide(head, data.train, data.train_y, model.cfg.num_classes)


def blend_parts(
    z_deep: dict[str, np.ndarray], z_wide: dict[str, np.ndarray], hold_y: np.ndarray, test_y: np.ndarray
) -> tuple[tuple[float, float], dict[str, Any]]:
    """The blend's weights by holdout NLL and the part the holdout serves (`choose_served`), from each part's
    "holdout" and "test" logits. Returns ((a, b) to install, config.json metrics "parts" with each part's
    holdout and test accuracy; the wide entry holds the accuracies only, its settings are the caller's)."""
    a, b = choose_blend(z_deep["holdout"], z_wide["holdout"], hold_y)
    weights = {"blend": (a, b), "wide": (0.0, 1.0), "encoder": (1.0, 0.0)}
    served = choose_served(z_deep["holdout"], z_wide["holdout"], hold_y, weights)
    labels = {"holdout": hold_y, "test": test_y}

    def acc(part: str, pair: tuple[float, float]) -> float | None:
        y = labels[part]
        z = pair[0] * z_deep[part] + pair[1] * z_wide[part]
        return round(float((z.argmax(1) == y).mean()), 4) if len(y) else None

    scored = {key: {f"{part}_accuracy": acc(part, w) for part in labels} for key, w in weights.items()}
    parts = {
        "served": served,
        "blend": {"encoder": a, "wide": b, "chosen_on": "holdout NLL", "grid": list(BLEND_GRID), **scored["blend"]},
        "encoder": scored["encoder"],
        "wide": scored["wide"],
    }
    return weights[served["part"]], parts


def attach(model: nn.Module, head: TfidfHead, fit: WideFit, data: WideData, deep_logits) -> dict:
    """Blend the trained encoder (`deep_logits(model, docs)` -> [N, C], the model without its wide path) with
    the fitted wide path on the holdout, install both into `model`; returns config.json's metrics "parts":
    the blend and each part's holdout and test accuracy alone."""
    z_deep = {"holdout": deep_logits(model, data.holdout), "test": deep_logits(model, data.test)}
    z_wide = {"holdout": fit.logits(features(head, data.holdout)), "test": fit.logits(features(head, data.test))}
    pair, parts = blend_parts(z_deep, z_wide, np.asarray(data.holdout_y), np.asarray(data.test_y))
    install(model, head, fit, *pair)
    parts["wide"].update(buckets=head.buckets, utf8_words=head.utf8, **fit.choice.record())
    return parts
