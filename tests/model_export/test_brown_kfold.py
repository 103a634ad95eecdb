"""Smoke test of research/brown_kfold.py: one fold at a tiny budget writes rows, summary and plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lara_serve.model_export.training import brown


def test_one_fold_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, brown_all: list[brown.BrownDoc]) -> None:
    from research import brown_kfold

    monkeypatch.setattr(brown_kfold, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(brown_kfold, "OUT", tmp_path / "brown_kfold.json")
    brown_kfold.main(["--folds", "3", "--budget", "0.01", "--score-limit", "24"])
    result = json.loads((tmp_path / "brown_kfold.json").read_text())
    (row,) = result["rows"]
    assert row["fold"] == 3 and row["n_test"] == 24 and row["train_time_s"] >= 0.6
    assert all(0.0 <= row[m][k] <= 1.0 for m in ("lara", "tfidf") for k in ("full", "first_2048"))
    assert row["tfidf"]["full"] > 0.4  # the anchor is a real classifier (about 0.75 at full length; chance 0.25-0.4)
    assert result["summary"]["lara_full"]["pooled"] == round(row["lara"]["full"], 4)
    assert (tmp_path / "brown_kfold.png").stat().st_size > 1000
    assert "--fold 3/5" in row["command"] and (tmp_path / "runs" / "fold-3" / "config.json").is_file()


def test_a_tagged_recipe_trains_with_its_options_and_keeps_its_own_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, brown_all: list[brown.BrownDoc]
) -> None:
    from research import brown_kfold

    monkeypatch.setattr(brown_kfold, "RUNS", tmp_path / "runs" / "brown-kfold")
    monkeypatch.setattr(brown_kfold, "OUT", tmp_path / "brown_kfold.json")
    recipe = """--override '{"case_fold": true, "pooling": "attention"}' --augment-text '{"filler_prob": 0.5}'"""
    brown_kfold.main(["--folds", "1", "--budget", "0.01", "--score-limit", "8", "--tag", "r", "--train-args", recipe])
    assert not (tmp_path / "brown_kfold.json").exists()  # the untagged recipe's results are untouched
    result = json.loads((tmp_path / "brown_kfold_r.json").read_text())
    assert result["train_args"][-4:] == [
        "--override",
        '{"case_fold": true, "pooling": "attention"}',
        "--augment-text",
        '{"filler_prob": 0.5}',
    ]
    config = json.loads((tmp_path / "runs" / "brown-kfold-r" / "fold-1" / "config.json").read_text())
    assert config["model"]["case_fold"] is True and config["model"]["pooling"] == "attention"
    assert config["training"]["text_augment"]["filler_prob"] == 0.5
