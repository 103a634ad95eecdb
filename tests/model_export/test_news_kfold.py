"""Smoke test of research/news_kfold.py: one fold at a tiny budget writes per-document rows, a pooled
summary whose numbers follow from those rows, and a plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research import news_kfold


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

    # Another recipe, named, compared with the first on the fold both ran (the same 30 documents).
    base_file = tmp_path / "news_kfold_0.01min.json"
    mix = '{"head_prob": 0.9}'
    argv = ["--folds", "2", "--budget", "0.01", "--score-limit", "30", "--length-mix", mix]
    news_kfold.main([*argv, "--name", "h90", "--against", str(base_file)])
    other = json.loads((tmp_path / "news_kfold_0.01min-h90.json").read_text())
    assert mix in other["rows"][0]["command"] and "news-kfold-0.01min-h90" in other["rows"][0]["command"]
    assert other["name"] == "h90" and "name" not in result  # the plot title names the other recipe
    against = other["summary"]["against"]
    assert against["folds"] == [2] and against["documents"] == 30
    new_gap, base_gap = other["summary"]["gap_1024"]["points"], summary["gap_1024"]["points"]
    assert against["gap_1024_reduction"]["points"] == pytest.approx(base_gap - new_gap, abs=0.011)
    change = 100 * (other["summary"]["truncation"]["full"] - summary["truncation"]["full"])
    assert against["accuracy_change_points"]["full"] == pytest.approx(change, abs=0.011)
    assert json.loads(base_file.read_text())["rows"] == result["rows"]  # the first experiment is untouched
    # Scoring a trained fold again does not retrain it, and keeps the wall time of the call that trained it.
    news_kfold.main(["--folds", "2", "--budget", "0.01", "--score-limit", "30"])
    (again,) = json.loads(base_file.read_text())["rows"]
    assert again["wall_time_s"] == row["wall_time_s"] and again["train_time_s"] == row["train_time_s"]
    assert again["right"] == row["right"]
    with pytest.raises(SystemExit):
        news_kfold.main(argv)  # another recipe without a name would mix with the shipped recipe's results


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


def test_paired_gap_difference_by_hand() -> None:
    # base: 2 of 4 right at 1 KB, all whole -> gap 50; new: 3 of 4 at 1 KB -> gap 25; reduction 25
    base = {"1024": [1, 1, 0, 0], "full": [1, 1, 1, 1]}
    new = {"1024": [1, 1, 1, 0], "full": [1, 1, 1, 1]}
    d = news_kfold.gap_difference(base, new)
    assert d["points"] == 25.0 and d["ci95"][0] <= 25.0 <= d["ci95"][1]
    # the documents are resampled together: new is never worse on any resample, so the interval is >= 0
    assert d["ci95"][0] >= 0.0
    with pytest.raises(ValueError, match="same documents"):
        news_kfold.gap_difference(base, {"1024": [1, 1, 1], "full": [1, 1, 1]})
    rows = [{"fold": 0, "n_test": 4, "right": {"1024": "1110", "full": "1111"}}]
    base_rows = [
        {"fold": 0, "n_test": 4, "right": {"1024": "1100", "full": "1111"}},
        {"fold": 3, "n_test": 4, "right": {"1024": "0000", "full": "1111"}},  # not in rows: ignored
    ]
    c = news_kfold.compare(rows, base_rows)
    assert c["folds"] == [0] and c["documents"] == 4
    assert c["gap_1024_reduction"]["points"] == 25.0
    assert c["accuracy_change_points"] == {"1024": 25.0, "full": 0.0}


def test_distill_recipe_is_named_and_reaches_training(capsys: pytest.CaptureFixture[str]) -> None:
    argv = news_kfold.Recipe(65, name="distill50", distill=0.5).argv(0)
    assert argv[argv.index("--distill") + 1] == "0.5" and "news-kfold-65min-distill50" in " ".join(argv)
    assert "--distill" not in news_kfold.Recipe(65).argv(0)
    with pytest.raises(SystemExit):  # a distilled recipe without a name would mix with the shipped recipe's results
        news_kfold.main(["--folds", "0", "--distill", "0.5"])
    assert "needs --name" in capsys.readouterr().err


def test_override_reaches_the_training_command_and_needs_a_name() -> None:
    argv = news_kfold.Recipe(65, name="b32k", override='{"ngram_buckets": 32749}').argv(0)
    assert argv[argv.index("--override") + 1] == '{"ngram_buckets": 32749}'
    assert "--override" not in news_kfold.Recipe(65).argv(0)  # the shipped recipe passes none
    with pytest.raises(SystemExit):
        news_kfold.main(["--folds", "0", "--override", '{"ngram_buckets": 32749}'])  # no --name
    with pytest.raises(SystemExit):
        news_kfold.main(["--folds", "0", "--override", "[1]", "--name", "x"])  # not an object


def test_fixed_epochs_replace_the_time_budget_and_name_their_own_files(capsys: pytest.CaptureFixture[str]) -> None:
    argv = news_kfold.Recipe(65, name="b32k", epochs=13).argv(1)
    assert argv[argv.index("--epochs") + 1] == "13" and "--time-budget" not in argv
    assert "news-kfold-13ep-b32k" in " ".join(argv)  # apart from the 65-minute runs of the same recipe
    timed = news_kfold.Recipe(65, name="b32k").argv(1)
    assert timed[timed.index("--time-budget") + 1] == "65" and timed[timed.index("--epochs") + 1] == "200"
    resumed = news_kfold.Recipe(65, name="b32k", epochs=13).argv(1, resume=True)
    assert resumed == [*argv, "--resume"]  # an interrupted fold continues from its checkpoint (run-dir)
    assert "--resume" not in argv
    runs, results = news_kfold.Recipe(65, name="b32k", epochs=13).paths()
    assert runs.name == "news-kfold-13ep-b32k" and results.name == "news_kfold_13ep-b32k.json"
    with pytest.raises(SystemExit):
        news_kfold.main(["--folds", "0", "--epochs", "0"])
    assert "--epochs 0" in capsys.readouterr().err
