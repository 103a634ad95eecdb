"""gRPC against binary HTTP, side by side, on one live server: latency and throughput per payload.

    python -m benchmarks.grpc_vs_http [--models-dir DIR] [--requests 200] [--seconds 5]

Both protocols run through tritonclient (http with binary tensors, grpc with raw_input_contents) against
the same server process, the same models and the same batcher, so the difference is the wire and its
handling. Payloads: 1 KB and 16 KB texts, one 28x28 PNG. By default the models are tiny synthetic ones
(server.synthetic), so compute is small and the protocols' own cost shows; `--models-dir
model_repository` runs the shipped lara-text-news and lara-vit-fashion instead.
Latency: one client, one request at a time (median and p99). Throughput: `--concurrency` threads for
`--seconds` each. Writes benchmarks/results/grpc_vs_http.json. Triton itself is not run here.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from server.testing import free_port, server_process

RESULTS = Path(__file__).resolve().parent / "results"
TEXT_MODEL, IMAGE_MODEL = "lara-text-news", "lara-vit-fashion"


def _payloads() -> dict[str, tuple[str, bytes]]:
    rng = np.random.default_rng(0)
    sentence = b"Shares of the carmaker fell after it cut its delivery forecast for the rest of the year. "
    image = Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), mode="L")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return {
        "text_1k": (TEXT_MODEL, (sentence * 12)[:1024]),
        "text_16k": (TEXT_MODEL, (sentence * 190)[: 16 * 1024]),
        "image_png": (IMAGE_MODEL, buffer.getvalue()),
    }


def _synthetic_repository() -> Path:
    from server.synthetic import make_image_model, make_text_model

    root = Path(tempfile.mkdtemp(prefix="grpc_vs_http_"))
    make_text_model(root, TEXT_MODEL, max_length=32 * 1024)
    make_image_model(root, IMAGE_MODEL)
    return root


def _caller(protocol: str, address: str, model: str, data: bytes) -> Callable[[], None]:
    """A function that sends one request on its own connection (one client per thread, as real callers)."""
    if protocol == "grpc":
        import tritonclient.grpc as client_lib
    else:
        import tritonclient.http as client_lib  # type: ignore[no-redef]
    client = client_lib.InferenceServerClient(url=address)
    tensor = client_lib.InferInput("raw", [1], "BYTES")
    array = np.array([data], dtype=object)
    if protocol == "grpc":
        tensor.set_data_from_numpy(array)
        outputs = [client_lib.InferRequestedOutput("probabilities")]
    else:
        tensor.set_data_from_numpy(array, binary_data=True)
        outputs = [client_lib.InferRequestedOutput("probabilities", binary_data=True)]

    def call() -> None:
        client.infer(model, [tensor], outputs=outputs)

    return call


def _latency(call: Callable[[], None], n: int) -> dict[str, float]:
    for _ in range(5):
        call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    ms = np.array(times) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "requests": n}


def _throughput(make: Callable[[], Callable[[], None]], threads: int, seconds: float) -> dict[str, float]:
    callers = [make() for _ in range(threads)]
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def run(index: int) -> None:
        while time.perf_counter() < stop:
            callers[index]()
            counts[index] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"requests_per_s": sum(counts) / (time.perf_counter() - start), "concurrency": threads}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpc_vs_http", description=__doc__.split("\n")[0])
    parser.add_argument("--models-dir", type=Path, default=None, help="default: tiny synthetic models")
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per latency cell")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput cell")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS / "grpc_vs_http.json")
    args = parser.parse_args(argv)
    grpc_port = free_port()
    models_dir = args.models_dir or _synthetic_repository()
    env = {"LARA_MODEL_REPOSITORY": str(models_dir), "LARA_MODELS": f"{TEXT_MODEL},{IMAGE_MODEL}"}
    cells: list[dict[str, Any]] = []
    with server_process(["--log-level", "warning", "--grpc-port", str(grpc_port)], env=env, timeout_s=300) as url:
        addresses = {"http": url.removeprefix("http://"), "grpc": f"127.0.0.1:{grpc_port}"}
        for payload, (model, data) in _payloads().items():
            for protocol, address in addresses.items():
                call = _caller(protocol, address, model, data)
                latency = _latency(call, args.requests)
                throughput = _throughput(
                    lambda p=protocol, a=address, m=model, d=data: _caller(p, a, m, d), args.concurrency, args.seconds
                )
                cell = {"payload": payload, "bytes": len(data), "protocol": protocol, **latency, **throughput}
                print(json.dumps(cell))
                cells.append(cell)
    report = {
        "question": "per-request cost of gRPC against binary HTTP on the same server, batcher and models",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "settings": vars(args) | {"models_dir": str(args.models_dir or "synthetic"), "out": str(args.out)},
        "cells": cells,
        "triton": "not run here (no Triton server in this benchmark)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
