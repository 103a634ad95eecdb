"""benchmarks.your_data's statistics and summary, on hand-checked numbers and a fake finished run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import your_data as yd


def test_wilson_matches_a_hand_computed_interval() -> None:
    # 8 of 10: centre (0.8 + 0.19208) / 1.38416, half 1.96 * sqrt(0.016 + 0.0096040) / 1.38416
    lo, hi = yd.wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert yd.wilson(0, 5)[0] == 0.0 and yd.wilson(5, 5)[1] == 1.0


def test_paired_difference_counts_only_the_examples_where_they_differ() -> None:
    true = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    a = list(true)  # all right
    b = [0, 1, 2, 0, 1, 2, 0, 1, 0, 1]  # two wrong
    d = yd.paired_diff(true, a, b, reps=2000)
    assert d["diff"] == pytest.approx(0.2)
    assert 0.0 <= d["lo"] <= 0.2 <= d["hi"] <= 0.5
    same = yd.paired_diff(true, a, a)
    assert same == {"diff": 0.0, "lo": 0.0, "hi": 0.0}


def _fake_run(
    out: Path, lara_pred: list[int], base_pred: list[int], true: list[int], parts: dict | None = None
) -> None:
    out.mkdir(parents=True)
    acc = lambda p: sum(x == y for x, y in zip(p, true, strict=True)) / len(true)  # noqa: E731
    report = {
        "task": "text",
        "split": {"how": "stratified", "train": 30, "holdout": 3, "test": len(true)},
        "lara": {"n": len(true), "accuracy": acc(lara_pred), "macro_f1": 0.5, "ece": 0.03},
        "baseline": {"name": "tfidf", "accuracy": acc(base_pred), "macro_f1": 0.4},
        "calibration": {},
        "predictions": {"true": true, "lara": lara_pred, "baseline": base_pred},
        "training": {"epochs": 4, "train_time_s": 900.2},
    }
    conf = {"labels": ["a", "b"], "data": {"examples": 43}, "training": {"command": "lara train x"}}
    if parts is not None:
        conf["metrics"] = {"parts": parts}
    (out / "report.json").write_text(json.dumps(report))
    (out / "config.json").write_text(json.dumps(conf))


def test_summary_and_table_of_a_finished_run(tmp_path: Path) -> None:
    true = [0, 1] * 5
    _fake_run(tmp_path / "worse", [0, 1] * 4 + [1, 0], true, true)  # LARA 8/10, baseline 10/10
    _fake_run(tmp_path / "level", true, true, true)
    worse, level = yd.summarize("worse", tmp_path / "worse"), yd.summarize("level", tmp_path / "level")
    assert worse["lara_accuracy"] == 0.8 and worse["baseline_accuracy"] == 1.0
    assert worse["lara_minus_baseline"]["diff"] == pytest.approx(-0.2) and worse["target_met"] is False
    assert level["target_met"] is True and level["labels"] == 2 and level["n_test"] == 10
    table = yd.markdown([worse, level, {"set": "broken", "error": "exit 2"}], 15)
    assert "| worse | 43 (10) | 80.0% (49.0-94.3) | 100.0% (72.2-100.0) | -20.0" in table
    assert "| broken | exit 2 |" in table and "15-minute" in table
    assert table.splitlines()[4].endswith("| 4 | - | tfidf | - |")  # the baseline named on its row; no parts
    costed = {**level, "run_cpu_s": 990.0, "run_cpu_vs_budget": 1.1, "peak_rss_gib": 2.5}  # as train_one adds
    assert yd.markdown([costed], 15).splitlines()[4].endswith("| tfidf | 16.5 min (110%) / 2.50 GiB |")
    assert "default recipe" in table
    assert "`--pooling passages`" in yd.markdown([level], 15, "--pooling passages")  # what the run changed


def test_the_parts_of_a_wide_and_deep_model_are_tabled(tmp_path: Path) -> None:
    true = [0, 1] * 5
    parts = {"blend": {"encoder": 0.25, "wide": 1.0}, "encoder": {"test_accuracy": 0.7},
             "wide": {"test_accuracy": 0.9}}  # fmt: skip
    _fake_run(tmp_path / "wd", true, true, true, parts)
    row = yd.summarize("wd", tmp_path / "wd")
    assert row["encoder_accuracy"] == 0.7 and row["wide_accuracy"] == 0.9 and row["blend"] == [0.25, 1.0]
    table = yd.markdown([row], 15)
    assert "| 70.0% / 90.0% (0.25, 1) | tfidf |" in table and "wide path" in table.split("\n\n")[-1]
    yd.chart([row], tmp_path / "chart.png")
    assert (tmp_path / "chart.png").stat().st_size > 0
