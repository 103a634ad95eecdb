"""What do windows cost `lara train`'s frozen encoder? (Answered: 1.2x on e-mails read to 1,024 pieces, 1.09x to
4,096: the last window of each text is padded to 512 slots.)

`lara train --init lara-text-news` reads each text whole in one attention by default; a run with --max-length
above 16,384 reads in 510-piece windows (what a sliced program cuts). This reads the same 60 e-mails (the user-like
set of benchmarks.your_data) both ways through the shipped encoder, one text at a time, alternating, on one
thread, and compares the process CPU seconds.

    python -m research.frozen_windows_cost [--data runs/your_data/emails.jsonl] [--docs 60]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import torch

from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.pretrained.teacher import WordPieces, pad_pieces

MODEL = Path(__file__).resolve().parents[1] / "model_repository" / "lara-text-news"
OUT = Path(__file__).resolve().parent / "results" / "frozen_windows_cost.json"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("runs/your_data/emails.jsonl"))
    p.add_argument("--docs", type=int, default=60)
    p.add_argument("--lengths", default="1024,4096")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model, tok = load_pretrained(MODEL), WordPieces.from_dir(MODEL)
    texts = [json.loads(line)["text"] for line in args.data.read_text().splitlines()]
    random.Random(0).shuffle(texts)
    rows = {}
    for length in (int(x) for x in args.lengths.split(",")):
        seqs = [tok.encode(t, length) for t in texts[: args.docs]]
        seconds = {0: 0.0, 510: 0.0}
        for seq in seqs:
            ids, mask = pad_pieces([seq], tok.pad_id)
            for window in seconds:  # alternating: both see the same machine load
                model.cfg = dataclasses.replace(model.cfg, window=window, window_gate=0.0)
                t0 = time.process_time()
                with torch.inference_mode():
                    model.forward_features(ids, mask)
                seconds[window] += time.process_time() - t0
        rows[length] = {"pieces": sum(map(len, seqs)), "whole_cpu_s": round(seconds[0], 2),
                        "windows_cpu_s": round(seconds[510], 2), "ratio": round(seconds[510] / seconds[0], 3)}  # fmt: skip
        print(length, rows[length], flush=True)
    result = {"command": "python -m research.frozen_windows_cost", "docs": args.docs, "data": str(args.data),
              "rows": rows}  # fmt: skip
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
