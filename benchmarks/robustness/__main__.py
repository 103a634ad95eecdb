"""The project's stress suite: every shipped model beside its anchor under perturbation, filler and
out-of-domain input.

    python -m benchmarks.robustness [--models lara-text-news-bytes ...] [--limit N] [--quick] [--threads 1]

Writes benchmarks/results/<name>.json (every figure with n and a 95% interval), <name>.md (a short table for
the README and the full tables), <name>_filler.png and <name>_calibration.png; --name robustness by default.
The cases, sources and figures are described in docs/robustness.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import environment
from benchmarks.robustness import perturb, report, runners, sources
from benchmarks.robustness.image_suite import ImageSettings, run_image
from benchmarks.robustness.runners import OnnxImage, OnnxText, load_config
from benchmarks.robustness.text_suite import TextSettings, run_text

RESULTS = Path(__file__).resolve().parents[1] / "results"
# --quick: a smoke run in about a minute (small slices, two filler sources at two sizes)
QUICK = {"limit": 40, "filler_docs": 20, "filler_sources": ["lorem", "licence"], "filler_kb": [1, 10],
         "variants": ["upper", "typos"], "ood_items": 20, "sotu": 5, "new_source": 10,
         "cnn_budget": 20.0}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=None, help="shipped models (default: all in model_repository/)")
    p.add_argument("--repository", type=Path, default=None, help="read the models from this folder instead of "
                   "model_repository/ (a candidate exported and finalized there, before it is shipped)")  # fmt: skip
    p.add_argument("--limit", type=int, default=None, help="a seeded slice of each test split (docs or images)")
    p.add_argument("--quick", action="store_true", help="small slices and few variants (a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    p.add_argument("--docs", type=int, default=None, help="documents for the case/whitespace/markup/typo variants")
    p.add_argument("--filler-docs", type=int, default=100, help="documents for the filler cases")
    p.add_argument("--filler-sources", nargs="+", default=list(sources.FILLER_SOURCES), choices=sources.FILLER_SOURCES)
    p.add_argument("--filler-kb", nargs="+", type=int, default=[1, 2, 5, 10, 20])
    p.add_argument("--positions", nargs="+", default=list(perturb.POSITIONS), choices=perturb.POSITIONS)
    p.add_argument("--variants", nargs="+", default=list(perturb.TEXT_VARIANTS), choices=perturb.TEXT_VARIANTS)
    p.add_argument(
        "--genre-docs", type=int, default=None, help="variant documents for lara-text-genre (default: --docs)"
    )
    p.add_argument("--images", type=int, default=None, help="t10k images, a seeded sample (default: --limit, else all)")
    p.add_argument(
        "--genre-filler-docs",
        type=int,
        default=None,
        help="filler documents for lara-text-genre (default: --filler-docs)",
    )
    p.add_argument("--ood-items", type=int, default=100, help="items per out-of-domain set")
    p.add_argument("--sotu", type=int, default=40, help="State of the Union addresses (the latest N; 0 skips)")
    p.add_argument("--new-source", type=int, default=60,
                   help="lara-text-genre: BBC News test articles read as press, a known class from a new source (0 skips)")  # fmt: skip
    p.add_argument(
        "--cnn-budget", type=float, default=None, help="CNN anchor training seconds (default: the ViT's training time)"
    )
    p.add_argument("--name", default="robustness", help="output file stem under --out")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--merge", nargs="+", type=Path, default=None, help="combine result files of runs made in parallel "
                   "(e.g. one per model) into --name; nothing is run")  # fmt: skip
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    counts = ("limit", "docs", "genre_docs", "images", "filler_docs", "genre_filler_docs", "ood_items", "new_source")
    for key in counts:
        value = getattr(args, key)
        if value is not None and value < (0 if "filler" in key or key == "new_source" else 1):
            p.error(f"--{key.replace('_', '-')} must be positive, got {value}")
    return args


def _models(names: list[str] | None) -> list[str]:
    available = sorted(p.parent.parent.name for p in runners.REPOSITORY.glob("*/1/model.onnx"))
    unknown = sorted(set(names or []) - set(available))
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; shipped: {available}")
    return names or available


def run(args: argparse.Namespace, done: Callable[[dict[str, Any]], None] = lambda r: None) -> dict[str, Any]:
    """Every model in turn; `done(results so far)` after each, so a long run leaves its finished models on disk."""
    t0 = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)  # noqa: E731
    results: dict[str, Any] = {"models": {}}
    for name in _models(args.models):
        if load_config(name)["task"] == "image":
            s = ImageSettings(
                limit=args.images or args.limit,
                ood_items=min(args.ood_items * 5, 1797),
                cnn_budget_s=args.cnn_budget,
                seed=args.seed,
            )
            results["models"][name] = run_image(OnnxImage(name, args.threads), s, log)
            results["models"][name]["settings"] = vars(s)
        else:
            model = OnnxText(name, args.threads)
            genre = model.config["data"]["dataset"] != "news"
            nf = args.genre_filler_docs if genre and args.genre_filler_docs is not None else args.filler_docs
            nv = args.genre_docs if genre and args.genre_docs is not None else args.docs
            ts = TextSettings(
                limit=args.limit, docs=nv, filler_docs=nf, filler_sources=tuple(args.filler_sources),
                filler_kb=tuple(args.filler_kb), positions=tuple(args.positions), variants=tuple(args.variants),
                ood_items=args.ood_items, sotu=args.sotu, new_source=args.new_source, seed=args.seed,
            )  # fmt: skip
            results["models"][name] = run_text(model, ts, log)
            results["models"][name]["settings"] = {
                k: list(v) if isinstance(v, tuple) else v for k, v in vars(ts).items()
            }
        log(f"{name} done")
        results["wall_s"] = round(time.perf_counter() - t0, 1)
        done(results)
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    return results


def write(results: dict[str, Any], out: Path, name: str, command: str) -> None:
    results["command"] = command
    results["environment"] = environment()
    results["filler_pools"] = sources.fingerprints()  # prose, code, non-English: the installed packages' files
    out.mkdir(parents=True, exist_ok=True)
    stem = out / name
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    stem.with_suffix(".md").write_text(report.markdown(results))
    report.filler_chart(results, stem.with_name(f"{name}_filler.png"))
    report.calibration_chart(results, stem.with_name(f"{name}_calibration.png"))


def merge(paths: list[Path]) -> tuple[dict[str, Any], str]:
    """Results of several runs as one (each model from the last file that has it) and their commands."""
    parts = [json.loads(p.read_text()) for p in paths]
    models = {name: r for part in parts for name, r in part["models"].items()}
    wall = sum(part.get("wall_s", 0.0) for part in parts)
    return {"models": models, "wall_s": wall, "parts": [p["command"] for p in parts]}, " ; ".join(
        p["command"] for p in parts
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.merge:
        results, command = merge(args.merge)
        write(results, args.out, args.name, command)
        return results
    command = "python -m benchmarks.robustness " + shlex.join(argv if argv is not None else sys.argv[1:])
    shipped = runners.REPOSITORY
    if args.repository is not None:
        runners.REPOSITORY = args.repository.resolve()  # the runners read the module's folder at call time
    try:
        results = run(args, done=lambda r: write(r, args.out, args.name, command))
    finally:
        runners.REPOSITORY = shipped
    print(report.short_table(results))
    return results


if __name__ == "__main__":
    main()
