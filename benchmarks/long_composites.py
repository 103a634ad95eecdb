"""Same-topic composites of BBC test articles at 256 KB and 1 MiB: accuracy, latency and peak memory, one
document at a time (as the server runs a document this long: alone in its batch).

    python -m benchmarks.long_composites [--model lara-text-news-bytes] [--lengths 262144,1048576] [--per-class 2,1]

Composites are lara_serve.model_export.training.long_docs.make_composites of the TEST split (same-label articles joined, cut at
the length; seeded, so the documents are the same on every run). The model is the shipped one through
PyTorch, whose forward takes documents above 64K tokens in slices of rows (lara_serve.model_export.models.long_forward);
`--threads` torch threads. Per length: accuracy with a Wilson 95% interval, median seconds per document,
and the peak resident memory of this process above its state before the length (ru_maxrss is a high-water
mark, so lengths run in increasing order). Writes benchmarks/results/long_composites.json.
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import time
from typing import Any

import torch

from benchmarks.common import environment, markdown_table, write_json
from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.training.evaluate import resolve_model_dir
from lara_serve.model_export.training.long_docs import COMPOSITE_SEED, make_composites, to_ids
from lara_serve.model_export.training.tasks import text_docs


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(model: torch.nn.Module, length: int, per_class: int, seed: int = COMPOSITE_SEED) -> dict[str, Any]:
    texts, labels = text_docs("news", "test")
    docs = make_composites(texts, labels, length, per_class, seed=seed)
    before = _peak_mib()
    right, seconds = [], []
    for raw, label in docs:
        ids = torch.tensor([to_ids(raw)], dtype=torch.long)  # [1, length]
        t0 = time.perf_counter()
        with torch.inference_mode():
            logits = model(ids, torch.ones_like(ids))[0]  # the serving model: (logits / T, ood_score)
        seconds.append(time.perf_counter() - t0)
        right.append(int(logits.argmax(-1).item()) == label)
        print(f"{length} bytes, label {label}: {'right' if right[-1] else 'WRONG'} in {seconds[-1]:.1f} s", flush=True)
    lo, hi = wilson(sum(right), len(right))
    return {
        "bytes": length,
        "seed": seed,
        "n": len(right),
        "correct": sum(right),
        "accuracy": sum(right) / len(right),
        "wilson95": [lo, hi],
        "median_s": statistics.median(seconds),
        "s_per_mib": statistics.median(seconds) / (length / 2**20),
        "peak_rss_above_before_mib": _peak_mib() - before,
        "peak_rss_mib": _peak_mib(),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="lara-text-news-bytes")
    p.add_argument("--lengths", default="262144,1048576")
    p.add_argument("--per-class", default="2,1", help="composites per label at each length (comma-separated)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=COMPOSITE_SEED, help="composite seed (another seed: other documents)")
    p.add_argument("--out-json", default="long_composites.json")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    per_class = [int(x) for x in args.per_class.split(",")]
    if len(per_class) != len(lengths):
        p.error(f"--per-class needs one count per length ({len(lengths)}), got {args.per_class!r}")
    torch.set_num_threads(args.threads)
    model = load_pretrained(resolve_model_dir(args.model), serving=True).eval()
    rows = [measure(model, n, k, args.seed) for n, k in sorted(zip(lengths, per_class, strict=True))]
    path = write_json(
        args.out_json,
        {"environment": environment(), "model": args.model, "threads": args.threads, "rows": rows,
         "note": "same-label composites of the BBC test split, each run alone through PyTorch (sliced forward "
                 "above 64K tokens); peak RSS is this process's high-water mark above its state before the length"},
    )  # fmt: skip
    print(markdown_table(
        ["bytes", "n", "accuracy", "Wilson 95%", "median s/doc", "peak RSS above before (MiB)"],
        [[r["bytes"], r["n"], r["accuracy"], f"{r['wilson95'][0]:.2f}-{r['wilson95'][1]:.2f}", r["median_s"],
          r["peak_rss_above_before_mib"]] for r in rows],
    ))  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
