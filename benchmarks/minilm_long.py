"""lara-text-news past 64 KB: documents read whole by its sliced program (export.sliced_windows), up to 1 MiB.

    python -m benchmarks.minilm_long [--agree 20] [--lengths 65536,262144,1048576] [--docs 10,10,5] [--threads 2]

Two questions, one run, through the server's onnxruntime backend (server.backends.onnx_runtime: the whole
int8 graph up to the manifest's long_from pieces, the int8 sliced program past it), after the server's
preprocessing (server.preprocess.text_item):
1. agreement: does the program give the whole graph's answers where both can read the document? Same-label
   composites of BBC test articles (long_docs.make_composites) of `--agree-bytes`, every one under long_from
   pieces, read by the whole graph and by the program (called directly): label agreement, the largest
   difference of a class probability, of the ood score (relative) and of the in-distribution decision;
2. long documents: composites of each length, read as the server reads them; per length the pieces read,
   accuracy (Wilson 95%), median seconds per document and the process's peak RSS (sampled every 20 ms).
Writes benchmarks/results/minilm_long.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.long_composites import wilson
from benchmarks.pretrained_cost import labelled_documents
from benchmarks.sampling import peak_of

REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"
MODEL = "lara-text-news"
OUT = Path(__file__).resolve().parent / "results" / "minilm_long.json"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
    from lara_serve.server.preprocess import IDS, collate, text_item
    from lara_serve.server.repository import read_config

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agree", type=int, default=20, help="documents read both ways")
    p.add_argument("--agree-bytes", type=int, default=49152, help="their length (under long_from pieces)")
    p.add_argument("--lengths", default="65536,262144,1048576")
    p.add_argument("--docs", default="10,10,5", help="documents per length")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    folder = REPOSITORY / MODEL
    config = read_config(folder)
    backend = OnnxRuntimeBackend(folder, config, "cpu", num_threads=args.threads)
    program = backend._sliced  # the server's own program object
    if program is None or program.long_from is None:
        raise SystemExit(
            f"{folder}: no usable sliced program (python -m lara_serve.model_export.export.sliced_windows)"
        )
    threshold = float(config.ood_threshold or 0.0)

    def read(raw: bytes) -> tuple[Any, Any]:
        item = text_item(raw, config.preprocessing, None)
        return item, collate([item], config)

    agree: dict[str, Any] = {"bytes": args.agree_bytes, "n": 0, "same_label": 0, "max_prob_diff": 0.0,
                             "max_ood_rel_diff": 0.0, "same_decision": 0, "max_pieces": 0}  # fmt: skip
    for raw, _ in labelled_documents(args.agree_bytes, args.agree, seed=1):
        item, batch = read(raw)
        if item.length > program.long_from:
            continue  # the whole graph does not read it: not a comparison
        whole = backend.run_outputs(batch)
        sliced = program.run(item.arrays[IDS])
        pw, ps = softmax(whole.logits[0]), softmax(sliced["logits"][0])
        ow, os_ = float(whole.ood_score[0]), float(sliced["ood_score"][0])
        agree["n"] += 1
        agree["max_pieces"] = max(agree["max_pieces"], item.length)
        agree["same_label"] += int(pw.argmax() == ps.argmax())
        agree["max_prob_diff"] = max(agree["max_prob_diff"], float(np.abs(pw - ps).max()))
        agree["max_ood_rel_diff"] = max(agree["max_ood_rel_diff"], abs(os_ - ow) / max(abs(ow), 1.0))
        agree["same_decision"] += int((ow <= threshold) == (os_ <= threshold))
    print(json.dumps({"agreement": agree}), flush=True)

    rows = []
    for length, n in zip(
        (int(x) for x in args.lengths.split(",")), (int(x) for x in args.docs.split(",")), strict=True
    ):
        times, pieces, right, peaks, in_dist = [], [], 0, [], 0
        for raw, label in labelled_documents(length, n, seed=length):
            item, batch = read(raw)
            with peak_of(rss_mib) as peak:
                start = time.perf_counter()
                out = backend.run_outputs(batch)
                times.append(time.perf_counter() - start)
            peaks.append(peak["peak"])
            pieces.append(item.length)
            right += int(out.logits[0].argmax() == label)
            in_dist += int(float(out.ood_score[0]) <= threshold)
        lo, hi = wilson(right, n)
        row = {"bytes": length, "n": n, "pieces_median": int(statistics.median(pieces)),
               "path": "sliced program" if statistics.median(pieces) > program.long_from else "whole graph",
               "accuracy": round(right / n, 4), "wilson95": [round(lo, 4), round(hi, 4)],
               "in_distribution": round(in_dist / n, 4), "median_s": round(statistics.median(times), 2),
               "peak_rss_mib": round(max(peaks), 1)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    for row in rows:
        row["seconds_per_1k_pieces"] = round(1000 * row["median_s"] / row["pieces_median"], 3)
    given = sys.argv[1:] if argv is None else argv
    result = {
        "command": " ".join(["python -m benchmarks.minilm_long", *given]),
        "threads": args.threads,
        "long_from": program.long_from,
        "chunk": program.chunk,
        "agreement": agree,
        "rows": rows,
        "max_rss_mib_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
