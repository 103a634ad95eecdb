"""5-fold cross-validation of lara-text-news-bytes's training recipe over all 2,127 BBC documents: accuracy on
the first n bytes and on whole documents, pooled over the held-out folds, and how far the first KB falls
below the best cut (the 1 KB gap) with a paired-bootstrap 95% interval.

    python -m research.news_kfold [--folds 0 1 2 3 4] [--budget 30] [--threads 1] [--seed 1]
    python -m research.news_kfold --folds 0 1 --budget 65 --length-mix '{"head_prob": 0.9}' --name head90 \\
        --against research/results/news_kfold_65min.json     # another recipe, paired against the shipped one

Why: on the fixed 431-document test split one document is 0.23 point, and a paired-bootstrap interval on
the 1 KB gap spans about 2 points; pooled over every document the interval is several times narrower.

Folds: lara_serve.model_export.training.tasks.fold_split (5 folds over train + test, stratified by label, seeded). For fold K:
lara-text-news-bytes trained from scratch on the other four folds with the shipped model's recipe (mixed-length
windows with half of the plain windows from the document head, `--length-mix '{"head_prob": 0.5}'`,
warmup+cosine fitted to --budget minutes of one core, CPU clock, so folds running side by side stay
comparable; the shipped model had 65 minutes), then its last weights are scored on fold K at every cut.
Nothing is selected on the held-out fold.

Rows merge into research/results/news_kfold_<budget>min[-<name>].json (<N>ep with --epochs) after
every fold (folds may run as parallel processes); each row keeps its per-document results, so the summary
pools all held-out documents. A fold whose artifact exists at the same budget (or epochs) is scored
again, not retrained. With --against, the summary also
compares this recipe with another results file on the folds both ran: the change in the pooled 1 KB
gap, with an interval from resampling the shared documents together for both recipes.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import merge_fold_row
from benchmarks.long_docs import GAP_AT, gap_difference, gap_interval, truncation_right
from research import RESULTS

ROOT = Path(__file__).resolve().parent.parent
RUNS_ROOT = ROOT / "runs"
RESULTS_DIR = RESULTS
N_FOLDS = 5
RECIPE = '{"head_prob": 0.5}'  # the shipped lara-text-news-bytes's --length-mix


@dataclass(frozen=True)
class Recipe:
    """How every fold is trained (what lara_serve.model_export.training.train gets besides the fold); defaults = the shipped
    model's recipe at a 30-minute budget. With `epochs`, each fold trains for exactly that many epochs
    (schedule over steps) instead of for budget_min CPU-minutes."""

    budget_min: float = 30.0
    threads: int = 1
    seed: int = 1
    length_mix: str = RECIPE
    name: str = ""  # another recipe's runs and results get their own names
    distill: float | None = None
    override: str = "{}"
    epochs: int | None = None

    @property
    def tag(self) -> str:
        return (f"{self.epochs}ep" if self.epochs else f"{self.budget_min:g}min") + (
            f"-{self.name}" if self.name else ""
        )

    def paths(self) -> tuple[Path, Path]:
        """(runs folder, results JSON); each experiment has its own, so a new run neither retrains over
        nor drops another experiment's folds."""
        return RUNS_ROOT / f"news-kfold-{self.tag}", RESULTS_DIR / f"news_kfold_{self.tag}.json"

    def argv(self, fold: int, resume: bool = False) -> list[str]:
        """The training command line of one fold (lara_serve.model_export.training.train arguments)."""
        runs = self.paths()[0]
        argv = ["--model", "lara-text-news-bytes", "--fold", f"{fold}/{N_FOLDS}", "--length-mix", self.length_mix]
        argv += ["--epochs", str(self.epochs or 200)]
        if self.distill is not None:
            argv += ["--distill", str(self.distill)]
        if self.override != "{}":
            argv += ["--override", self.override]
        if not self.epochs:
            argv += ["--time-budget", str(self.budget_min)]
        argv += ["--clock", "cpu", "--threads", str(self.threads), "--seed", str(self.seed)]
        argv += ["--no-test", "--eval-limit", "20", "--out", str(runs / f"fold-{fold}")]
        return argv + ["--run-dir", str(runs / "ckpt" / f"fold-{fold}")] + (["--resume"] if resume else [])

    def describe(self) -> str:
        """One line for the results header."""
        length = (
            f"{self.epochs} epochs ({self.threads} thread)"
            if self.epochs
            else f"{self.budget_min:g} min of one core (CPU time, {self.threads} thread)"
        )
        return (
            f"lara-text-news-bytes from scratch, --length-mix '{self.length_mix}'"
            + ("" if self.distill is None else f", --distill {self.distill:g}")
            + ("" if self.override == "{}" else f", --override '{self.override}'")
            + f", {length} per fold, last weights"
        )


