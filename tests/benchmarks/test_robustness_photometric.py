"""The suite's photometric corruptions (benchmarks.robustness.perturb) on small arrays, the variants the image
suite runs, and the honesty figure (stats.passed_wrong) against hand examples."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.robustness import image_suite, perturb, stats


def _images() -> np.ndarray:
    x = np.zeros((3, 12, 12), dtype=np.uint8)  # black background
    x[:, 3:9, 3:9] = 200
    x[1, 5, 5] = 255
    return x


def test_photometric_corruptions_do_what_they_say() -> None:
    x = _images()
    c = perturb.contrast(x, 0.5).astype(float)
    mean = x.reshape(3, -1).mean(1)[:, None, None]
    assert np.abs(c - (mean + 0.5 * (x - mean))).max() <= 1.0  # about each image's mean (Pillow rounds)
    assert np.array_equal(perturb.contrast(x, 1.0), x)
    assert np.array_equal(perturb.scale(x, 0.5), np.rint(x * 0.5).astype(np.uint8))
    b = perturb.brightness(x, 60)
    assert b[0, 0, 0] == 60 and b[1, 5, 5] == 255 and b.dtype == np.uint8  # background lifted, clipped at 255
    assert np.array_equal(perturb.gamma(x, 1.0), x)
    assert perturb.gamma(x, 0.5)[0, 4, 4] > 200 > perturb.gamma(x, 2.0)[0, 4, 4]
    blurred = perturb.blur(x, 1.2).astype(float)
    assert blurred[0, 2, 4] > 0 and blurred[0, 5, 5] <= 200  # ink spreads out of the square
    assert abs(blurred.sum() - x.astype(float).sum()) / x.sum() < 0.02  # and is kept


def test_image_suite_runs_every_photometric_case_seeded() -> None:
    x = np.random.default_rng(0).integers(0, 256, (4, 28, 28), dtype=np.uint8)
    a, b = image_suite.variants(x, seed=0), image_suite.variants(x, seed=0)
    assert set(image_suite.PHOTOMETRIC) <= set(a)
    for name in a:
        assert a[name].shape == x.shape and a[name].dtype == np.uint8 and np.array_equal(a[name], b[name]), name
    assert np.array_equal(a["brightness_+60"], perturb.brightness(x, 60))


def test_passed_wrong_counts_sure_wrong_answers_not_flagged() -> None:
    probs = np.array([[0.95, 0.05], [0.95, 0.05], [0.6, 0.4], [0.05, 0.95], [0.92, 0.08]])
    y = np.array([1, 1, 1, 1, 0])  # items 0-2 wrong; 0 and 1 at 0.95, 2 at 0.6
    assert stats.passed_wrong(probs, y)["value"] == pytest.approx(2 / 3, abs=1e-4)
    ood = np.array([0.5, 2.0, 0.5, 0.5, 0.5])  # item 1 flagged out at threshold 1
    got = stats.passed_wrong(probs, y, ood, threshold=1.0)
    assert got["value"] == pytest.approx(1 / 3, abs=1e-4) and got["n"] == 3 and got["lo"] < 1 / 3 < got["hi"]
    assert stats.passed_wrong(probs[3:], y[3:]) is None  # no wrong answers: nothing to report
