"""Which hidden states should the head of `lara train`'s frozen encoder read? (Answered: all of them.)

`lara train DATA --init lara-text-news` (the default text path) keeps the converted MiniLM frozen and fits a
logistic regression on each document's features. With the last layer's unit mean alone (the teacher's sentence
embedding), the encoder alone trailed TF-IDF + logistic regression by 11 points on messages in ~100 languages
(79.0 vs 90.5%), where the label is in the words. This script reads every document of each set once, the way
`lara train` splits and tokenizes it (your_data.command.prepare, pretrained_init.tokenize), keeps the unit mean
of each hidden state (the embeddings' output and each of the 6 layers), and fits the head on several choices of
them (C by holdout log-loss over pretrained_init.LAYERS_C_GRID). The choice is read off the holdout; the test
split is scored for the record only.

    python -m research.frozen_layer_means --sets subjects catalogs emails sotu \
        [--data runs/your_data] [--out research/results/frozen_layer_means.json]

Data: `python -m lara_serve.model_export.your_data.sample_data NAME runs/your_data/NAME.jsonl` (what
benchmarks.your_data writes). Each set's features are cached under runs/frozen_layer_means/ (emails and sotu
take minutes to read; the e-mails are read by their first 1,024 pieces, as the benchmark's budget plan read them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lara_serve.model_export.pretrained.classifier import fit_head
from lara_serve.model_export.your_data import command, pretrained_init
from lara_serve.model_export.your_data import dist as userdist
from lara_serve.model_export.your_data.options import add_arguments

# hidden states the head may read (0 = the embeddings' output, 6 = the last layer)
CHOICES = {"last": (6,), "embeddings+last": (0, 6), "every other": (0, 2, 4, 6), "all": tuple(range(7))}
# --max-length per set: what benchmarks.your_data's 15-minute plan read (config.json model.max_length of its runs)
MAX_LENGTH = {"emails": 1024, "sources": 1024}
PARTS = ("train", "holdout", "test")


def features(name: str, data: Path, cache: Path, window: int = 0) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Each part's unit means of every hidden state [N, 7, D] and its labels, read as `lara train` reads them
    (window > 0: in windows of that many pieces, each its own [CLS] ... [SEP], as lara-text-news reads)."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    argv = [str(data / f"{name}.jsonl"), "--out", str(Path(tempfile.mkdtemp()) / "m"), "--seed", "0"]
    if name in MAX_LENGTH:
        argv += ["--max-length", str(MAX_LENGTH[name])]
    prep = command.prepare(p.parse_args(argv), userdist.setup())
    assert isinstance(prep, pretrained_init.Frozen) and prep.model.blocks == 7
    if window:
        prep.cfg = dataclasses.replace(prep.cfg, window=window)
        prep.model.cfg = prep.cfg
    labels = {part: torch.from_numpy(np.asarray(prep.labels[part])) for part in PARTS}
    if cache.is_file():
        return torch.load(cache), labels
    pretrained_init.tokenize(prep)
    feats = {}
    for part in PARTS:
        read, _ = pretrained_init.embed(prep, prep.seqs[part])  # [N, 7 * D], each block at norm 1/sqrt(7)
        feats[part] = read.reshape(len(read), 7, -1) * 7**0.5  # back to unit blocks
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(feats, cache)
    return feats, labels


def accuracy(f: Tensor, w: Tensor, b: Tensor, y: Tensor) -> float:
    z = f @ w.T + b
    pred = z.argmax(1) if z.shape[1] > 1 else (z[:, 0] > 0).long()  # a binary fit has one column
    return round(float((pred == y).double().mean()), 4)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", nargs="+", default=["subjects", "catalogs", "emails", "sotu"])
    ap.add_argument("--data", type=Path, default=Path("runs/your_data"))
    ap.add_argument("--cache", type=Path, default=Path("runs/frozen_layer_means"))
    ap.add_argument("--out", type=Path, default=Path("research/results/frozen_layer_means.json"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--window", type=int, default=0, help="read in windows of this many pieces (0: whole)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out: dict[str, dict] = {}
    for name in args.sets:
        t0 = time.process_time()
        suffix = f"-w{args.window}" if args.window else ""
        feats, y = features(name, args.data, args.cache / f"{name}{suffix}.pt", args.window)
        rows = {}
        for choice, blocks in CHOICES.items():
            f = {part: torch.nn.functional.normalize(feats[part][:, list(blocks)].flatten(1), dim=-1) for part in PARTS}
            w, b, notes = fit_head(f["train"], y["train"], f["holdout"], y["holdout"], pretrained_init.LAYERS_C_GRID)
            rows[choice] = {"blocks": list(blocks), "C": notes["C"],
                            **{f"{part}_accuracy": accuracy(f[part], w, b, y[part]) for part in ("holdout", "test")}}  # fmt: skip
            print(name, choice, rows[choice], flush=True)
        n = {part: len(y[part]) for part in PARTS}
        out[name] = {"n": n, "choices": rows, "cpu_s": round(time.process_time() - t0, 1)}
    command = "python -m research.frozen_layer_means --sets " + " ".join(args.sets)
    command += f" --window {args.window} --out {args.out}" if args.window else ""
    args.out.write_text(json.dumps({"command": command,
                                    "selection": "holdout accuracy (test scored for the record)", "sets": out},
                                   indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