def run_fold(fold: int, recipe: Recipe, score_limit: int | None = None, resume: bool = False) -> dict[str, Any]:
    from lara_serve.model_export.models.hub import load_config, load_pretrained
    from lara_serve.model_export.training import train
    from lara_serve.model_export.training.tasks import fold_split, text_docs

    args = train.parse_args(recipe.argv(fold, resume))
    out = Path(args.out)
    resumed = resume and (Path(args.run_dir) / "state.json").is_file()
    trained = load_config(out)["training"] if (out / "config.json").is_file() else {}
    if recipe.epochs:
        done = trained.get("epochs") == recipe.epochs and trained.get("time_budget_min") is None
    else:
        done = trained.get("time_budget_min") == recipe.budget_min
    t0 = time.perf_counter()
    if not done:
        train.train(args)
    torch.set_num_threads(recipe.threads)
    conf = load_config(out)
    texts, labels = text_docs("news", fold_split(fold, N_FOLDS, "test"))
    texts, labels = texts[:score_limit], labels[:score_limit]
    model = load_pretrained(out)
    right = truncation_right(model, texts, labels)
    row = {
        "fold": fold,
        "n_test": len(texts),
        "truncation": {k: round(sum(v) / len(v), 4) for k, v in right.items()},
        # per held-out document, in fold order: "1" right, "0" wrong (compact; the summary pools these)
        "right": {k: "".join("1" if hit else "0" for hit in v) for k, v in right.items()},
        **({"parts": part_right(model, texts, labels)} if getattr(model, "tfidf", None) is not None else {}),
        "train_time_s": conf["metrics"]["train_time_s"],
        "epochs_done": conf["metrics"].get("epochs_done"),
        "command": train.command_line(args),
    }
    if not done:  # a fold scored again keeps its training call's wall time (merge_fold_row)
        row["wall_time_s"] = round(time.perf_counter() - t0, 1)
        if resumed:  # that wall time covers only the epochs after the checkpoint
            row["resumed"] = True
    return row


PART_LABELS = {"deep": "LARA (deep) path alone", "wide": "tf-idf (wide) path alone"}


class Readout(torch.nn.Module):
    """One path of a Wide & Deep text model as a classifier: "deep" (the LARA encoder and its head) or "wide"
    (the tf-idf head), so an ablation scores each path of the same trained model alone."""

    def __init__(self, model: torch.nn.Module, part: str) -> None:
        super().__init__()
        self.model, self.part = model, part

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return getattr(self.model, f"forward_{self.part}")(input_ids, attention_mask)


def part_right(model: torch.nn.Module, texts: list[str], labels: list[int]) -> dict[str, dict[str, str]]:
    """Per path ("deep", "wide"), per cut, per held-out document: "1" right, "0" wrong."""
    out = {}
    for part in ("deep", "wide"):
        right = truncation_right(Readout(model, part), texts, labels)
        out[part] = {k: "".join("1" if hit else "0" for hit in v) for k, v in right.items()}
    return out


