"""Plain baselines for `lara train`'s report, trained on the same training examples and scored on the same
test examples, so that a user sees whether LARA earns its cost on their data.

- text: TF-IDF of word 1-2-grams (sublinear tf, hashed into HASHED_FEATURES buckets) + logistic regression, on
  whole documents;
- images: a small CNN (two conv blocks, global average pool, linear) trained for the same time as LARA (on
  the clock `--clock` names).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

TEXT_BASELINE = "TF-IDF word 1-2-grams + logistic regression"
# The baseline's gram buckets. Measured (peak RSS of the fit, test accuracy): 2**20 keeps the vocabulary
# baseline's accuracy on the user-like sets (speeches 0.917 vs 0.944, one of 36; subject lines 0.830 vs
# 0.825; messages 0.905 vs 0.905) at 0.7-1.9 GiB; 2**18 lost a point on the messages.
HASHED_FEATURES = 2**20
IMAGE_BASELINE = "small CNN (2 conv blocks, GAP, linear), equal training time, learning rate annealed over it"


def text_baseline(
    train_texts: list[bytes], train_labels: list[int], test_texts: list[bytes]
) -> tuple[np.ndarray, float]:
    """(test probabilities [N, C], fit seconds). Classes are 0..C-1; every class is in train."""
    from sklearn.feature_extraction.text import HashingVectorizer, TfidfTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    t0 = time.perf_counter()
    decode = [t.decode("utf-8") for t in train_texts]
    # Hashed grams: memory bounded by the matrix, not by a vocabulary of every distinct 1-2-gram (a Python
    # dict: 4.7 GiB on 9 MB of speeches, where TfidfVectorizer's max_features pruned only after building it).
    vec = make_pipeline(HashingVectorizer(ngram_range=(1, 2), n_features=HASHED_FEATURES, alternate_sign=False,
                                          norm=None), TfidfTransformer(sublinear_tf=True))  # fmt: skip
    x = vec.fit_transform(decode)
    # Only the buckets some training text fills: an all-zero column gets weight 0 under the L2 penalty (its
    # gradient is 0 from the zero start), so the fit is the same, but L-BFGS keeps 10 correction pairs of
    # classes x columns floats: 1.9 GiB for 7 classes x 2**20 on 900 source files, 55% of the columns used.
    used = np.unique(x.indices)
    clf = LogisticRegression(C=10.0, max_iter=2000)
    clf.fit(x[:, used], train_labels)
    probs = clf.predict_proba(vec.transform([t.decode("utf-8") for t in test_texts])[:, used])
    full = np.zeros((len(test_texts), max(train_labels) + 1))
    full[:, clf.classes_] = probs
    return full, time.perf_counter() - t0


class SmallCNN(nn.Module):
    """[B, C, S, S] normalized pixels -> logits [B, classes]."""

    def __init__(self, channels: int, classes: int, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


LR = 2e-3


def annealed_lr(base: float, done: float) -> float:
    """Cosine from base to 0 over the share `done` of the time budget (0 past its end). Why: at a constant
    rate the CNN's last step is a draw from an oscillation (digits, 1 CPU: 84-99% from one epoch to the next),
    so two runs of the same budget scored 85.5% and 71.9%; annealed, the last step is where it settled."""
    return base * 0.5 * (1.0 + math.cos(math.pi * min(max(done, 0.0), 1.0)))


def image_baseline(
    train: Any, test: Any, classes: int, seconds: float, seed: int, clock: str = "wall"
) -> tuple[np.ndarray, float]:
    """Train SmallCNN on an ImageTask for `seconds` (at least one step) on the clock LARA trained by ("wall" or
    "cpu"), return (test probabilities, seconds on that clock)."""
    timer = time.process_time if clock == "cpu" else time.perf_counter
    torch.manual_seed(seed)
    model = SmallCNN(train.images.shape[1], classes)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    batch = min(128, max(8, len(train) // 8))
    t0, epoch, steps = timer(), 0, 0
    while steps == 0 or timer() - t0 < seconds:
        g = torch.Generator().manual_seed(seed * 1000 + epoch)
        for inputs, labels in train.train_batches(batch, g):
            for group in opt.param_groups:
                group["lr"] = annealed_lr(LR, (timer() - t0) / max(seconds, 1e-9))
            loss = loss_fn(model(inputs["pixel_values"]), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            if timer() - t0 >= seconds:
                break
        epoch += 1
        if len(train) < batch:  # no full batch to draw: one epoch is all there is
            break
    model.eval()
    with torch.inference_mode():
        logits = torch.cat([model(x["pixel_values"]) for x, _ in test.eval_batches(256)])
    return torch.softmax(logits.float(), -1).numpy(), timer() - t0
