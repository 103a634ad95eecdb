"""A bag-of-words teacher for training windows: soft targets from TF-IDF + logistic regression.

Why: on BBC the TF-IDF anchor fit on whole texts plus their first 512 B and 1 KB loses 0.28 point at 1 KB
by cross-validation, while the LARA recipe loses 1.4 (README, "Long documents"): on short heads a bag of
words, fit on 1,700 documents, knows more than a byte-level model trained from scratch on them. Training
the LARA model toward the teacher's class probabilities for each window it sees (distillation) passes that
knowledge on, window by window; nothing of the teacher is used at serving time.

Cross-fitting: the training documents are split into `parts` stratified parts; a window of a document in
part k is scored by the teacher fit on the other parts, so its targets are what the teacher predicts for
unseen text (a teacher scoring its own training documents would echo the label). A composite window is
scored by the teacher of its first document's part (its other documents share the label and may have been
seen: their words only confirm that label).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lara_serve.model_export.training import data

HEAD_FIT = (512, 1024)  # the teacher also fits each training text's first 512 B and 1 KB


def tfidf_classifier() -> Any:
    """TF-IDF word 1-2-grams (sublinear, min_df 2) + logistic regression (C=10): the README's anchor."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    return make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2), LogisticRegression(C=10.0))


def first_bytes(texts: Sequence[str], first: int | None) -> list[str]:
    """Each text cut to its first `first` UTF-8 bytes (None: whole)."""
    return list(texts) if first is None else [t.encode("utf-8")[:first].decode("utf-8", "ignore") for t in texts]


def heads_too(texts: Sequence[str], labels: Sequence[int], head_fit: Sequence[int]) -> tuple[list[str], list[int]]:
    """texts + their first n UTF-8 bytes for each n in head_fit, with labels repeated to match."""
    out, ys = list(texts), list(labels)
    for n in head_fit:
        out += first_bytes(texts, n)
        ys += list(labels)
    return out, ys


@dataclass
class WindowTeacher:
    """Cross-fitted teachers: `teachers[k]` was fit on every training document outside part k."""

    teachers: list[Any]
    part_of: list[int]  # training document index -> its part
    num_classes: int

    def __call__(self, raws: Sequence[bytes], docs: Sequence[int]) -> Tensor:
        """Class probabilities [len(raws), num_classes] (float32) for windows `raws` of documents `docs`."""
        probs = np.zeros((len(raws), self.num_classes), dtype=np.float64)
        texts = [r.decode("utf-8", "ignore") for r in raws]
        for k, clf in enumerate(self.teachers):
            rows = [i for i, d in enumerate(docs) if self.part_of[d] == k]
            if rows:
                probs[np.ix_(rows, clf.classes_)] = clf.predict_proba([texts[i] for i in rows])
        return torch.from_numpy(probs).float()


def fit_teacher(
    docs: Sequence[bytes], labels: Sequence[int], num_classes: int, parts: int = 5, seed: int = 0
) -> WindowTeacher:
    """Fit `parts` cross-fitted teachers on the training documents (whole texts + their heads, HEAD_FIT)."""
    if parts < 2:
        raise ValueError(f"cross-fitting needs at least 2 parts, got {parts}")
    ys = [int(y) for y in labels]
    part_of = [int(p) for p in data.stratified_folds(ys, parts, seed)]
    texts = [d.decode("utf-8", "ignore") for d in docs]
    teachers = []
    for k in range(parts):
        fit = [i for i, p in enumerate(part_of) if p != k]
        x, y = heads_too([texts[i] for i in fit], [ys[i] for i in fit], HEAD_FIT)
        teachers.append(tfidf_classifier().fit(x, y))
    return WindowTeacher(teachers, part_of, num_classes)


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of logits against target distributions (KL to the targets plus a constant)."""
    return -(targets * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
