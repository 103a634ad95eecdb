"""benchmarks.long_docs.pass_probability against an exact binomial, and research.gap_power end to end on
synthetic cross-validation results."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import pytest


def binomial_cdf(k: int, n: int, p: float) -> float:
    return sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def test_pass_probability_matches_the_exact_binomial() -> None:
    from benchmarks.long_docs import pass_probability

    # 1% of 2,000 documents wrong on the first KB only, every document right whole: in a 431-document
    # draw the gap is 100 * X / 431 with X ~ Binomial(431, 0.01), and <= 0.5 point means X <= 2.
    population, wrong = 2000, 20
    right = {"1024": [i >= wrong for i in range(population)], "full": [True] * population}
    exact = binomial_cdf(2, 431, wrong / population)
    got = pass_probability(right, 431, resamples=20_000)
    # Monte Carlo standard error sqrt(p (1 - p) / 20,000) is under 0.0036: 0.015 is four of them.
    assert abs(got - exact) < 0.015, (got, exact)
    # One document in 200 is exactly 0.5 point, which meets the target: X <= 1 of 200.
    exact_200 = binomial_cdf(1, 200, wrong / population)
    assert abs(pass_probability(right, 200, resamples=20_000) - exact_200) < 0.015


def test_pass_probability_extremes_and_the_best_cut() -> None:
    from benchmarks.long_docs import pass_probability

    n = 500
    level = {"1024": [True] * n, "2048": [True] * n, "full": [True] * n}
    assert pass_probability(level, 431) == 1.0
    far = {"1024": [i % 10 != 0 for i in range(n)], "full": [True] * n}  # 10% behind: never within 0.5
    assert pass_probability(far, 431) == 0.0
    # Whole documents as wrong as the first KB but 2 KB right everywhere: the best cut is 2 KB, so it fails.
    best_2k = {"1024": far["1024"], "2048": [True] * n, "full": far["1024"]}
    assert pass_probability(best_2k, 431) == 0.0


def experiment(path: Path, folds: dict[int, dict[str, str]]) -> None:
    rows = [{"fold": f, "n_test": len(r["full"]), "right": r} for f, r in folds.items()]
    path.write_text(json.dumps({"rows": rows}))


def test_gap_power_ranks_recipes_and_skips_missing_folds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import research
    from research import gap_power

    results, out = tmp_path / "in", tmp_path / "out"
    results.mkdir()
    monkeypatch.setattr(research, "RESULTS", out)
    n = 300
    whole = "1" * n
    # "flat": level at every cut; "behind": 15 of 300 documents (5 points) wrong at 1 KB only.
    experiment(results / "news_kfold_flat.json", {0: {"1024": whole, "full": whole}, 1: {"1024": whole, "full": whole}})
    behind = "0" * 15 + "1" * (n - 15)
    experiment(
        results / "news_kfold_behind.json", {0: {"1024": behind, "full": whole}, 1: {"1024": behind, "full": whole}}
    )
    experiment(results / "news_kfold_one-fold.json", {0: {"1024": whole, "full": whole}})  # lacks fold 1
    experiment(results / "news_ensemble_pair_final_val.json", {0: {"1024": whole, "full": whole}})  # not CV

    gap_power.main(["--results", str(results), "--resamples", "500", "--test-docs", "431"])
    payload = json.loads((out / "gap_power.json").read_text())
    assert [r["experiment"] for r in payload["rows"]] == ["news_kfold_flat", "news_kfold_behind"]
    flat, late = payload["rows"]
    assert flat["gap_1024"]["points"] == 0.0 and flat["pass_probability"] == 1.0 and flat["flip_rate"] == 0.0
    assert late["documents"] == 600 and late["gap_1024"]["points"] == 5.0 and late["pass_probability"] == 0.0
    assert late["flip_rate"] == 0.05
    # The level reference takes the median flip rate (of two rows, the larger) and still misses sometimes.
    level = payload["level_recipe"]
    assert level["flip_rate"] == 0.05 and 0.0 < level["pass_probability"] < 1.0
    assert (out / "gap_power.png").stat().st_size > 0


def test_gap_power_says_when_nothing_matches(tmp_path: Path) -> None:
    from research import gap_power

    with pytest.raises(SystemExit, match="no news_kfold"):
        gap_power.main(["--results", str(tmp_path)])
