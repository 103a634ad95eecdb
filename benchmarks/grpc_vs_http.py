"""gRPC against binary HTTP, side by side, LARA Serve beside a real Triton: latency and throughput per payload.

    python -m benchmarks.grpc_vs_http [--models-dir model_repository] [--requests 200] [--seconds 5] [--rounds 2]

Payloads: 1 KB and 16 KB texts, one 28x28 PNG. Every cell goes through tritonclient (http with binary
tensors, grpc with raw_input_contents), one client per thread. Servers, all up for the whole run:
- LARA Serve (one process, HTTP and `--grpc-port`), sent the preprocessed tensors (`input_ids` and
  `attention_mask`, or `pixel_values`, exactly what the server would compute from the bytes), and sent the
  raw bytes (BYTES `raw`, the server preprocesses);
- Triton Inference Server (pytriton 0.7.0, benchmarks/pytriton_peer.py) serving the SAME model.onnx through
  onnxruntime with the same fused LaraAttention custom-op library, sent the same tensors (Triton has no
  tokenizer). Its venv (.venv-triton, Debian's python) is made on demand; `--no-triton` skips it.
Both batch alike (max 32 items, 2 ms delay). Each (payload, protocol) runs the servers one after another;
`--rounds` repeats with the order reversed in odd rounds, so noise hits both alike.
Latency: one client, one request at a time (median and p99). Throughput: `--concurrency` threads for
`--seconds`. By default the models are tiny synthetic ones (server.synthetic: compute is small, so the
protocols' own cost shows); `--models-dir model_repository` runs the shipped lara-text-news and
lara-vit-fashion (with LaraAttention). Writes benchmarks/results/grpc_vs_http.json and a .png beside it;
the tables come from benchmarks/grpc_vs_http_report.py.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from benchmarks import pytriton_peer
from benchmarks.grpc_vs_http_report import chart, markdown, ratios, summarize
from server.repository import read_config
from server.testing import free_port, server_process

RESULTS = Path(__file__).resolve().parent / "results"
TEXT_MODEL, IMAGE_MODEL = "lara-text-news", "lara-vit-fashion"
Inputs = bytes | dict[str, np.ndarray]  # raw bytes (BYTES "raw") or named tensors with a batch axis


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


def _tensors(models_dir: Path, model: str, data: bytes) -> dict[str, np.ndarray]:
    """What the server computes from the raw bytes, with a batch axis: the input both servers accept."""
    from server.preprocess import image_item, text_item
    from server.repository import ImagePreprocessing, read_config

    prep = read_config(models_dir / model).preprocessing
    item = image_item(data, prep, 1 << 20) if isinstance(prep, ImagePreprocessing) else text_item(data, prep, None)
    return {name: array[None] for name, array in item.arrays.items()}


def _caller(protocol: str, address: str, model: str, data: Inputs, output: str) -> Callable[[], None]:
    """A function that sends one request on its own connection (one client per thread, as real callers)."""
    if protocol == "grpc":
        import tritonclient.grpc as client_lib
    else:
        import tritonclient.http as client_lib  # type: ignore[no-redef]
    from tritonclient.utils import np_to_triton_dtype

    client = client_lib.InferenceServerClient(url=address)
    arrays = {"raw": np.array([data], dtype=object)} if isinstance(data, bytes) else data
    tensors = []
    for name, array in arrays.items():
        tensor = client_lib.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        if protocol == "grpc":
            tensor.set_data_from_numpy(array)  # raw_input_contents
        else:
            tensor.set_data_from_numpy(array, binary_data=True)
        tensors.append(tensor)
    if protocol == "grpc":
        outputs = [client_lib.InferRequestedOutput(output)]
    else:
        outputs = [client_lib.InferRequestedOutput(output, binary_data=True)]

    def call() -> None:
        client.infer(model, tensors, outputs=outputs)

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


def _compute_ms(onnx: Path, ort_library: str | None, feeds: dict[str, np.ndarray], n: int) -> float:
    """The model alone on one request's tensors, in this process: median of n runs after 2 warm-ups."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL  # as both servers
    if ort_library:
        options.register_custom_ops_library(ort_library)
    session = ort.InferenceSession(str(onnx), sess_options=options, providers=["CPUExecutionProvider"])
    times = []
    for i in range(n + 2):
        start = time.perf_counter()
        session.run(None, feeds)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000)


def _parity(lara_http: str, triton_http: str, model: str, feeds: dict[str, np.ndarray]) -> float:
    """Max |LARA's probabilities - softmax(Triton's logits)| on one input (temperature is in the logits)."""
    lara = _client_result(lara_http, model, feeds, "probabilities")
    logits = _client_result(triton_http, model, feeds, "logits").astype(np.float64)
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    expected /= expected.sum(axis=1, keepdims=True)
    return float(np.abs(lara - expected).max())


