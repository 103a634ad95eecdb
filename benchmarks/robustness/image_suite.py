"""The image half of the suite: the shipped ViT beside a small CNN (benchmarks.robustness.cnn).

Cases on a seeded slice of t10k: clean; shifted 1/2/3 pixels; rotated 5/10/15 degrees; horizontally
flipped; JPEG quality 50 and 20; gaussian noise (sigma 25 grey levels); inverted; and the photometric ones
(PHOTOMETRIC): contrast x0.5 about the mean, levels x0.5, brightness +60, gamma 0.5 and 2, blur sigma 1.2.
Per case besides accuracy: ECE, and the share of wrong answers that pass as sure ones (top probability >= 0.9
and, for the model, in distribution). Out-of-domain sets against the clean items: uniform noise, sklearn's
8x8 digits upscaled to 28x28, inverted garments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.robustness import perturb, stats
from benchmarks.robustness.cnn import CnnAnchor
from benchmarks.robustness.runners import OnnxImage, Outputs, calibration_row, ood_row
from lara_serve.model_export.head.calibration import ECE_BINS, expected_calibration_error

NOISE_SIGMA = 25.0
PHOTOMETRIC = ("contrast_x0.5", "levels_x0.5", "brightness_+60", "gamma_0.5", "gamma_2", "blur_sigma1.2",
               "jpeg_q50", "jpeg_q20", "gaussian_noise")  # fmt: skip
Log = Callable[[str], None]


@dataclass(frozen=True)
class ImageSettings:
    limit: int | None = None  # t10k images (a seeded sample); None: all 10,000
    ood_items: int = 500
    cnn_budget_s: float | None = None  # None: the ViT's own training time (config.json), i.e. equal time
    seed: int = 0


def variants(x: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    rng = lambda name: np.random.default_rng([seed, sum(map(ord, name))])  # noqa: E731 (one seeded stream per case)
    out = {f"shift_{k}px": perturb.shift(x, k, rng(f"shift{k}")) for k in (1, 2, 3)}
    out |= {f"rotate_{d}deg": perturb.rotate(x, d, rng(f"rot{d}")) for d in (5, 10, 15)}
    out["hflip"] = x[:, :, ::-1].copy()
    out |= {f"jpeg_q{q}": perturb.jpeg(x, q) for q in (50, 20)}
    out["gaussian_noise"] = perturb.gaussian_noise(x, NOISE_SIGMA, rng("noise"))
    out["inverted"] = 255 - x
    out["contrast_x0.5"] = perturb.contrast(x, 0.5)
    out["levels_x0.5"] = perturb.scale(x, 0.5)
    out["brightness_+60"] = perturb.brightness(x, 60)
    out |= {f"gamma_{g:g}": perturb.gamma(x, g) for g in (0.5, 2.0)}
    out["blur_sigma1.2"] = perturb.blur(x, 1.2)
    return out


def ood_sets(x: np.ndarray, n: int, seed: int) -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits

    rng = np.random.default_rng([seed, 7])
    digits = load_digits().images
    return {
        "uniform_noise": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
        "digits": perturb.upscale_digits(digits[rng.permutation(len(digits))[:n]]),
        "inverted": 255 - x[:n],
    }


def _ece(probs: np.ndarray, y: np.ndarray) -> float:
    return round(expected_calibration_error(probs, y, ECE_BINS), 4)


def _case(m: Outputs, a: Outputs, y: np.ndarray, threshold: float | None) -> dict[str, Any]:
    out = {"model": stats.accuracy(m.pred, y), "anchor": stats.accuracy(a.pred, y),
           # ECE (15 bins) without an interval here: the bootstrap's is biased upwards on a few hundred items
           "model_ece": _ece(m.probs, y), "anchor_ece": _ece(a.probs, y),
           "model_passed_wrong": stats.passed_wrong(m.probs, y, m.ood, threshold),
           "anchor_passed_wrong": stats.passed_wrong(a.probs, y)}  # fmt: skip
    if m.ood is not None and threshold is not None:
        out["model_in_distribution"] = stats.wilson(int((m.ood <= threshold).sum()), len(y))
    return out


def run_image(model: OnnxImage, s: ImageSettings, log: Log = print) -> dict[str, Any]:
    from lara_serve.model_export.training.data import load_fashion

    images, labels = load_fashion("test")
    x, y = images[:, 0].numpy(), labels.numpy()
    if s.limit and s.limit < len(x):
        keep = np.random.default_rng(s.seed).permutation(len(x))[: s.limit]
        x, y = x[keep], y[keep]
    pre = model.config["preprocessing"]
    budget = s.cnn_budget_s or float(model.config["metrics"]["train_time_s"])
    recipe = ((model.config.get("training") or {}).get("image_augment") or {}).get("photometric")
    anchor = CnnAnchor.trained(budget, pre["mean"], pre["std"], s.seed, recipe)
    log(f"{model.name}: {len(x)} t10k images; CNN anchor trained {anchor.train_s:.0f} s ({anchor.steps} steps)"
        f"{', with the ViT photometric recipe' if recipe else ''}")  # fmt: skip
    clean_m, clean_a = model(x), anchor(x)
    cases = {"clean": _case(clean_m, clean_a, y, model.threshold)}
    for name, xv in variants(x, s.seed).items():
        cases[name] = _case(model(xv), anchor(xv), y, model.threshold)
        log(f"  {name}: model {cases[name]['model']['value']:.3f} anchor {cases[name]['anchor']['value']:.3f}")
    ood: dict[str, Any] = {}
    for name, xo in ood_sets(x, s.ood_items, s.seed).items():
        m, a = model(xo), anchor(xo)
        row = ood_row(m, a, clean_m, clean_a, model.threshold)
        ood[name] = row
    result: dict[str, Any] = {
        "kind": "image",
        "dataset": "fashion",
        "anchor": {
            "name": anchor.name,
            "train_s": round(anchor.train_s, 1),
            "steps": anchor.steps,
            "model_train_s": model.config["metrics"]["train_time_s"],
            "photometric": recipe,  # the training recipe both models saw (None: geometric augmentation only)
        },
        "has_ood_score": model.has_ood,
        "ood_threshold": model.threshold,
        "cases": cases,
        "ood": ood,
        "calibration": calibration_row(clean_m, clean_a, y, model.threshold),
    }
    return result
