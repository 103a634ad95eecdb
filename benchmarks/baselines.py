"""Baselines for the shipped models: attention kinds under one budget, and TF-IDF + LR for text.

    python benchmarks/baselines.py --only tfidf image-5ep text [--threads 1]

Every group trains the shipped architecture with the same seed, data
and budget for each attention kind, and merges its rows into benchmarks/results/baselines.json. The
budgets are small (a 2-core shared machine); they are stated in every row and in the markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "baselines.json"
RUNS = ROOT / "runs" / "baselines"

Group = tuple[str, list[str], list[str], str]


def _image_subset(images: int) -> Group:
    """The quick image groups: one epoch over the first `images` train images, tested on 1,000 t10k images."""
    budget = ["--limit", str(images), "--epochs", "1", "--batch-size", "64", "--eval-limit", "1000"]
    text = f"1 epoch over {images:,} train images (batch 64), test = first 1,000 t10k images"
    return "lara-vit-fashion", ["lara", "softmax", "performer", "ra"], budget, text


# name: (registered model, attention kinds, train CLI args describing the budget, budget text)
GROUPS: dict[str, Group] = {
    "image": _image_subset(3000),
    "image-10k": _image_subset(10000),
    # The comparison that separates the methods: the shipped architecture, 5 epochs over the full
    # training split (58,000 images), tested on all of t10k; the per-epoch history gives the wall clock.
    "image-5ep": (
        "lara-vit-fashion",
        ["lara", "performer", "softmax", "ra"],
        ["--epochs", "5", "--batch-size", "64"],
        "5 epochs over the full train split (58,000 images, batch 64, lr 2e-3 warmup+cosine), test = all 10,000 t10k",
    ),
    # Equal compute instead of equal epochs: every kind trains for 20 minutes of one core (the CPU time of a
    # 1-thread process, so jobs sharing the machine stay comparable); warmup+cosine spans the budget, so the
    # faster kinds see more images.
    "image-20min": (
        "lara-vit-fashion",
        ["lara", "performer", "softmax", "ra"],
        ["--epochs", "30", "--time-budget", "20", "--clock", "cpu", "--batch-size", "64"],
        "20 min of one core (CPU time, 1 thread) over the full train split (batch 64, lr 2e-3 warmup+cosine over the budget), test = all 10,000 t10k",
    ),
    "text": (
        "lara-text-news-bytes",
        ["lara", "softmax", "performer"],
        ["--limit", "600", "--epochs", "2", "--train-length", "1024", "--override", '{"max_length": 1024}'],
        "2 epochs over 600 train docs truncated to 1,024 bytes (batch 16); test = whole BBC test split, 1,024 bytes",
    ),
}


def run_group(group: str, threads: int, seed: int, kinds: list[str] | None = None) -> list[dict[str, Any]]:
    from lara_serve.model_export.training import train

    name, group_kinds, budget_args, budget = GROUPS[group]
    rows = []
    for kind in kinds or group_kinds:
        out = RUNS / f"{group}-{kind}"
        argv = [
            "--model",
            name,
            "--attention",
            kind,
            *budget_args,
            "--out",
            str(out),
            "--run-dir",
            str(RUNS / "ckpt" / f"{group}-{kind}"),
            "--threads",
            str(threads),
            "--seed",
            str(seed),
        ]
        t0 = time.perf_counter()
        m = train.train(train.parse_args(argv))
        rows.append(
            {
                "task": group,
                "model": name,
                "attention": kind,
                "budget": budget,
                "seed": seed,
                "test_accuracy": round(m["test_accuracy"], 4),
                "n_test": m["n_test"],
                "train_time_s": m["train_time_s"],
                "epochs_done": m.get("epochs_done"),
                "wall_time_s": round(time.perf_counter() - t0, 1),
                "threads": threads,
                "command": "python -m lara_serve.model_export.training.train " + " ".join(argv),
                # per epoch: holdout accuracy and cumulative training seconds (accuracy against wall clock)
                "history": [
                    {
                        "epoch": h["epoch"],
                        "val_acc": round(h["val_acc"], 4),
                        # milliseconds: a one-epoch smoke run on a fast machine takes under 0.05 s
                        "train_time_s": round(h["train_time_s"], 3),
                    }
                    for h in m.get("history", [])
                ],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def run_tfidf(seed: int) -> list[dict[str, Any]]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from lara_serve.model_export.training.data import load_news

    train, test = load_news("train"), load_news("test")
    t0 = time.perf_counter()
    vec = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=2)
    x_train = vec.fit_transform([d.text for d in train])
    clf = LogisticRegression(C=10.0, max_iter=2000, random_state=seed).fit(x_train, [d.label for d in train])
    elapsed = time.perf_counter() - t0
    pred = clf.predict(vec.transform([d.text for d in test]))
    acc = float((pred == [d.label for d in test]).mean())
    return [
        {
            "task": "text",
            "model": "tfidf-logreg",
            "attention": "-",
            "seed": seed,
            "budget": "word 1-2-gram TF-IDF (sublinear, min_df 2) + logistic regression (C=10), all train docs",
            "test_accuracy": round(acc, 4),
            "n_test": len(test),
            "train_time_s": round(elapsed, 1),
        }
    ]


def shipped_rows() -> list[dict[str, Any]]:
    rows = []
    for name in ("lara-vit-fashion", "lara-text-news-bytes"):
        path = ROOT / "model_repository" / name / "config.json"
        if path.is_file():
            conf = json.loads(path.read_text())
            tr = conf.get("training", {})
            rows.append(
                {
                    "task": "image" if conf["task"] == "image" else "text",
                    "model": name + " (shipped)",
                    "attention": conf["attention"]["kind"],
                    "seed": conf.get("seed"),
                    "budget": f"{conf['metrics']['epochs']} epochs, {tr.get('time_budget_min')} min budget, full train split",
                    "test_accuracy": round(conf["metrics"]["test_accuracy"], 4),
                    "n_test": conf["metrics"]["n_test"],
                    "train_time_s": conf["metrics"]["train_time_s"],
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| task | model | attention | budget | test accuracy | n test | train time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["task"], r["model"], r["attention"])):
        lines.append(
            f"| {r['task']} | {r['model']} | {r['attention']} | {r['budget']} | "
            f"{100 * r['test_accuracy']:.1f}% | {r['n_test']} | {r['train_time_s']:.0f} |"
        )
    return "\n".join(lines)


def plot_history(rows: list[dict[str, Any]], task: str, out: Path) -> bool:
    """Holdout accuracy per epoch against training time, one line per attention kind (rows with history)."""
    rows = [r for r in rows if r["task"] == task and r.get("history")]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_e, ax_t) = plt.subplots(1, 2, figsize=(10, 4))
    for r in sorted(rows, key=lambda r: r["attention"]):
        ep: list[float] = [h["epoch"] for h in r["history"]]
        if r.get("epochs_done") is not None:  # a time budget ends mid-epoch: place the last point where it stopped
            ep[-1] = min(ep[-1], r["epochs_done"])
        acc = [100 * h["val_acc"] for h in r["history"]]
        minutes = [h["train_time_s"] / 60 for h in r["history"]]
        label = f"{r['attention']} (test {100 * r['test_accuracy']:.2f}%)"
        ax_e.plot(ep, acc, marker="o", label=label)
        ax_t.plot(minutes, acc, marker="o", label=label)
    ax_e.set_xlabel("epochs (the last one partial when the budget ran out)")
    cpu_clock = task in GROUPS and "cpu" in GROUPS[task][2]  # --clock cpu: the budget counts CPU time
    ax_t.set_xlabel("CPU time (min, 1 thread)" if cpu_clock else "training time (min, 1 thread, shared machine)")
    for ax in (ax_e, ax_t):
        ax.set_ylabel("holdout accuracy (%)")
        ax.grid(alpha=0.3)
    ax_e.legend(fontsize=8)
    fig.suptitle(f"{task}: {rows[0]['budget']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def plot_groups(rows: list[dict[str, Any]], groups: list[str]) -> None:
    """One chart per training group among `groups` (baselines_<group>.png beside the results)."""
    for group in groups:
        out = RESULTS.with_name(f"baselines_{group}.png")
        if group in GROUPS and plot_history(rows, group, out):
            print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", default=["tfidf", *GROUPS], choices=["tfidf", "shipped", *GROUPS])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", nargs="+", default=None, help="attention kinds to run (default: the group's)")
    p.add_argument("--plot-only", action="store_true", help="redraw the --only groups' charts from the stored rows")
    args = p.parse_args()
    if args.plot_only:
        plot_groups(json.loads(RESULTS.read_text())["rows"], args.only)
        return
    jobs: list[tuple[str, list[str] | None]] = []
    for group in args.only:
        if group in GROUPS:
            jobs += [(group, [kind]) for kind in args.kinds or GROUPS[group][1]]
        else:
            jobs.append((group, None))
    rows: list[dict[str, Any]] = []
    for group, kinds in jobs:
        new = (
            run_tfidf(args.seed)
            if group == "tfidf"
            else shipped_rows()
            if group == "shipped"
            else run_group(group, args.threads, args.seed, kinds)
        )
        # Merge into the file after every run (groups may also run in parallel processes).
        keys = {(r["task"], r["model"], r["attention"]) for r in new}
        cur = json.loads(RESULTS.read_text())["rows"] if RESULTS.is_file() else []
        rows = [r for r in cur if (r["task"], r["model"], r["attention"]) not in keys] + new
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "markdown": markdown(rows),
                    "machine": "2 shared CPU cores, torch CPU, 1 thread per job (other jobs running: see each row)",
                },
                indent=2,
            )
            + "\n"
        )
    plot_groups(rows, args.only)
    print(markdown(rows))


if __name__ == "__main__":
    main()
