"""Side-by-side benchmark (not a test): LARA Serve vs a real Triton Inference Server, same model, 127.0.0.1 only.

The peer is NVIDIA Triton (tritonserver inside PyPI `nvidia-pytriton` 0.7.0, benchmarks/pytriton_peer.py)
serving the SAME `model_repository/<model>/1/model.onnx` through a pytriton Python inference callable that
runs an onnxruntime InferenceSession on each batch Triton's dynamic batcher forms (max batch 32, 2 ms
queue delay, like the LARA server's defaults). pytriton needs Debian's /usr/bin/python3 (3.11.2), so the
peer runs under its own venv, `.venv-triton/`, made on demand (or `make bench-triton-env`).

The driver (project venv) then measures both servers with ONE load generator, tritonclient's asyncio HTTP
client (KServe v2 protocol, binary tensor extension), at the same concurrency on the same documents:
preprocessed INT64 `input_ids`/`attention_mask` [1, N] per request to both (so neither server pays for
tokenization), plus LARA Serve fed raw UTF-8 text (BYTES `raw`) as an extra row. Documents: BBC News test
documents of at least 2,048 bytes cut to exactly 2,048 bytes (lara_serve.model_export.training.data.load_news), else
synthetic text (lara_serve.clients.loadtest.make_doc). No document text is written to the results.

    .venv/bin/python benchmarks/triton_peer.py [--pytriton-python PATH]
    PYTRITON_PYTHON=/path/to/python .venv/bin/python benchmarks/triton_peer.py --requests 600 --seconds 30

Writes benchmarks/results/server_vs_triton.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def load_docs(n_bytes: int, count: int) -> tuple[list[bytes], str]:
    try:
        from lara_serve.model_export.training.data import load_news

        docs = [d.text.encode("utf-8") for d in load_news("test")]
        long = [d[:n_bytes] for d in docs if len(d) >= n_bytes]
        if len(long) >= 8:
            # a cut inside a multi-byte character is still a valid byte-id sequence; the raw-text row needs UTF-8
            return [d.decode("utf-8", errors="ignore").encode().ljust(n_bytes) for d in long[:count]], (
                f"BBC News test split, the first {min(count, len(long))} of {len(long)} docs with >= {n_bytes} "
                f"bytes, cut to {n_bytes} bytes"
            )
    except Exception as exc:  # noqa: BLE001 - any failure falls back to synthetic text
        print(f"BBC News unavailable ({exc}); using synthetic text", file=sys.stderr)
    from lara_serve.clients.loadtest import make_doc

    return [
        make_doc(n_bytes, seed).encode() for seed in range(count)
    ], f"synthetic (lara_serve.clients.loadtest.make_doc), {n_bytes} bytes"


def tokens(doc: bytes, byte_offset: int) -> Any:
    import numpy as np

    ids = (np.frombuffer(doc, dtype=np.uint8).astype(np.int64) + byte_offset)[None, :]
    return ids, np.ones_like(ids)


def scrape(url: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of each named Prometheus sample over all label sets."""
    with urllib.request.urlopen(url, timeout=5.0) as response:
        text = response.read().decode()
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key = line.split("{", 1)[0].split(" ", 1)[0]
        if key in out:
            out[key] += float(line.rsplit(" ", 1)[1])
    return out


async def measure(
    url: str,
    model: str,
    make_inputs: Any,
    n_docs: int,
    concurrency: int,
    max_requests: int,
    max_seconds: float,
) -> dict[str, Any]:
    """Closed loop: `concurrency` clients, each posting the next document when its answer arrives."""
    import numpy as np
    import tritonclient.http.aio as httpclient

    client = httpclient.InferenceServerClient(url.removeprefix("http://"), conn_limit=concurrency + 4)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    issued = 0

    async def worker(worker_id: int, deadline: float) -> None:
        nonlocal issued
        while issued < max_requests and time.perf_counter() < deadline:
            index = (issued + worker_id) % n_docs
            issued += 1
            t0 = time.perf_counter()
            try:
                await client.infer(model, make_inputs(index))
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                continue
            latencies.append(time.perf_counter() - t0)

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker(i, start + max_seconds) for i in range(concurrency)))
        duration = time.perf_counter() - start
    finally:
        await client.close()
    lat = np.array(latencies) * 1000 if latencies else np.array([np.nan])
    return {
        "concurrency": concurrency,
        "requests_ok": len(latencies),
        "errors": errors,
        "duration_s": round(duration, 3),
        "throughput_rps": round(len(latencies) / duration, 2),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
        "mean_ms": round(float(lat.mean()), 2),
    }


