"""Server benchmark (not a test): batching gain and per-request overhead, against 127.0.0.1 only.

1. Throughput at 32 concurrent clients posting 2K-byte documents: dynamic batching vs max_batch_size=1.
2. Overhead at batch 1 for 8K-byte documents: client latency vs the model's own time (backend alone and
   the server's X-Inference-Time-Ms).

    .venv/bin/python benchmarks/server.py                  # a model from model_repository/, if any
    .venv/bin/python benchmarks/server.py --synthetic      # the synthetic text model (per-token MLP)

Writes benchmarks/results/server.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lara_serve.clients.loadtest import LoadPoint, SweepPlan, Target, make_doc, run_sweep, synthetic_text  # noqa: E402
from lara_serve.server.backends import create_backend  # noqa: E402
from lara_serve.server.preprocess import collate, text_item  # noqa: E402
from lara_serve.server.repository import read_config  # noqa: E402
from lara_serve.server.settings import DEFAULT_MODEL_REPOSITORY  # noqa: E402
from lara_serve.server.synthetic import make_text_model  # noqa: E402
from lara_serve.server.testing import server_process  # noqa: E402


def pick_model(args: argparse.Namespace, scratch: Path) -> tuple[Path, str]:
    if not args.synthetic:
        if (DEFAULT_MODEL_REPOSITORY / args.model / "config.json").is_file():
            return DEFAULT_MODEL_REPOSITORY, args.model
        for config_path in sorted(DEFAULT_MODEL_REPOSITORY.glob("*/config.json")):
            if json.loads(config_path.read_text()).get("task") == "text":
                return DEFAULT_MODEL_REPOSITORY, config_path.parent.name
        print("no text model in model_repository/: using the synthetic one", file=sys.stderr)
    make_text_model(scratch, "bench-text", max_length=8192, dim=64, hidden=args.hidden)
    return scratch, "bench-text"


def backend_time_ms(repo: Path, model: str, doc_bytes: int, repeats: int = 30) -> float:
    """Median time of the backend alone on one document (no HTTP, no batcher)."""
    config = read_config(repo / model)
    backend = create_backend("onnxruntime", repo / model, config, "cpu")
    inputs = collate([text_item(make_doc(doc_bytes, 0).encode(), config.preprocessing, True)], config)  # type: ignore[arg-type]
    backend.run(inputs)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        backend.run(inputs)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def load(url: str, model: str, concurrency: int, doc_bytes: int, requests: int, seconds: float) -> dict[str, Any]:
    plan = SweepPlan(targets=[Target(url, model, "text", model)], groups=[synthetic_text(doc_bytes)],
                     points=[LoadPoint.closed(concurrency)], requests=requests, seconds=seconds, warmup=8)  # fmt: skip
    (cell,) = asyncio.run(run_sweep(plan))
    return cell.to_dict()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synthetic", action="store_true", help="ignore model_repository/")
    parser.add_argument(
        "--model", default="lara-text-news-bytes", help="text model of model_repository/ (else its first)"
    )
    parser.add_argument("--hidden", type=int, default=256, help="synthetic model's per-token MLP width (0: none)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=800, help="per measurement")
    parser.add_argument("--seconds", type=float, default=30.0, help="per measurement, at most")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "server.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        repo, model = pick_model(args, Path(scratch))
        env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_MODELS": model}
        throughput: dict[str, Any] = {}
        for label, batch in (("batched", args.max_batch_size), ("batch_1", 1)):
            flags = ["--max-batch-size", str(batch), "--max-queue-delay-ms", str(args.max_queue_delay_ms),
                     "--log-level", "warning"]  # fmt: skip
            with server_process(flags, env=env) as url:
                throughput[label] = load(url, model, args.concurrency, 2048, args.requests, args.seconds)
            print(label, json.dumps(throughput[label]), file=sys.stderr)
        with server_process(["--max-batch-size", "1", "--max-queue-delay-ms", "0", "--log-level", "warning"],
                            env=env) as url:  # fmt: skip
            single = load(url, model, 1, 8192, min(args.requests, 200), args.seconds)
        model_ms = backend_time_ms(repo, model, 8192)

    speedup = throughput["batched"]["throughput_rps"] / max(throughput["batch_1"]["throughput_rps"], 1e-9)
    report = {
        "model": model,
        "synthetic": model == "bench-text",
        "synthetic_hidden": args.hidden if model == "bench-text" else None,
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "throughput_2k_docs": {
            "concurrency": args.concurrency,
            **throughput,
            "speedup_batched_vs_batch_1": round(speedup, 2),
            "target": ">= 3x",
        },
        "overhead_8k_docs_batch_1": {
            "client_p50_ms": single["p50_ms"],
            "client_p99_ms": single["p99_ms"],
            "server_total_ms_mean": single["server_total_ms_mean"],
            "server_inference_ms_mean": single["server_inference_ms_mean"],
            "backend_alone_ms_median": round(model_ms, 3),
            "overhead_ms_p50": round(single["p50_ms"] - model_ms, 3),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