def _client_result(address: str, model: str, feeds: dict[str, np.ndarray], output: str) -> np.ndarray:
    import tritonclient.http as client_lib
    from tritonclient.utils import np_to_triton_dtype

    tensors = []
    for name, array in feeds.items():
        tensors.append(client_lib.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
        tensors[-1].set_data_from_numpy(array, binary_data=True)
    result = client_lib.InferenceServerClient(url=address).infer(model, tensors)
    return np.asarray(result.as_numpy(output))


def _measure(lanes: dict[str, tuple[str, str]], payloads: dict[str, Any], args: argparse.Namespace,
             cells: list[dict[str, Any]]) -> None:  # fmt: skip
    """Every (payload, protocol, lane) cell, `args.rounds` times; odd rounds run the lanes in reverse order.
    Appends to `cells` as it goes, so an interrupted run still reports what it measured."""
    for round_ in range(args.rounds):
        for payload, (model, data, feeds) in payloads.items():
            for protocol in ("http", "grpc"):
                order = list(lanes.items()) if round_ % 2 == 0 else list(reversed(lanes.items()))
                for lane, addresses in order:
                    server, input_ = lane.split("/")
                    sent = data if input_ == "raw" else feeds
                    output = "logits" if server == "triton" else "probabilities"
                    address = addresses[0] if protocol == "http" else addresses[1]
                    latency = _latency(_caller(protocol, address, model, sent, output), args.requests)
                    throughput = _throughput(
                        lambda p=protocol, a=address, m=model, s=sent, o=output: _caller(p, a, m, s, o),
                        args.concurrency,
                        args.seconds,
                    )
                    wire = len(data) if input_ == "raw" else sum(a.nbytes for a in feeds.values())
                    cell = {"payload": payload, "bytes": len(data), "tensor_bytes": wire, "server": server,
                            "input": input_, "protocol": protocol, "round": round_,
                            **latency, **throughput}  # fmt: skip
                    print(json.dumps(cell), flush=True)
                    cells.append(cell)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpc_vs_http", description=__doc__.split("\n")[0])
    parser.add_argument("--models-dir", type=Path, default=None, help="default: tiny synthetic models")
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per latency cell")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput cell")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1, help="repeats; odd rounds reverse the order of servers")
    parser.add_argument("--payloads", default=",".join(_payloads()), help="a comma-separated subset")
    parser.add_argument("--no-triton", action="store_true", help="LARA Serve only (no Triton peer)")
    parser.add_argument("--triton-python", type=Path, default=None, help="default: .venv-triton, made on demand")
    parser.add_argument("--out", type=Path, default=RESULTS / "grpc_vs_http.json")
    args = parser.parse_args(argv)
    if args.requests > 2000 or args.seconds > 60 or args.rounds > 10:
        parser.error("keep it bounded: --requests <= 2000, --seconds <= 60, --rounds <= 10")
    signal.signal(signal.SIGTERM, _interrupt)
    from kernels import ort_library

    library = ort_library.library()
    models_dir = args.models_dir or _synthetic_repository()
    unknown = set(args.payloads.split(",")) - set(_payloads())
    if unknown:
        parser.error(f"unknown payloads {sorted(unknown)}; choose from {', '.join(_payloads())}")
    chosen = {k: v for k, v in _payloads().items() if k in args.payloads.split(",")}
    payloads = {k: (m, d, _tensors(models_dir, m, d)) for k, (m, d) in chosen.items()}
    onnx = {m: models_dir / m / read_config(models_dir / m).version / "model.onnx" for m in (TEXT_MODEL, IMAGE_MODEL)}
    runs = max(5, args.requests // 4)
    compute = {k: _compute_ms(onnx[m], str(library or ""), f, runs) for k, (m, _, f) in payloads.items()}
    python = None if args.no_triton else (args.triton_python or pytriton_peer.ensure_env())
    env = {"LARA_MODEL_REPOSITORY": str(models_dir), "LARA_MODELS": f"{TEXT_MODEL},{IMAGE_MODEL}",
           "LARA_ORT_ATTENTION": "fused" if library else "body"}  # fmt: skip
    grpc_port = free_port()
    flags = ["--log-level", "warning", "--grpc-port", str(grpc_port),
             "--max-batch-size", "32", "--max-queue-delay-ms", "2"]  # fmt: skip
    with ExitStack() as stack:
        url = stack.enter_context(server_process(flags, env=env, timeout_s=300))
        lanes = {"lara/tensors": (url.removeprefix("http://"), f"127.0.0.1:{grpc_port}")}
        parity: dict[str, float] = {}
        if python is not None:
            # Both servers stay up through every cell, so each sees the same background.
            peer = stack.enter_context(pytriton_peer.running(python, onnx, str(library or "")))
            lanes["triton/tensors"] = (peer.http, peer.grpc)
            parity = {k: _parity(lanes["lara/tensors"][0], peer.http, m, f) for k, (m, _, f) in payloads.items()}
        lanes["lara/raw"] = lanes["lara/tensors"]
        cells: list[dict[str, Any]] = []
        try:
            _measure(lanes, payloads, args, cells)
            complete = True
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop both servers (the with-block) and keep the cells
            complete = False
    rows = summarize(cells, compute)
    report = {
        "complete": complete,
        "question": "per-request cost of gRPC against binary HTTP, LARA Serve beside Triton (same ONNX, same op)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_1min_end": os.getloadavg()[0]},
        "settings": vars(args) | {"models_dir": str(args.models_dir or "synthetic"), "out": str(args.out),
                                  "triton_python": str(python), "batching": "max 32 items, 2 ms delay, both servers"},
        "lara_attention": "fused custom-op library in both servers" if library else "ONNX function body in both",
        "triton": pytriton_peer.versions(python) if python is not None else "not run (--no-triton)",
        "parity_max_abs_diff_probabilities": parity,
        "compute_ms": compute,
        "rows": rows,
        "ratios": ratios(rows),
        "cells": cells,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    chart(rows, args.out.with_suffix(".png"), f"gRPC vs binary HTTP, {report['settings']['models_dir']} models, "
          f"concurrency {args.concurrency}, {args.rounds} round(s), load avg {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")  # fmt: skip
    print(markdown(rows))
    print(json.dumps(report["ratios"], indent=2))
    return report


if __name__ == "__main__":
    main()
