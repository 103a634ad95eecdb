"""benchmarks.long_composites: the Wilson interval against hand-computed values, and bad arguments refused."""

from __future__ import annotations

import pytest

from benchmarks.long_composites import main, wilson


def test_wilson_matches_hand_computed_intervals() -> None:
    # 9 of 10: centre (0.9 + 1.96^2/20) / (1 + 1.96^2/10) = 0.7890, half-width 0.1931 (worked by hand)
    assert wilson(9, 10) == pytest.approx((0.5958, 0.9821), abs=1e-4)
    # all right still leaves room below: 10 of 10 -> 0.7225 .. 1
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)  # nothing measured: nothing known


def test_per_class_needs_one_count_per_length(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--lengths", "262144,1048576", "--per-class", "2"])
    assert "one count per length" in capsys.readouterr().err
