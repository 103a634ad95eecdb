"""k-fold cross-validation on Brown: the LARA genre model at full length vs its first 2,048 bytes, beside
TF-IDF + logistic regression on the same folds (the fixed 109-text test split alone is noisy).

    python -m research.brown_kfold [--folds 0 1 2 3 4] [--budget 12] [--threads 1] [--init-from DIR]
        [--tag NAME --train-args "ARGS"]

--train-args adds lara_serve.model_export.training.train options to every fold's run (a recipe: text augmentation, config
overrides); --tag keeps that recipe's runs and results apart (research/results/brown_kfold_NAME.json).

Folds: lara_serve.model_export.training.tasks.fold_split, 5 folds over all 500 texts, stratified by genre, seed 1234. For
fold K: lara-text-genre's architecture, initialized from a BBC model's weights (--init-from, default the
shipped lara-text-news-bytes; every tensor but the 4-genre head), trained on the other four folds with the shipped genre model's recipe (mixed-length windows
of 256 B - 4 KB, lr 1e-3 warmup+cosine) for --budget minutes of one core (CPU time, so folds running side
by side stay comparable), then scored on fold K at full length and on its first 2,048 bytes. The TF-IDF
anchor is fit on the same four folds, at full length and on first-2,048-byte texts. Nothing is selected
on the held-out fold: each run trains to its budget and its last weights are scored.

Rows merge into research/results/brown_kfold.json after every fold (folds may run in parallel processes);
the summary pools the 500 held-out predictions. A fold whose artifact exists is scored again, not retrained.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import merge_fold_row
from benchmarks.long_docs import first_bytes, tfidf_classifier
from research import RESULTS

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "brown-kfold"
OUT = RESULTS / "brown_kfold.json"
N_FOLDS = 5
FIRST = 2048


def tfidf_scores(train: tuple[list[str], list[int]], test: tuple[list[str], list[int]]) -> dict[str, float]:
    out = {}
    for key, first in (("full", None), (f"first_{FIRST}", FIRST)):
        clf = tfidf_classifier().fit(first_bytes(train[0], first), train[1])
        out[key] = float((clf.predict(first_bytes(test[0], first)) == test[1]).mean())
    return out


DEFAULT_INIT = ROOT / "model_repository" / "lara-text-news-bytes"


def paths(tag: str | None) -> tuple[Path, Path]:
    """The runs folder and the results file of a recipe (no tag: the first recipe's, as committed)."""
    if not tag:
        return RUNS, OUT
    return RUNS.with_name(f"brown-kfold-{tag}"), OUT.with_name(f"brown_kfold_{tag}.json")


def run_fold(
    fold: int,
    budget_min: float,
    threads: int,
    seed: int,
    score_limit: int | None = None,
    init_from: Path = DEFAULT_INIT,
    tag: str | None = None,
    train_args: list[str] | None = None,
) -> dict[str, Any]:
    from lara_serve.model_export.models.hub import load_config, load_pretrained
    from lara_serve.model_export.training import train
    from lara_serve.model_export.training.long_docs import accuracy_on
    from lara_serve.model_export.training.tasks import fold_split, text_docs

    runs = paths(tag)[0]
    out, ckpt = runs / f"fold-{fold}", runs / "ckpt" / f"fold-{fold}"
    argv = ["--model", "lara-text-genre", "--fold", f"{fold}/{N_FOLDS}", "--length-mix", "--epochs", "200"]
    argv += ["--init-from", str(init_from), "--time-budget", str(budget_min)]
    argv += ["--clock", "cpu", "--threads", str(threads), "--seed", str(seed), "--no-test", "--eval-limit", "20"]
    argv += ["--out", str(out), "--run-dir", str(ckpt)] + list(train_args or [])
    done = (out / "config.json").is_file() and load_config(out)["training"].get("time_budget_min") == budget_min
    t0 = time.perf_counter()
    if not done:
        train.train(train.parse_args(argv))
    torch.set_num_threads(threads)
    conf = load_config(out)
    model = load_pretrained(out)
    texts, labels = text_docs("brown", fold_split(fold, N_FOLDS, "test"))
    texts, labels = texts[:score_limit], labels[:score_limit]
    raws = [t.encode("utf-8") for t in texts]
    lara = {
        "full": accuracy_on(model, raws, labels, batch_size=4),
        f"first_{FIRST}": accuracy_on(model, [r[:FIRST] for r in raws], labels),
    }
    anchor = tfidf_scores(text_docs("brown", fold_split(fold, N_FOLDS, "train")), (texts, labels))
    row = {
        "fold": fold,
        "n_test": len(raws),
        "lara": lara,
        "tfidf": anchor,
        "train_time_s": conf["metrics"]["train_time_s"],
        "epochs_done": conf["metrics"].get("epochs_done"),
        "command": "python -m lara_serve.model_export.training.train " + " ".join(argv),
    }
    if not done:  # a fold scored again keeps its training call's wall time (merge_fold_row)
        row["wall_time_s"] = round(time.perf_counter() - t0, 1)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and sd over folds, and accuracy pooled over every held-out text (folds weighted by size)."""
    total = sum(r["n_test"] for r in rows)
    out: dict[str, Any] = {"folds": len(rows), "texts": total}
    for model in ("lara", "tfidf"):
        for key in ("full", f"first_{FIRST}"):
            accs = [r[model][key] for r in rows]
            out[f"{model}_{key}"] = {
                "pooled": round(sum(r[model][key] * r["n_test"] for r in rows) / total, 4),
                "mean": round(statistics.fmean(accs), 4),
                "sd": round(statistics.stdev(accs), 4) if len(accs) > 1 else None,
            }
    out["lara_full_minus_first"] = [round(r["lara"]["full"] - r["lara"][f"first_{FIRST}"], 4) for r in rows]
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [("lara", "full"), ("lara", f"first_{FIRST}"), ("tfidf", "full"), ("tfidf", f"first_{FIRST}")]
    names = ["LARA\nfull text", f"LARA\nfirst {FIRST} B", "TF-IDF+LR\nfull text", f"TF-IDF+LR\nfirst {FIRST} B"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (model, key) in enumerate(bars):
        accs = [100 * r[model][key] for r in rows]
        ax.bar(i, statistics.fmean(accs), color="tab:blue" if model == "lara" else "tab:gray", alpha=0.7)
        ax.scatter([i] * len(accs), accs, color="black", s=12, zorder=3)
    ax.set_xticks(range(len(bars)), names)
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_ylim(40, 100)
    ax.set_title(f"Brown genres, {len(rows)}-fold cross-validation (bars: mean, dots: folds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge(
    row: dict[str, Any], budget_min: float, threads: int, tag: str | None = None, train_args: list[str] | None = None
) -> dict[str, Any]:
    """Add one fold's row to the results file (parallel fold processes write the same file) and redraw."""
    runs, out = paths(tag)
    header = {
        "benchmark": "python -m research.brown_kfold" + (f" --tag {tag}" if tag else ""),
        "budget_min": budget_min,
        "budget": f"{budget_min:g} min of one core (CPU time, {threads} thread) per fold, "
        "from lara-text-news-bytes's weights, mixed-length windows 256 B - 4 KB",
        "train_args": list(train_args or []),
    }
    payload = merge_fold_row(out, runs, row, header, summarize)
    plot(payload["rows"], out.with_suffix(".png"))
    return payload


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folds", type=int, nargs="+", default=list(range(N_FOLDS)), choices=range(N_FOLDS))
    p.add_argument("--budget", type=float, default=12.0, help="minutes of one core (CPU time) per fold")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--score-limit", type=int, default=None, help="score only the first N held-out texts (smoke tests)")
    p.add_argument(
        "--init-from",
        type=Path,
        default=DEFAULT_INIT,
        help="BBC model folder whose weights start every fold (the committed results: lara-text-news-bytes as of "
        "commit bb0359e, see the README)",
    )
    p.add_argument("--tag", default=None, help="name of this recipe's runs and results file")
    p.add_argument(
        "--train-args",
        default="",
        help="extra lara_serve.model_export.training.train options for every fold (one string)",
    )
    args = p.parse_args(argv)
    extra = shlex.split(args.train_args)
    for fold in args.folds:
        row = run_fold(fold, args.budget, args.threads, args.seed, args.score_limit, args.init_from, args.tag, extra)
        payload = merge(row, args.budget, args.threads, args.tag, extra)
        print(json.dumps({"fold": fold, "lara": row["lara"], "tfidf": row["tfidf"]}), flush=True)
    print(json.dumps(payload["summary"], indent=2))


if __name__ == "__main__":
    main()
