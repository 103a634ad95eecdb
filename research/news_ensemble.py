"""Cross-validated accuracy vs length of an ensemble of lara-text-news-bytes recipes: on each held-out fold, the
mean of the probabilities of fold models that `research.news_kfold` already trained (one per member
experiment), scored like `news_kfold` scores one model (every cut, pooled 1 KB gap, paired interval).

    python -m research.news_ensemble --members 9ep-distill50-b65k-d64-attnpool \\
        9ep-distill50-b65k-d64-attnpool-s2 --folds 0 1 --name attnpool-s1s2 \\
        --against research/results/news_kfold_9ep-distill50-b65k-d64-attnpool.json

    python -m research.news_ensemble --final runs/news-O runs/news-O2 --split val --name attnpool-s1s2
        # final fits (model directories) as one ensemble on the fixed holdout (or --split test)

A member is a news_kfold experiment tag (its runs are runs/news-kfold-<tag>/fold-K, its results
research/results/news_kfold_<tag>.json). Nothing is trained here and nothing is selected on the held-out
folds. Results: research/results/news_ensemble_<name>.{json,png}; the summary carries each member alone
on the same folds ("parts", dashed in the plot) and, with --against, the paired change in the 1 KB gap.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import merge_fold_row
from benchmarks.long_docs import truncation_right
from research.news_kfold import N_FOLDS, RESULTS_DIR, RUNS_ROOT, compare, plot, summarize


def member_dir(tag: str, fold: int) -> Path:
    """The fold-`fold` model of news_kfold experiment `tag`, checked to exist and to hold that fold out."""
    from lara_serve.model_export.models.hub import load_config

    path = RUNS_ROOT / f"news-kfold-{tag}" / f"fold-{fold}"
    if not (path / "config.json").is_file():
        raise SystemExit(
            f"member {tag!r} has no fold-{fold} model at {path}: train it first with "
            f"`python -m research.news_kfold --folds {fold} ...` and the name that gives the tag {tag!r}"
        )
    command = load_config(path)["training"]["command"]
    if f"--fold {fold}/{N_FOLDS}" not in command:
        raise SystemExit(f"{path} was not trained with fold {fold} of {N_FOLDS} held out: {command}")
    return path


def member_rows(tag: str, folds: list[int]) -> list[dict[str, Any]]:
    """A member's own results rows on `folds` (from its news_kfold results file)."""
    path = RESULTS_DIR / f"news_kfold_{tag}.json"
    if not path.is_file():
        raise SystemExit(f"member {tag!r}: no results file {path} (news_kfold writes it when a fold finishes)")
    rows = {r["fold"]: r for r in json.loads(path.read_text())["rows"]}
    missing = [f for f in folds if f not in rows]
    if missing:
        raise SystemExit(f"member {tag!r}: {path} has no rows for folds {missing}")
    return [rows[f] for f in folds]


