"""`lara train --int8` against the same run without it: serving time and answers of the two model folders.

    python -m lara_serve.clients train DATA --out runs/int8/float --threads 1 --seed 0
    python -m lara_serve.clients train DATA --out runs/int8/int8 --threads 1 --seed 0 --int8
    python -m benchmarks.train_int8_cost --float runs/int8/float --int8 runs/int8/int8 --data DATA [--threads 1]

Both folders come from the same data, seed and split (split.json), so their test documents are the same. Each
graph runs in an onnxruntime session with the fused LaraAttention kernel after the server's preprocessing
(benchmarks.pretrained_cost.Runner), one document per call, the two alternating document by document so both see
the same machine load. Reports:
- the test split: median seconds per document of each, the ratio, each graph's accuracy and how often their
  labels agree;
- longer documents: test documents of one label joined until they reach each length in word pieces (read up to
  the model's max_length), median seconds of each and the ratio.
Writes benchmarks/results/train_int8_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.pretrained_cost import Runner
from lara_serve.server.preprocess import text_item

OUT = Path(__file__).resolve().parent / "results" / "train_int8_cost.json"


def test_documents(folder: Path, data: Path) -> tuple[list[bytes], list[str]]:
    """The run's test documents (split.json's "line N" ids of a .jsonl DATA) and their labels."""
    split = json.loads((folder / "split.json").read_text())
    if not split.get("data", "").endswith(data.name):
        raise SystemExit(f"{folder}/split.json was made from {split.get('data')}, not {data}")
    rows = data.read_text(encoding="utf-8").split("\n")
    picked = [json.loads(rows[int(i.split()[1]) - 1]) for i in split["ids"]["test"]]
    return [r["text"].encode() for r in picked], [r["label"] for r in picked]


def joined(texts: list[bytes], labels: list[str], pieces: int, runner: Runner, n: int) -> list[bytes]:
    """n documents of at least `pieces` word pieces, each test documents of one label joined by blank lines."""
    out: list[bytes] = []
    for label in sorted(set(labels)):
        doc, parts = b"", [t for t, y in zip(texts, labels, strict=True) if y == label]
        for part in parts * (1 + pieces // max(1, len(parts))):
            doc += part + b"\n\n"
            if text_item(doc, runner.prep, "head").length >= min(pieces, runner.prep.max_length):
                break
        out.append(doc)
        if len(out) == n:
            break
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--float", dest="float_dir", type=Path, required=True, help="the run without --int8")
    p.add_argument("--int8", dest="int8_dir", type=Path, required=True, help="the same run with --int8")
    p.add_argument("--data", type=Path, required=True, help="the .jsonl both were trained on")
    p.add_argument("--lengths", default="512,4096,16384", help="word pieces of the joined documents")
    p.add_argument("--repeats", type=int, default=8, help="joined documents per length, at most one per label")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    runners = {"float": Runner("", args.threads, folder=args.float_dir),
               "int8": Runner("", args.threads, folder=args.int8_dir)}  # fmt: skip
    names = json.loads((args.float_dir / "config.json").read_text())["labels"]
    texts, labels = test_documents(args.float_dir, args.data)
    for run in runners.values():  # warm-up: arenas and kernels
        run(b"warm up " * 64)
    times: dict[str, list[float]] = {k: [] for k in runners}
    preds: dict[str, list[int]] = {k: [] for k in runners}
    for text in texts:
        for key, run in runners.items():
            t, _, pred = run.predict(text)
            times[key].append(t)
            preds[key].append(pred)
    truth = [names.index(y) for y in labels]
    test = {key: {"median_s": round(statistics.median(times[key]), 5),
                  "accuracy": round(sum(p == y for p, y in zip(preds[key], truth, strict=True)) / len(truth), 4)}
            for key in runners}  # fmt: skip
    test["n"] = len(texts)
    test["ratio_float_over_int8"] = round(test["float"]["median_s"] / test["int8"]["median_s"], 2)
    test["label_agreement"] = round(sum(a == b for a, b in zip(preds["float"], preds["int8"], strict=True)) / len(texts), 4)  # fmt: skip
    print(json.dumps({"test": test}), flush=True)
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        docs = joined(texts, labels, length, runners["float"], args.repeats)
        got: dict[str, list[float]] = {k: [] for k in runners}
        read = []
        for doc in docs:
            for key, run in runners.items():
                t, tokens, _ = run.predict(doc)
                got[key].append(t)
            read.append(tokens)
        row = {"pieces": length, "read": int(statistics.median(read)), "n": len(docs),
               **{key: round(statistics.median(v), 4) for key, v in got.items()}}  # fmt: skip
        row["ratio_float_over_int8"] = round(row["float"] / row["int8"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    given = sys.argv[1:] if argv is None else argv
    result = {"command": " ".join(["python -m benchmarks.train_int8_cost", *given]), "threads": args.threads,
              "test": test, "lengths": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
