"""Selection check for a retrained news model, on the 150-document HOLDOUT only (never the test split).

    python -m research.news_holdout_check runs/news-r4 model_repository/lara-text-news-bytes
    python -m research.news_holdout_check --dataset brown runs/genre-r1 model_repository/lara-text-genre

(--dataset brown: the same cases on the genre model's 40-text Brown holdout.)

Cases: clean, upper-cased, + 10 KB of lorem ipsum appended / prepended, + 10 KB of C header text appended,
+ 20 KB of lorem ipsum appended. Lorem ipsum and C headers stand for filler that no training source holds
(the robustness suite's own sources are generated or read apart from these, with their own seeds).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from benchmarks.robustness.sources import LOREM_WORDS
from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.training.long_docs import accuracy_on
from lara_serve.model_export.training.tasks import text_docs

# The classic passage's first 35 words (the suite's list, cut where this check's lorem always stopped).
LOREM = LOREM_WORDS[:35]


def lorem(n: int, rng: random.Random) -> bytes:
    words: list[str] = []
    while sum(map(len, words)) + len(words) < n:
        words.append(rng.choice(LOREM))
    return " ".join(words).encode()[:n]


def c_text(n: int, rng: random.Random, files: list[Path]) -> bytes:
    out = b""
    while len(out) < n:
        out += rng.choice(files).read_bytes()
    return out[:n]


def cases(texts: list[str]) -> dict[str, list[bytes]]:
    rng = random.Random(0)
    files = sorted(Path("/usr/include").glob("*.h"))
    raws = [t.encode() for t in texts]
    return {
        "clean": raws,
        "upper": [t.upper().encode() for t in texts],
        "lorem10k_end": [r + b"\n\n" + lorem(10240, rng) for r in raws],
        "lorem10k_start": [lorem(10240, rng) + b"\n\n" + r for r in raws],
        "c10k_end": [r + b"\n\n" + c_text(10240, rng, files) for r in raws],
        "lorem20k_end": [r + b"\n\n" + lorem(20480, rng) for r in raws],
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=["news", "brown"], default="news", help="whose holdout (default news)")
    p.add_argument("model_dirs", nargs="+")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    texts, labels = text_docs(args.dataset, "val")
    docs = cases(list(texts))
    for model_dir in args.model_dirs:
        model = load_pretrained(model_dir)
        acc = {k: round(accuracy_on(model, v, labels, batch_size=8), 4) for k, v in docs.items()}
        print(model_dir, json.dumps(acc), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
