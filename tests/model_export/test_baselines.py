"""Smoke test of benchmarks/baselines.py: per-kind runs merge into the results file with their history."""

from __future__ import annotations

import json
import sys

from benchmarks import baselines


def test_baselines_smoke(tmp_path, monkeypatch):
    results = tmp_path / "baselines.json"
    results.write_text(
        json.dumps(
            {
                "rows": [
                    {
                        "task": "other",
                        "model": "m",
                        "attention": "-",
                        "budget": "b",
                        "test_accuracy": 0.5,
                        "n_test": 1,
                        "train_time_s": 1.0,
                    }
                ]
            }
        )
    )
    monkeypatch.setattr(baselines, "RESULTS", results)
    monkeypatch.setattr(baselines, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(
        baselines,
        "GROUPS",
        {
            "smoke": (
                "tiny-vit",
                ["lara", "softmax"],
                ["--limit", "64", "--epochs", "1", "--batch-size", "32", "--eval-limit", "32"],
                "smoke budget",
            )
        },
    )
    monkeypatch.setattr(sys, "argv", ["baselines.py", "--only", "smoke", "--kinds", "softmax", "lara"])
    baselines.main()
    rows = json.loads(results.read_text())["rows"]
    assert [r["task"] for r in rows] == ["other", "smoke", "smoke"]  # the existing row is kept
    assert sorted(r["attention"] for r in rows[1:]) == ["lara", "softmax"]
    for r in rows[1:]:
        assert r["n_test"] == 32 and 0.0 <= r["test_accuracy"] <= 1.0
        assert [h["epoch"] for h in r["history"]] == [1] and r["history"][0]["train_time_s"] > 0
        assert "--attention " + r["attention"] in r["command"]
    assert "| smoke | tiny-vit | lara | smoke budget |" in json.loads(results.read_text())["markdown"]
    assert (tmp_path / "baselines_smoke.png").read_bytes()[:4] == b"\x89PNG"  # accuracy against epochs and time