def run_cell(label: str, url: str, model: str, make_inputs: Any, n_docs: int, args: argparse.Namespace,
             metrics: tuple[str, tuple[str, str]] | None) -> dict[str, Any]:  # fmt: skip
    async def go() -> dict[str, Any]:
        # warm-up first (connections, first-batch allocations), then metrics snapshot, then the measured run
        import tritonclient.http.aio as httpclient

        client = httpclient.InferenceServerClient(url.removeprefix("http://"))
        try:
            for i in range(args.warmup):
                await client.infer(model, make_inputs(i % n_docs))
        finally:
            await client.close()
        before = scrape(metrics[0], metrics[1]) if metrics else None
        load_before = os.getloadavg()[0]
        cell = await measure(url, model, make_inputs, n_docs, args.concurrency, args.requests, args.seconds)
        after = scrape(metrics[0], metrics[1]) if metrics else None
        if before and after:
            items, batches = (after[k] - before[k] for k in metrics[1])
            cell["mean_batch_size"] = round(items / batches, 2) if batches else None
        cell["loadavg_1min_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        return cell

    cell = asyncio.run(go())
    print(f"{label}: {json.dumps(cell)}", file=sys.stderr)
    return cell


def outputs_parity(lara_url: str, triton_url: str, model: str, inputs: list[Any]) -> dict[str, Any]:
    """Same documents through both servers: LARA's probabilities vs softmax(Triton's logits)."""
    import numpy as np
    import tritonclient.http as httpclient

    lara = httpclient.InferenceServerClient(lara_url.removeprefix("http://"))
    triton = httpclient.InferenceServerClient(triton_url.removeprefix("http://"))
    diffs, same = [], 0
    for make in inputs:
        p = lara.infer(model, make()).as_numpy("probabilities")
        logits = triton.infer(model, make()).as_numpy("logits").astype(np.float64)
        q = np.exp(logits - logits.max(axis=1, keepdims=True))
        q /= q.sum(axis=1, keepdims=True)
        diffs.append(float(np.abs(p - q).max()))
        same += int((p.argmax(axis=1) == q.argmax(axis=1)).all())
    return {"docs": len(inputs), "max_abs_diff_probabilities": max(diffs), "argmax_equal": same}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pytriton-python", default=None, help="env PYTRITON_PYTHON; default .venv-triton (made on demand)"
    )
    parser.add_argument("--model", default="lara-text-news-bytes")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--doc-bytes", type=int, default=2048)
    parser.add_argument("--docs", type=int, default=64, help="distinct documents cycled through")
    parser.add_argument("--requests", type=int, default=600, help="per measurement, at most")
    parser.add_argument("--seconds", type=float, default=30.0, help="per measurement, at most")
    parser.add_argument("--warmup", type=int, default=16, help="requests before each measurement")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    parser.add_argument("--num-threads", type=int, default=0, help="onnxruntime intra-op threads in both (0: default)")
    parser.add_argument("--no-raw", action="store_true", help="skip the LARA raw-text row")
    parser.add_argument(
        "--ort-attention", choices=["fused", "body"], default="fused",
        help="how BOTH servers run LaraAttention: the fused kernel (LARA Serve's default) or the function body",
    )  # fmt: skip
    parser.add_argument("--start-timeout-s", type=float, default=180.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "server_vs_triton.json")
    args = parser.parse_args()
    if args.requests > 5000 or args.seconds > 120:
        parser.error("keep each measurement bounded: --requests <= 5000 and --seconds <= 120")

    sys.path.insert(0, str(ROOT))
    from benchmarks import pytriton_peer

    given = args.pytriton_python or os.environ.get("PYTRITON_PYTHON")
    python = Path(given) if given else pytriton_peer.ensure_env()
    if (why := pytriton_peer.probe(python)) is not None:
        parser.error(f"{why}\n(`make bench-triton-env` makes {pytriton_peer.VENV}, the default)")
    args.ort_library = ""
    if args.ort_attention == "fused":
        from lara_serve.kernels import ort_library

        if ort_library.library() is None:
            parser.error(f"--ort-attention fused: {ort_library.unavailable_reason()}")
        args.ort_library = str(ort_library.library())
    import numpy as np
    import onnxruntime
    import tritonclient.http.aio as aio_client

    from lara_serve.server.repository import read_config
    from lara_serve.server.settings import DEFAULT_MODEL_REPOSITORY
    from lara_serve.server.testing import server_process

    model_dir = DEFAULT_MODEL_REPOSITORY / args.model
    config = read_config(model_dir)
    onnx = model_dir / config.version / "model.onnx"
    docs, source = load_docs(args.doc_bytes, args.docs)
    byte_offset = config.preprocessing.byte_offset  # type: ignore[union-attr]
    toks = [tokens(d, byte_offset) for d in docs]

    def tensor_inputs(index: int, client: Any = aio_client) -> list[Any]:
        ids, mask = toks[index]
        a = client.InferInput("input_ids", list(ids.shape), "INT64")
        a.set_data_from_numpy(ids)
        b = client.InferInput("attention_mask", list(mask.shape), "INT64")
        b.set_data_from_numpy(mask)
        return [a, b]

    def raw_inputs(index: int) -> list[Any]:
        raw = aio_client.InferInput("raw", [1], "BYTES")
        raw.set_data_from_numpy(np.array([docs[index]], dtype=object))
        return [raw]

    def sync_tensor_inputs(index: int) -> Any:
        import tritonclient.http as sync_client

        return tensor_inputs(index, sync_client)

    lara_metrics = ("lara_batch_size_sum", "lara_batch_size_count")
    triton_metrics = ("nv_inference_request_success", "nv_inference_exec_count")
    flags = ["--max-batch-size", str(args.max_batch_size), "--max-queue-delay-ms", str(args.max_queue_delay_ms),
             "--num-threads", str(args.num_threads), "--log-level", "warning"]  # fmt: skip
    env = {"LARA_MODEL_REPOSITORY": str(DEFAULT_MODEL_REPOSITORY), "LARA_MODELS": args.model,
           "LARA_ORT_ATTENTION": args.ort_attention}  # fmt: skip
    cells: dict[str, Any] = {}
    delay_us = round(args.max_queue_delay_ms * 1000)
    peer = pytriton_peer.running(
        python,
        {args.model: onnx},
        args.ort_library,
        args.max_batch_size,
        delay_us,
        args.start_timeout_s,
        args.num_threads,
    )
    with server_process(flags, env=env) as lara_url, peer as triton:
        triton_url, tm = f"http://{triton.http}", triton.metrics
        # Both are up (idle) during every measurement, so each sees the same background.
        parity = outputs_parity(lara_url, triton_url, args.model, [lambda i=i: sync_tensor_inputs(i) for i in range(4)])
        print(f"parity: {json.dumps(parity)}", file=sys.stderr)
        lm = (f"{lara_url}/metrics", lara_metrics)
        cells["lara_tensors"] = run_cell(
            "lara (INT64 tensors)", lara_url, args.model, tensor_inputs, len(docs), args, lm
        )
        cells["triton_tensors"] = run_cell("triton (INT64 tensors)", triton_url, args.model, tensor_inputs, len(docs),
                                           args, (tm, triton_metrics))  # fmt: skip
        if not args.no_raw:
            cells["lara_raw_text"] = run_cell("lara (raw text)", lara_url, args.model, raw_inputs, len(docs), args, lm)

    report = {
        "model": args.model,
        "onnx": str(onnx.relative_to(ROOT)),
        "documents": source,
        "doc_bytes": args.doc_bytes,
        "distinct_docs": len(docs),
        "concurrency": args.concurrency,
        "bounds": {"requests": args.requests, "seconds": args.seconds, "warmup": args.warmup},
        "client": "tritonclient.http.aio (KServe v2, binary tensor extension), one process, closed loop",
        "batching": {"max_batch_size": args.max_batch_size, "max_queue_delay_ms": args.max_queue_delay_ms},
        "onnxruntime_intra_op_threads": args.num_threads or "library default",
        "lara_attention": f"{args.ort_attention} in both servers"
        + (
            " (lara_serve.kernels.ort_library's custom-op library)" if args.ort_library else " (the ONNX function body)"
        ),
        "lara": {
            "server": "python -m lara_serve.server (FastAPI/uvicorn, token-budget batcher)",
            "onnxruntime": onnxruntime.__version__,
        },
        "triton": {
            "server": "tritonserver (nvidia-pytriton) + Python callable running onnxruntime",
            **pytriton_peer.versions(python),
        },
        "parity": parity,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "cells": cells,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(cells))
    return 0


def markdown(cells: dict[str, Any]) -> str:
    names = {"lara_tensors": "LARA Serve, INT64 tensors", "triton_tensors": "Triton (pytriton), INT64 tensors",
             "lara_raw_text": "LARA Serve, raw text (BYTES)"}  # fmt: skip
    lines = ["| server | requests | throughput (req/s) | p50 (ms) | p99 (ms) | mean batch | errors |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for key, c in cells.items():
        lines.append(f"| {names[key]} | {c['requests_ok']} | {c['throughput_rps']:.1f} | {c['p50_ms']:.1f} | "
                     f"{c['p99_ms']:.1f} | {c.get('mean_batch_size')} | {sum(c['errors'].values())} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