def same_documents(member: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A member's rows on the ensemble rows' folds and documents (the first n_test of each fold, as
    --score-limit scores them), so each member alone is compared on exactly the ensemble's documents."""
    by_fold = {r["fold"]: r for r in member}
    out = []
    for r in rows:
        m, n = by_fold[r["fold"]], r["n_test"]
        out.append({"fold": r["fold"], "n_test": n, "right": {k: v[:n] for k, v in m["right"].items()}})
    return out


def score_fold(fold: int, members: list[str], score_limit: int | None = None) -> dict[str, Any]:
    from lara_serve.model_export.models.hub import load_pretrained
    from lara_serve.model_export.training.ensemble import ProbabilityMean
    from lara_serve.model_export.training.tasks import fold_split, text_docs

    texts, labels = text_docs("news", fold_split(fold, N_FOLDS, "test"))
    texts, labels = texts[:score_limit], labels[:score_limit]
    model = ProbabilityMean([load_pretrained(member_dir(tag, fold)) for tag in members]).eval()
    right = truncation_right(model, texts, labels)
    return {
        "fold": fold,
        "n_test": len(texts),
        "truncation": {k: round(sum(v) / len(v), 4) for k, v in right.items()},
        "right": {k: "".join("1" if hit else "0" for hit in v) for k, v in right.items()},
    }


def score_final(dirs: list[Path], split: str, per_class: int, limit: int | None = None) -> dict[str, Any]:
    """An ensemble of final fits (model directories) on a fixed split, measured as benchmarks.long_docs
    measures a shipped model; on the holdout ("val") each member alone too (on "test" only the ensemble:
    the one look a rule allows)."""
    from benchmarks.long_docs import measure
    from lara_serve.model_export.models.hub import load_pretrained
    from lara_serve.model_export.training.ensemble import ProbabilityMean

    members = [load_pretrained(d) for d in dirs]
    out = {
        "members": [str(d) for d in dirs],
        "ensemble": measure(ProbabilityMean(members).eval(), "news", per_class, split, limit),
    }
    if split == "val":
        out["alone"] = {str(d): measure(m, "news", per_class, split, limit) for d, m in zip(dirs, members, strict=True)}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", nargs="+", default=[], help="news_kfold experiment tags, e.g. 9ep-distill50")
    p.add_argument(
        "--final",
        nargs="+",
        type=Path,
        default=[],
        metavar="DIR",
        help="instead of --members: model directories of final fits, scored as one ensemble on --split",
    )
    p.add_argument("--split", choices=["val", "test"], default="val", help="with --final: the split to score")
    p.add_argument("--per-class", type=int, default=8, help="with --final: composites per class and length")
    p.add_argument("--folds", type=int, nargs="+", default=[0, 1], choices=range(N_FOLDS))
    p.add_argument("--name", required=True, help="names the results file (letters, digits, '-', '_')")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--score-limit", type=int, default=None, help="score only the first N held-out docs (smoke tests)")
    p.add_argument("--against", type=Path, default=None, help="a results JSON to compare with, paired, on shared folds")
    args = p.parse_args(argv)
    if not args.name.replace("-", "").replace("_", "").isalnum():
        p.error(f"--name {args.name!r}: use letters, digits, '-' and '_' (it names a file)")
    if args.final:
        if len(set(args.final)) < 2 or args.members:
            p.error("--final takes at least 2 different model directories, and no --members")
        torch.set_num_threads(args.threads)
        result = score_final(args.final, args.split, args.per_class, args.score_limit)
        path = RESULTS_DIR / f"news_ensemble_{args.name}_final_{args.split}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2) + f"\nwrote {path}")
        return
    if len(set(args.members)) < 2:
        p.error(f"--members: an ensemble needs at least 2 different experiments, got {args.members}")
    base_rows = None
    if args.against is not None:
        if not args.against.is_file():
            p.error(f"--against {args.against}: no such results file")
        base_rows = json.loads(args.against.read_text())["rows"]
    alone = {tag: member_rows(tag, args.folds) for tag in args.members}
    heads = [json.loads((RESULTS_DIR / f"news_kfold_{tag}.json").read_text()) for tag in args.members]
    epochs, budgets = {h.get("epochs") for h in heads}, {h.get("budget_min") for h in heads}
    header = {
        "benchmark": "python -m research.news_ensemble",
        "budget_min": budgets.pop() if len(budgets) == 1 else None,  # the members' training, when they share it
        "epochs": epochs.pop() if len(epochs) == 1 else None,
        "name": f"ensemble {args.name}",
        "recipe": "mean of the softmax probabilities of these news_kfold experiments' fold models: "
        + ", ".join(args.members),
        "members": args.members,
    }
    if args.against is not None:
        header["against"] = str(args.against)

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        out = summarize(rows)
        out["parts"] = {tag: summarize(same_documents(alone[tag], rows)) for tag in args.members}
        if base_rows is not None:
            out["against"] = compare(rows, base_rows)
        return out

    torch.set_num_threads(args.threads)
    out = RESULTS_DIR / f"news_ensemble_{args.name}.json"
    payload: dict[str, Any] = {}
    for fold in args.folds:
        row = score_fold(fold, args.members, args.score_limit)
        payload = merge_fold_row(out, RUNS_ROOT / f"news-ensemble-{args.name}", row, header, summary)
        plot(payload, out.with_suffix(".png"))
        print(json.dumps({"fold": fold, "truncation": row["truncation"]}), flush=True)
    print(json.dumps(payload["summary"], indent=2))


if __name__ == "__main__":
    main()
