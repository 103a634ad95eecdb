"""Temperature scaling and expected calibration error: a hand-checked ECE, the fitted temperature against a
known one and against a grid search, the reliability diagram written."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lara_serve.model_export.head.calibration import (
    calibration_bins,
    expected_calibration_error,
    fit_temperature,
    reliability_diagram,
)


def test_ece_matches_a_hand_checked_example() -> None:
    # Top confidences 0.9 (right), 0.9 (wrong), 0.7 (right), 0.62 (right); 15 bins of width 1/15:
    # 0.9 falls in bin 13 (0.867, 0.933]: accuracy 0.5, confidence 0.9, weight 2/4 -> 0.2
    # 0.7 in bin 10 (0.667, 0.733]: |1 - 0.7| x 1/4 = 0.075; 0.62 in bin 9 (0.6, 0.667]: |1 - 0.62| / 4 = 0.095
    probs = np.array([[0.9, 0.1], [0.9, 0.1], [0.3, 0.7], [0.62, 0.38]])
    labels = np.array([0, 1, 1, 0])
    assert expected_calibration_error(probs, labels, bins=15) == pytest.approx(0.2 + 0.075 + 0.095, abs=1e-12)
    table = calibration_bins(probs, labels, bins=15)
    assert [b["n"] for b in table] == [0] * 9 + [1, 1, 0, 0, 2, 0]
    assert table[13]["accuracy"] == 0.5 and table[13]["confidence"] == pytest.approx(0.9)


def test_a_confidence_on_a_bin_edge_goes_to_the_lower_bin() -> None:
    table = calibration_bins(np.array([[0.5, 0.5], [1.0, 0.0]]), np.array([0, 0]), bins=2)
    assert [b["n"] for b in table] == [1, 1]  # 0.5 in (0, 0.5], 1.0 in (0.5, 1]


def test_perfectly_calibrated_predictions_have_zero_ece() -> None:
    probs = np.array([[0.75, 0.25]] * 4)
    labels = np.array([0, 0, 0, 1])  # 3 of 4 right at confidence 0.75
    assert expected_calibration_error(probs, labels) == pytest.approx(0.0, abs=1e-12)


def test_fitted_temperature_recovers_the_one_that_generated_the_labels() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20000, 5, generator=g) * 3.0
    true_t = 2.5
    labels = torch.multinomial(torch.softmax(logits / true_t, -1), 1, generator=g).squeeze(1)
    t = fit_temperature(logits, labels)
    assert t == pytest.approx(true_t, rel=0.05)
    # and it is the NLL minimum: no point of a fine grid does better
    z = logits.double()
    nll = lambda tt: float(torch.nn.functional.cross_entropy(z / tt, labels))  # noqa: E731
    grid = [math.exp(x) for x in np.linspace(math.log(0.5), math.log(10), 400)]
    assert nll(t) <= min(nll(tt) for tt in grid) + 1e-9


def test_weighted_temperature_gives_a_small_group_its_share() -> None:
    """Two groups drawn at temperatures 1 and 4, the second 20 times smaller: unweighted, the fit follows the
    big group; with each group half the say (int8.balanced_weights), it lies between; weights of one group
    alone recover that group's temperature; equal weights are the plain fit; bad weights are refused."""
    from lara_serve.model_export.pretrained.int8 import balanced_weights

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(21000, 5, generator=g) * 3.0
    temps = torch.cat([torch.full((20000,), 1.0), torch.full((1000,), 4.0)])
    labels = torch.multinomial(torch.softmax(logits / temps[:, None], -1), 1, generator=g).squeeze(1)
    plain = fit_temperature(logits, labels)
    half = fit_temperature(logits, labels, balanced_weights(20000, 1000))
    assert plain < 1.3 and 1.5 < half < 3.5
    only_small = fit_temperature(logits, labels, torch.cat([torch.full((20000,), 1e-9), torch.ones(1000)]))
    assert only_small == pytest.approx(fit_temperature(logits[20000:], labels[20000:]), rel=1e-3)
    assert fit_temperature(logits, labels, torch.full((21000,), 3.0)) == pytest.approx(plain, rel=1e-9)
    w = balanced_weights(3, 1, share=0.25)
    assert torch.allclose(w, torch.tensor([0.25, 0.25, 0.25, 0.25]))
    with pytest.raises(ValueError, match="weights"):
        fit_temperature(logits, labels, torch.zeros(21000))


def test_temperature_scaling_lowers_the_ece_of_overconfident_logits() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5000, 4, generator=g) * 2.0
    labels = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(1)
    over = logits * 4.0  # the same ranking, four times too sure
    t = fit_temperature(over, labels)
    before = expected_calibration_error(torch.softmax(over, -1), labels)
    after = expected_calibration_error(torch.softmax(over / t, -1), labels)
    assert t == pytest.approx(4.0, rel=0.1) and after < before / 3 and after < 0.02


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"logits \[N, C\]"):
        fit_temperature(torch.zeros(3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one item"):
        expected_calibration_error(np.zeros((0, 3)), np.zeros(0))


def test_reliability_diagram_is_written(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    path = reliability_diagram(probs, np.array([0, 1, 1]), tmp_path / "r.png", title="t")
    assert path.stat().st_size > 5000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ece_floor_of_a_perfectly_calibrated_model_by_hand() -> None:
    from lara_serve.model_export.head.calibration import ece_floor

    # certain and right every time: nothing to miss
    assert ece_floor(np.ones(50)) == {"mean": 0.0, "p95": 0.0}
    # one item at 0.5: right or wrong, |1 - 0.5| = |0 - 0.5| = 0.5 every draw
    assert ece_floor(np.array([0.5])) == {"mean": 0.5, "p95": 0.5}
    # two items at 0.5 in one bin: 0, 1 or 2 right with prob. 1/4, 1/2, 1/4 -> ECE 0.5, 0, 0.5; mean 0.25
    floor = ece_floor(np.array([0.5, 0.5]), draws=20000)
    assert abs(floor["mean"] - 0.25) < 0.01 and floor["p95"] == 0.5
    # more items, smaller floor: the binned estimate's noise shrinks about as 1 / sqrt(N)
    conf = np.random.default_rng(1).uniform(0.4, 1.0, 1000)
    assert ece_floor(conf[:100])["mean"] > 2 * ece_floor(conf)["mean"] > 0


def test_ece_floor_refuses_what_is_not_confidences() -> None:
    from lara_serve.model_export.head.calibration import ece_floor

    for bad in (np.array([]), np.array([1.2]), np.ones((2, 2))):
        with pytest.raises(ValueError, match="confidences in"):
            ece_floor(bad)
