"""How much one look at the BBC test split can say about issue 9's 1 KB target, for each recipe measured.

    python -m research.gap_power [--folds 0 1] [--test-docs 431] [--within 0.5] [--resamples 4000]

The target: on the test split (431 documents) accuracy at every cut from 1 KB up within 0.5 point of the
best, i.e. at most 2 documents. For every cross-validation experiment already in research/results
(`news_kfold_<tag>.json`, and `news_ensemble_<name>.json` for ensembles), pooled over `--folds`: its 1 KB
gap with a paired-bootstrap 95% interval, and the chance that a test split of `--test-docs` documents
drawn from those held-out documents would show a gap of at most `--within` points
(`benchmarks.long_docs.pass_probability`). The fold models learn from 4/5 of the documents, the final fit
from the train split, so this treats the recipe, not one trained model, as the thing a test look samples.
Nothing is trained or scored here. Writes research/results/gap_power.{json,png}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.common import environment, markdown_table
from benchmarks.long_docs import GAP_AT, gap_interval, pass_probability
from research import write_json
from research.news_kfold import RESULTS_DIR, pooled_right, shared_cuts

# The names docs/long-documents.md gives the experiments (a tag not listed keeps its own name).
RULES = {
    "news_kfold_65min": "shipped recipe",
    "news_kfold_30min": "shipped recipe, 30 min",
    "news_kfold_65min-distill50": "H",
    "news_kfold_65min-distill80": "I",
    "news_kfold_65min-distill50-b32k": "J",
    "news_kfold_13ep-distill50-b32k": "K",
    "news_kfold_9ep-distill50-b65k-d64": "L",
    "news_kfold_9ep-distill50-b131k-d32": "M",
    "news_kfold_9ep-distill50-w32k-d64": "N",
    "news_kfold_9ep-distill50-b65k-d64-attnpool": "O",
    "news_kfold_9ep-distill50-tfidf262k": "P",
    "news_kfold_9ep-distill50-b65k-d64-attnpool-s2": "O, seed 2",
    "news_ensemble_O-O2": "Q",
    "news_ensemble_O-P": "O + P",
}


def experiment_files(results: Path) -> list[Path]:
    """Cross-validation results files: every news_kfold one, and news_ensemble ones that are not final fits."""
    kfold = sorted(results.glob("news_kfold_*.json"))
    ensembles = [p for p in sorted(results.glob("news_ensemble_*.json")) if "_final_" not in p.name]
    return kfold + ensembles


def measure(path: Path, folds: list[int], test_docs: int, within: float, resamples: int) -> dict[str, Any] | None:
    """One experiment pooled over `folds`, or None when it lacks any of them."""
    by_fold = {int(r["fold"]): r for r in json.loads(path.read_text())["rows"]}
    if any(f not in by_fold for f in folds):
        return None
    rows = [by_fold[f] for f in folds]
    right = pooled_right(rows, shared_cuts(rows))
    return {
        "experiment": path.stem,
        "name": RULES.get(path.stem, path.stem),
        "documents": len(right["full"]),
        "whole": round(100 * float(right["full"].mean()), 2),
        "at_1024": round(100 * float(right[str(GAP_AT)].mean()), 2),
        f"gap_{GAP_AT}": gap_interval(right),
        # Documents right whole but wrong on the first KB: how many flip with length, whatever the net gap.
        "flip_rate": round(float((right["full"] & ~right[str(GAP_AT)]).mean()), 4),
        "pass_probability": round(pass_probability(right, test_docs, within=within, resamples=resamples), 3),
    }


def level_recipe(
    flip_rate: float, test_docs: int, within: float, resamples: int, population: int = 100_000
) -> dict[str, Any]:
    """A recipe with no 1 KB gap at all: `flip_rate` of the documents right only whole and as many right
    only on the first KB, every other document right at every cut. How often one look still misses."""
    k = round(flip_rate * population)
    whole = [i >= k for i in range(population)]
    first_kb = [not (k <= i < 2 * k) for i in range(population)]
    right = {str(GAP_AT): first_kb, "full": whole}
    return {
        "flip_rate": flip_rate,
        "pass_probability": round(pass_probability(right, test_docs, within=within, resamples=resamples), 3),
    }


def plot(payload: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = payload["rows"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, r in enumerate(rows):
        g = r[f"gap_{GAP_AT}"]
        lo, hi = g["ci95"]
        ax.errorbar(
            g["points"],
            100 * r["pass_probability"],
            xerr=[[g["points"] - lo], [hi - g["points"]]],
            fmt="o",
            color="tab:blue",
            ecolor="0.8",
            capsize=2,
        )
        ax.annotate(
            r["name"],
            (g["points"], 100 * r["pass_probability"]),
            xytext=(4, 4 if i % 2 else -12),
            textcoords="offset points",
        )
    ax.axvline(payload["within"], ls="--", color="tab:red", lw=1)
    level = payload["level_recipe"]
    ax.axhline(100 * level["pass_probability"], ls=":", color="tab:green", lw=1)
    ax.annotate(
        f"a recipe with no gap, {100 * level['flip_rate']:.1f}% of documents flipping each way",
        (ax.get_xlim()[1], 100 * level["pass_probability"]),
        xytext=(-4, 4),
        textcoords="offset points",
        ha="right",
        color="tab:green",
    )
    ax.set_xlabel(f"cross-validated 1 KB gap, points (folds {payload['folds']}, 95% interval in grey)")
    ax.set_ylabel(f"chance a {payload['test_docs']}-document split shows <= {payload['within']} point (%)")
    ax.set_ylim(0, 100)
    ax.set_title("How often one test look meets the 1 KB target, per recipe")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--folds", type=int, nargs="+", default=[0, 1], help="pool these CV folds (every experiment has 0 and 1)"
    )
    ap.add_argument("--test-docs", type=int, default=431, help="documents in the split one look scores (BBC test: 431)")
    ap.add_argument("--within", type=float, default=0.5, help="the target: points the 1 KB cut may trail the best")
    ap.add_argument("--resamples", type=int, default=4000)
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="where the experiments' results files are")
    ap.add_argument("--out", default="gap_power", help="results file stem under research/results")
    args = ap.parse_args(argv)
    if args.test_docs < 1 or args.resamples < 1 or args.within < 0:
        ap.error("--test-docs and --resamples must be at least 1 and --within at least 0")

    measured = [
        measure(p, args.folds, args.test_docs, args.within, args.resamples) for p in experiment_files(args.results)
    ]
    rows = sorted((r for r in measured if r is not None), key=lambda r: r[f"gap_{GAP_AT}"]["points"])
    if not rows:
        raise SystemExit(f"no news_kfold / news_ensemble results with folds {args.folds} under {args.results}")
    payload = {
        "benchmark": "gap_power",
        "folds": args.folds,
        "test_docs": args.test_docs,
        "within": args.within,
        "resamples": args.resamples,
        "environment": environment(),
        "rows": rows,
    }
    median_flip = sorted(r["flip_rate"] for r in rows)[len(rows) // 2]
    payload["level_recipe"] = level_recipe(median_flip, args.test_docs, args.within, args.resamples)
    path = write_json(f"{args.out}.json", payload)
    plot(payload, path.with_suffix(".png"))
    print(
        markdown_table(
            [
                "recipe",
                "CV docs",
                "whole",
                "1 KB",
                "1 KB gap (95%)",
                f"P(one {args.test_docs}-doc look <= {args.within})",
            ],
            [
                [
                    r["name"],
                    r["documents"],
                    f"{r['whole']:.1f}",
                    f"{r['at_1024']:.1f}",
                    f"{r[f'gap_{GAP_AT}']['points']:.2f} ({r[f'gap_{GAP_AT}']['ci95'][0]:.2f}-{r[f'gap_{GAP_AT}']['ci95'][1]:.2f})",
                    f"{100 * r['pass_probability']:.0f}%",
                ]
                for r in rows
            ],
        )
    )
    level = payload["level_recipe"]
    print(
        f"a recipe with no gap at all and the median flip rate ({100 * level['flip_rate']:.2f}% of documents "
        f"right only whole, as many right only at 1 KB): {100 * level['pass_probability']:.0f}% per look"
    )
    print(f"wrote {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
