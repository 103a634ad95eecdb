"""What the pretrained encoder costs: lara-text-news against lara-text-news-bytes on the same documents, one run.

    python -m benchmarks.pretrained_cost [--lengths 4096,16384,65536] [--repeats 5] [--threads 2]

Documents: same-label composites of BBC test articles cut to each length in bytes
(lara_serve.model_export.training.long_docs.make_composites, as benchmarks.long_serving uses). Each model runs
its shipped 1/model.onnx in an onnxruntime session with the fused LaraAttention kernel, one document per
call, after the server's own preprocessing (server.preprocess.text_item: bytes for the byte model, word
pieces for the other); the two models alternate document by document so both see the same machine load.
Reports per length the median seconds per document of each (tokenization included for the word-piece
model), the ratio minilm / news, each model's growth from the first length, and each model's accuracy on
the composites (their label is their articles'; issue 53's same-topic target: 95% at 8-64 KB). A length above a model's
max_length is read head-truncated, as `truncate=head` would (its row says how many tokens were read).
Writes benchmarks/results/pretrained_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.long_composites import wilson
from lara_serve.model_export.export.exporter import make_session
from lara_serve.server.preprocess import IDS, text_item
from lara_serve.server.repository import read_config

REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"
OUT = Path(__file__).resolve().parent / "results" / "pretrained_cost.json"
MODELS = ("lara-text-news-bytes", "lara-text-news")


def labelled_documents(length: int, n: int, seed: int) -> list[tuple[bytes, int]]:
    """n same-label composites of BBC test articles cut to length bytes, with their label; classes in turn."""
    from lara_serve.model_export.training.data import load_news
    from lara_serve.model_export.training.long_docs import make_composites

    docs = load_news("test")
    per_class = -(-n // 5)
    composites = make_composites([d.text for d in docs], [d.label for d in docs], length, per_class, seed=seed)
    return composites[:n]


def documents(length: int, n: int, seed: int) -> list[bytes]:
    return [c for c, _ in labelled_documents(length, n, seed)]


class Runner:
    """A shipped model read as the server reads it: its preprocessing, then its 1/model.onnx (or `onnx`, another
    graph of the same model, e.g. research.minilm_int8's quantized copy) in a session with the fused kernel."""

    def __init__(self, name: str, threads: int, onnx: Path | None = None, folder: Path | None = None) -> None:
        folder = folder or REPOSITORY / name  # a model folder elsewhere (a `lara train` output) by its path
        self.prep = read_config(folder).preprocessing
        self.session = make_session(onnx or folder / "1" / "model.onnx", threads=threads, fused=True)

    def outputs(self, raw: bytes) -> tuple[list[np.ndarray], int]:
        """The graph's outputs (logits first) for one document, and how many tokens it read."""
        ids = text_item(raw.decode("utf-8", "ignore").encode(), self.prep, "head").arrays[IDS][None]
        return self.session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)}), ids.shape[1]

    def __call__(self, raw: bytes) -> tuple[float, int]:
        seconds, tokens, _ = self.predict(raw)
        return seconds, tokens

    def predict(self, raw: bytes) -> tuple[float, int, int]:
        """Seconds, tokens read and the predicted class index of one document."""
        start = time.perf_counter()
        out, tokens = self.outputs(raw)
        return time.perf_counter() - start, tokens, int(out[0][0].argmax())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="4096,16384,65536")
    p.add_argument("--repeats", type=int, default=5, help="documents per length (each a different composite)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    runners = {name: Runner(name, args.threads) for name in MODELS}
    for run in runners.values():  # warm-up: arenas and kernels
        run(b"warm up " * 64)
    rows = []
    for length in lengths:
        times: dict[str, list[float]] = {m: [] for m in MODELS}
        tokens: dict[str, list[int]] = {m: [] for m in MODELS}
        right = dict.fromkeys(MODELS, 0)
        docs = labelled_documents(length, args.repeats, seed=length)
        for doc, label in docs:
            for name, run in runners.items():
                t, n, pred = run.predict(doc)
                times[name].append(t)
                tokens[name].append(n)
                right[name] += int(pred == label)
        row: dict[str, Any] = {"bytes": length}
        for name in MODELS:
            lo, hi = wilson(right[name], len(docs))
            row[name] = {"median_s": round(statistics.median(times[name]), 4), "tokens": int(np.median(tokens[name])),
                         "accuracy": round(right[name] / len(docs), 4), "wilson95": [round(lo, 4), round(hi, 4)]}  # fmt: skip
        row["ratio_minilm_over_news"] = round(row[MODELS[1]]["median_s"] / row[MODELS[0]]["median_s"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    for name in MODELS:
        base = rows[0][name]["median_s"]
        for row in rows:
            row[name]["growth_from_first"] = round(row[name]["median_s"] / base, 2)
    given = sys.argv[1:] if argv is None else argv
    result = {"command": " ".join(["python -m benchmarks.pretrained_cost", *given]), "threads": args.threads,
              "repeats": args.repeats, "rows": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