def shared_cuts(rows: list[dict[str, Any]]) -> list[str]:
    """The cuts every row was scored at."""
    return [k for k in rows[0]["right"] if all(k in r["right"] for r in rows)]


def pooled_right(rows: list[dict[str, Any]], cuts: list[str]) -> dict[str, np.ndarray]:
    """Per cut, whether each held-out document of `rows` was right, folds concatenated in row order."""
    return {k: np.array([c == "1" for r in rows for c in r["right"][k]]) for k in cuts}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy per cut pooled over every held-out document, and the pooled 1 KB gap (paired bootstrap)."""
    cuts = shared_cuts(rows)
    per_fold = [pooled_right([r], cuts) for r in rows]
    pooled = pooled_right(rows, cuts)
    out = {
        "folds": [r["fold"] for r in rows],
        "documents": int(sum(r["n_test"] for r in rows)),
        "truncation": {k: round(float(v.mean()), 4) for k, v in pooled.items()},
        f"gap_{GAP_AT}": gap_interval(pooled),
        f"gap_{GAP_AT}_per_fold": [gap_interval(f)["points"] for f in per_fold],
    }
    if all("parts" in r for r in rows):  # a Wide & Deep model: each path alone, on the same documents
        out["parts"] = {
            part: summarize([{"fold": r["fold"], "n_test": r["n_test"], "right": r["parts"][part]} for r in rows])
            for part in rows[0]["parts"]
        }
    return out


def compare(rows: list[dict[str, Any]], base_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """This experiment against another's rows on the folds both have (the same documents, so paired): how
    much smaller its pooled 1 KB gap is, with a 95% interval, and its accuracy change at 1 KB and whole."""
    base_by_fold = {r["fold"]: r for r in base_rows}
    mine = [r for r in rows if r["fold"] in base_by_fold]
    if not mine:
        return {"folds": [], "documents": 0}
    theirs = [base_by_fold[r["fold"]] for r in mine]
    cuts = shared_cuts(mine + theirs)
    new, base = pooled_right(mine, cuts), pooled_right(theirs, cuts)
    return {
        "folds": [r["fold"] for r in mine],
        "documents": int(sum(r["n_test"] for r in mine)),
        f"gap_{GAP_AT}_reduction": gap_difference(base, new),
        "accuracy_change_points": {
            k: round(100 * float(new[k].mean() - base[k].mean()), 2) for k in (str(GAP_AT), "full")
        },
    }


def plot(payload: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, r in enumerate(payload["rows"]):
        xs = [int(k) for k in r["truncation"] if k != "full"]
        ys = [100 * r["truncation"][str(x)] for x in xs]
        ax.plot(xs, ys, ".-", color="tab:blue", alpha=0.3, lw=1, label="folds: first n bytes" if i == 0 else None)
    s = payload["summary"]
    xs = [int(k) for k in s["truncation"] if k != "full"]
    ax.plot(xs, [100 * s["truncation"][str(x)] for x in xs], "o-", color="tab:blue", label="pooled: first n bytes")
    ax.axhline(100 * s["truncation"]["full"], ls=":", color="tab:blue", label="pooled: whole documents")
    for (part, ps), color in zip(s.get("parts", {}).items(), ("tab:orange", "tab:green"), strict=False):
        xs = [int(k) for k in ps["truncation"] if k != "full"]  # a Wide & Deep model: each path alone
        ax.plot(xs, [100 * ps["truncation"][str(x)] for x in xs], "s--", color=color, label=PART_LABELS.get(part, part))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes given to the model")
    ax.set_ylabel("held-out accuracy (%)")
    g = s[f"gap_{GAP_AT}"]
    if payload.get("epochs"):
        budget = f"{payload['epochs']} epochs"
    elif payload.get("budget_min") is not None:
        budget = f"{payload['budget_min']:g} CPU-min"
    else:  # an ensemble of experiments trained for different budgets
        budget = "mixed budgets"
    ax.set_title(
        f"lara-text-news-bytes recipe{' ' + payload['name'] if payload.get('name') else ''}, {budget} per fold\n"
        f"{len(s['folds'])} of {N_FOLDS} folds, {s['documents']} held-out BBC docs; "
        f"1 KB gap {g['points']} points (95%: {g['ci95'][0]}-{g['ci95'][1]})",
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folds", type=int, nargs="+", default=list(range(N_FOLDS)), choices=range(N_FOLDS))
    p.add_argument("--budget", type=float, default=30.0, help="minutes of one core (CPU time) per fold")
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="train each fold for exactly this many epochs instead of --budget minutes (independent of machine load)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--score-limit", type=int, default=None, help="score only the first N held-out docs (smoke tests)")
    p.add_argument("--length-mix", default=RECIPE, help=f"the recipe's --length-mix JSON (default: shipped, {RECIPE})")
    p.add_argument(
        "--distill",
        type=float,
        default=None,
        metavar="WEIGHT",
        help="train toward a TF-IDF teacher's window probabilities with this weight (lara_serve.model_export.training.train --distill)",
    )
    p.add_argument(
        "--override",
        default="{}",
        metavar="JSON",
        help="model config overrides (lara_serve.model_export.training.train --override), e.g. '{\"ngram_buckets\": 32749}'",
    )
    p.add_argument(
        "--name",
        default="",
        help="names another recipe's runs and results (required with --length-mix, --distill or --override)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted fold from its last finished epoch (its checkpoint under the runs folder)",
    )
    p.add_argument("--against", type=Path, default=None, help="a results JSON to compare with, paired, on shared folds")
    args = p.parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        p.error(f"--epochs {args.epochs}: expected a whole number of epochs >= 1")
    try:
        if not isinstance(json.loads(args.override), dict):
            raise ValueError("not an object")
    except ValueError as e:
        p.error(f"--override {args.override!r}: expected a JSON object of model config fields ({e})")
    if (args.length_mix != RECIPE or args.distill is not None or args.override != "{}") and not args.name:
        p.error(
            "another recipe (--length-mix, --distill, --override) needs --name, "
            "so its runs and results stay apart from the shipped recipe's"
        )
    if args.name and not args.name.replace("-", "").replace("_", "").isalnum():
        p.error(f"--name {args.name!r}: use letters, digits, '-' and '_' (it names a folder and a file)")
    base_rows: list[dict[str, Any]] | None = None
    if args.against is not None:
        if not args.against.is_file():
            p.error(f"--against {args.against}: no such results file (e.g. research/results/news_kfold_65min.json)")
        base_rows = json.loads(args.against.read_text())["rows"]
    recipe = Recipe(
        budget_min=args.budget,
        threads=args.threads,
        seed=args.seed,
        length_mix=args.length_mix,
        name=args.name,
        distill=args.distill,
        override=args.override,
        epochs=args.epochs,
    )
    header = {
        "benchmark": "python -m research.news_kfold",
        "budget_min": None if args.epochs else args.budget,
        "recipe": recipe.describe(),
    }
    if args.epochs:
        header["epochs"] = args.epochs
    if args.name:
        header["name"] = args.name  # another recipe: its plot's title says which
    if args.against is not None:
        header["against"] = str(args.against)

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        out = summarize(rows)
        if base_rows is not None:
            out["against"] = compare(rows, base_rows)
        return out

    runs, out = recipe.paths()
    for fold in args.folds:
        row = run_fold(fold, recipe, args.score_limit, args.resume)
        payload = merge_fold_row(out, runs, row, header, summary)
        plot(payload, out.with_suffix(".png"))
        print(json.dumps({"fold": fold, "truncation": row["truncation"]}), flush=True)
    print(json.dumps(payload["summary"], indent=2))


if __name__ == "__main__":
    main()
