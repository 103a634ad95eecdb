"""Does a classifier on the LARA student's whole-document embeddings keep the teacher's knowledge? (issue 53)

Embeds BBC News (train and test split, de-duplicated, data.md) with three readers and fits a logistic
regression on the train split's embeddings:
- `student`: the converted MiniLM (LARA in every layer) reading the whole document in one pass;
- `teacher256`: the exact MiniLM reading the first 256 pieces (the anchor a user would pick);
- `teacher_chunks`: the exact MiniLM reading 512-piece windows, mean of the windows.
Test-side variants: the whole article, the headline alone (first line), the first sentence, the article as a
saved web page (benchmarks.robustness.perturb.html_page) and the article followed by a table of figures.
The C of the regression is chosen by 5-fold cross-validation on the train split only.

    python -m research.pretrained_head --student runs/pretrained-lara-c64-cpu --out research/results/pretrained_head.json

Embeddings are cached under --cache (npz), so a second run only refits.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.robustness.perturb import html_page
from lara_serve.model_export.pretrained.fidelity import embed_windows
from lara_serve.model_export.pretrained.student import load_student
from lara_serve.model_export.pretrained.teacher import BertEncoder, WordPieces, embed_in_chunks, load_teacher
from lara_serve.model_export.training.data import load_news


def headline(text: str) -> str:
    return text.strip().split("\n")[0]


def first_sentence(text: str) -> str:
    body = [p for p in text.strip().split("\n")[1:] if p.strip()]
    para = body[0] if body else text
    return re.split(r"(?<=[.!?])\s", para.strip(), maxsplit=1)[0]


def with_table(text: str, seed: int) -> str:
    """The article, then a table of 20 rows of made-up figures (quarter, region, units, change)."""
    rng = random.Random(seed)
    rows = ["| quarter | region | units | change |", "|---|---|---|---|"]
    for i in range(20):
        rows.append(
            f"| Q{i % 4 + 1} {2001 + i // 4} | R{rng.randint(1, 9)} | {rng.randint(100, 99999)} | "
            f"{rng.uniform(-9, 9):+.1f}% |"
        )
    return text + "\n\n" + "\n".join(rows) + "\n"


VARIANTS: dict[str, Callable[[str, int], str]] = {
    "whole": lambda t, i: t,
    "headline": lambda t, i: headline(t),
    "first_sentence": lambda t, i: first_sentence(t),
    "html_page": lambda t, i: html_page(t),
    "with_table": with_table,
}


@torch.no_grad()
def embed_student(model: BertEncoder, tok: WordPieces, texts: list[str], max_pieces: int) -> np.ndarray:
    """Whole documents (up to max_pieces) in one pass each; batched by similar length to waste little padding."""
    pieces = [tok.pieces(t)[: max_pieces - 2] for t in texts]
    order = sorted(range(len(texts)), key=lambda i: len(pieces[i]))
    out = np.zeros((len(texts), model.cfg.dim), dtype=np.float32)
    budget = 4096  # pieces per batch
    i = 0
    while i < len(order):
        n = max(1, budget // max(1, len(pieces[order[i]]) + 2))
        idx = order[i : i + n]
        out[idx] = embed_windows(model, tok, [pieces[j] for j in idx], len(idx)).numpy()
        i += len(idx)
    return out


@torch.no_grad()
def embed_teacher(model: BertEncoder, tok: WordPieces, texts: list[str], mode: str) -> np.ndarray:
    if mode == "first256":
        windows = [tok.pieces(t)[:254] for t in texts]
        return embed_windows(model, tok, windows, 16).numpy()
    return np.stack([embed_in_chunks(model, tok, tok.pieces(t), 512).numpy() for t in texts])


def cached(path: Path, fn: Callable[[], np.ndarray]) -> np.ndarray:
    if path.is_file():
        return np.load(path)["x"]
    t0 = time.perf_counter()
    x = fn()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x)
    print(f"  {path.name}: {x.shape} in {time.perf_counter() - t0:.0f} s", flush=True)
    return x


def fit_and_score(xtr: np.ndarray, ytr: np.ndarray, tests: dict[str, np.ndarray], yte: np.ndarray) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegressionCV

    clf = LogisticRegressionCV(Cs=[0.3, 1, 3, 10, 30, 100], cv=5, max_iter=3000).fit(xtr, ytr)
    row: dict[str, Any] = {"C": float(clf.C_[0])}
    for name, x in tests.items():
        p = clf.predict_proba(x)
        pred = p.argmax(1)
        row[name] = {
            "accuracy": round(float((pred == yte).mean()), 4),
            "mean_confidence": round(float(p.max(1).mean()), 4),
        }
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--student", type=Path, required=True)
    p.add_argument("--cache", type=Path, default=Path("runs/pretrained-head"))
    p.add_argument("--out", type=Path, default=Path("research/results/pretrained_head.json"))
    p.add_argument("--max-pieces", type=int, default=8192)
    p.add_argument("--readers", nargs="+", default=["student", "teacher256", "teacher_chunks"])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    teacher, tok = load_teacher()
    student = load_student(args.student, load_teacher()[0])
    train, test = load_news("train"), load_news("test")
    ytr, yte = np.array([d.label for d in train]), np.array([d.label for d in test])
    readers: dict[str, Callable[[list[str]], np.ndarray]] = {
        "student": lambda ts: embed_student(student, tok, ts, args.max_pieces),
        "teacher256": lambda ts: embed_teacher(teacher, tok, ts, "first256"),
        "teacher_chunks": lambda ts: embed_teacher(teacher, tok, ts, "chunks"),
    }
    tag = args.student.name
    results: dict[str, Any] = {"student": str(args.student), "train": len(train), "test": len(test), "readers": {}}
    for reader in args.readers:
        key = f"{reader}-{tag}" if reader == "student" else reader
        print(f"{reader}:", flush=True)
        xtr = cached(args.cache / f"{key}-train.npz", lambda r=reader: readers[r]([d.text for d in train]))
        tests = {
            v: cached(
                args.cache / f"{key}-test-{v}.npz",
                lambda r=reader, fn=fn: readers[r]([fn(d.text, i) for i, d in enumerate(test)]),
            )
            for v, fn in VARIANTS.items()
        }
        results["readers"][reader] = fit_and_score(xtr, ytr, tests, yte)
        print(json.dumps(results["readers"][reader]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
