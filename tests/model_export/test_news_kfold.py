"""Smoke test of benchmarks/news_kfold.py: one fold at a tiny budget writes per-document rows, a pooled
summary whose numbers follow from those rows, and a plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import news_kfold


def test_one_fold_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(news_kfold, "RUNS_ROOT", tmp_path / "runs")
    monkeypatch.setattr(news_kfold, "RESULTS_DIR", tmp_path)
    news_kfold.main(["--folds", "2", "--budget", "0.01", "--score-limit", "30"])
    result = json.loads((tmp_path / "news_kfold_0.01min.json").read_text())
    (row,) = result["rows"]
    assert row["fold"] == 2 and row["n_test"] == 30 and row["train_time_s"] >= 0.6
    assert {"256", "1024", "full"} <= set(row["right"]) and all(len(v) == 30 for v in row["right"].values())
    for k, bits in row["right"].items():  # the accuracy is the share of "1"s, cut by cut
        assert row["truncation"][k] == round(bits.count("1") / 30, 4)
    summary = result["summary"]
    assert summary["documents"] == 30 and summary["truncation"] == row["truncation"]
    gap = summary["gap_1024"]
    best = max(v for k, v in row["truncation"].items() if k == "full" or int(k) >= 1024)
    assert gap["points"] == pytest.approx(100 * (best - row["truncation"]["1024"]), abs=0.01)
    assert gap["ci95"][0] <= gap["points"] <= gap["ci95"][1]
    assert "--fold 2/5" in row["command"] and "head_prob" in row["command"]
    assert (tmp_path / "news_kfold_0.01min.png").stat().st_size > 1000
    assert (tmp_path / "runs" / "news-kfold-0.01min" / "fold-2" / "config.json").is_file()


def test_summary_pools_documents_across_folds() -> None:
    # two folds of 4 documents: pooled accuracy is over 8 documents, not the mean of fold means
    rows = [
        {"fold": 0, "n_test": 4, "right": {"1024": "1100", "2048": "1111", "full": "1111"}},
        {"fold": 1, "n_test": 4, "right": {"1024": "1111", "2048": "1110", "full": "1111"}},
    ]
    s = news_kfold.summarize(rows)
    assert s["documents"] == 8
    assert s["truncation"] == {"1024": 0.75, "2048": 0.875, "full": 1.0}
    assert s["gap_1024"]["points"] == 25.0
    assert s["gap_1024_per_fold"] == [50.0, 0.0]
