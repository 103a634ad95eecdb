"""Issue 53: what did a short text cost `lara-text-news` when its windowed graph padded it to a whole window?

The served graph reads a document in windows of 510 pieces (`bert_lara.window_layout`). Until 2026-12-05 a batch
shorter than one window was padded to a whole one, so a 12-piece headline cost what 510 pieces cost; since, a
batch no longer than a window is one window of its own length. This times both exports of the same weights,
alternating call by call on one thread, at lengths from a headline to two windows, and checks that they answer
alike.

    python -m research.minilm_short_windows --before OLD/model.onnx --after NEW/model.onnx
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from lara_serve.model_export.export.exporter import make_session

OUT = Path(__file__).parent / "results" / "minilm_short_windows.json"
LENGTHS = (12, 64, 256, 512, 1024, 2048)  # pieces, [CLS] and [SEP] included


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    sessions = {name: make_session(path, threads=1) for name, path in (("before", args.before), ("after", args.after))}
    rng = np.random.default_rng(0)
    rows = []
    for n in LENGTHS:
        ids = rng.integers(1000, 30000, size=(1, n)).astype(np.int64)
        ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        outs = {k: s.run(None, feed) for k, s in sessions.items()}  # also the warm-up
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for _ in range(args.repeats):
            for k, s in sessions.items():  # alternating: the machine's load falls on both alike
                t0 = time.perf_counter()
                s.run(None, feed)
                times[k].append(time.perf_counter() - t0)
        ms = {k: round(1000 * statistics.median(v), 2) for k, v in times.items()}
        row = {"pieces": n, "median_ms": ms, "before_over_after": round(ms["before"] / ms["after"], 2)}
        row["max_abs_logit_diff"] = float(np.abs(outs["before"][0] - outs["after"][0]).max())
        row["ood_rel_diff"] = float(np.abs(outs["before"][1] / outs["after"][1] - 1).max())
        rows.append(row)
        print(row, flush=True)
    result = {"before": str(args.before), "after": str(args.after), "threads": 1, "repeats": args.repeats, "rows": rows}
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
