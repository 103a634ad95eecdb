"""Issue 53: which `lara-text-news` head reads an article inside unrelated text better, judged on filler that no
build has trained on and on articles that no build has fitted?

    .venv/bin/python -m research.filler_selection MODEL_DIR [MODEL_DIR ...] [--docs 120] [--kb 10 20]

The robustness suite's filler sources (benchmarks.robustness.sources) are its test: choosing a recipe on them
would fit the test. This reads instead:
- articles: a seeded sample of the build's selection holdout (BBC train documents with `in_holdout`);
- filler: Brown belles-lettres (genre letter g, `robust_head.SELECTION_GENRES`), English prose that the trainer
  never uses; English manual pages (section 1, troff removed: technical documentation, which neither the
  trainer, whose man pages are translations, nor the robustness suite reads); and, as a check on the kinds
  every build trains with, fresh cuts of the trainer's own filler bank (`FillerBank.installed`: code, package
  descriptions, licences, markup, word salad, made-up languages);
- each article once alone, then with `--kb` KB of each filler source before or after it (in turn).
Each model dir is read through its served graph (1/model.onnx, each row alone as the server runs it).
Accuracy with Wilson intervals per model, source and size. Writes research/results/filler_selection.json.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.robustness.perturb import place_filler
from benchmarks.robustness.runners import OnnxText
from benchmarks.robustness.stats import wilson
from lara_serve.model_export.pretrained.classifier import in_holdout
from lara_serve.model_export.pretrained.robust_head import SELECTION_GENRES, _cut_from, english_man_pages, english_prose
from lara_serve.model_export.training.augment import FillerBank
from lara_serve.model_export.training.data import load_news

OUT = Path(__file__).parent / "results" / "filler_selection.json"
POSITIONS = ("prepend", "append")
SOURCES = ("belles_lettres", "man_pages", "trainer_bank")
MAN_PAGES = 600  # English section-1 pages read (every k-th of the sorted list): variety at a bounded start-up


# the held-out prose sources: what gives their texts, and what is missing when there are none
PROSE = {
    "belles_lettres": (lambda: english_prose(SELECTION_GENRES), "the Brown corpus is not installed (make setup)"),
    "man_pages": (lambda: english_man_pages(MAN_PAGES), "no English manual pages under /usr/share/man/man1"),
}


def filler(source: str, rng: random.Random, n_bytes: int) -> bytes:
    """n_bytes of one selection source (whole UTF-8 characters)."""
    if source in PROSE:
        get, missing = PROSE[source]
        texts = get()
        if not texts:
            raise SystemExit(f"{missing}: no {source} to read")
        raw = _cut_from(texts, n_bytes, rng).encode("utf-8")
    else:
        raw = FillerBank.installed().sample(rng, n_bytes)
    return raw[:n_bytes].decode("utf-8", errors="ignore").encode("utf-8")


def cases(
    docs: int, kbs: list[int], seed: int, sources: Sequence[str] = SOURCES
) -> tuple[dict[str, list[bytes]], list[int]]:
    """{case: texts} over one seeded sample of holdout articles, and their labels."""
    holdout = [d for d in load_news("train") if in_holdout(d.text)]
    picked = random.Random(f"filler-selection:{seed}").sample(holdout, min(docs, len(holdout)))
    out = {"alone": [d.text.encode("utf-8") for d in picked]}
    for source in sources:
        for kb in kbs:
            texts = []
            for j, d in enumerate(picked):
                rng = random.Random(f"filler-selection:{seed}:{source}:{kb}:{j}")
                texts.append(place_filler(d.text.encode("utf-8"), filler(source, rng, kb * 1024), POSITIONS[j % 2]))
            out[f"{source}/{kb}"] = texts
    return out, [d.label for d in picked]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="+", type=Path, help="model directories (config.json, 1/model.onnx)")
    p.add_argument("--docs", type=int, default=120)
    p.add_argument("--kb", type=int, nargs="+", default=[10, 20])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sources", nargs="+", choices=SOURCES, default=list(SOURCES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    texts, labels = cases(args.docs, args.kb, args.seed, args.sources)
    y = np.array(labels)
    report: dict[str, Any] = {"command": "python -m research.filler_selection " + " ".join(map(str, args.models)),
                              "docs": len(labels), "models": {}}  # fmt: skip
    for model in args.models:
        runner = OnnxText(str(model.resolve()), threads=args.threads)  # an absolute path replaces the repository
        row = {}
        for case, raws in texts.items():
            hits = runner(raws).pred == y
            right = int(hits.sum())
            row[case] = {**wilson(right, len(y)), "right": hits.astype(int).tolist()}  # per article: paired comparisons
            print(f"{model}: {case} {right}/{len(y)}", flush=True)
        report["models"][str(model)] = row
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
