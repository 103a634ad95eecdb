"""Side-by-side benchmark (not a test): LARA Serve vs a real Triton Inference Server, same model, 127.0.0.1 only.

The peer is NVIDIA Triton (tritonserver inside PyPI `nvidia-pytriton` 0.7.0) serving the SAME
`model_repository/<model>/1/model.onnx` through a pytriton Python inference callable that runs an
onnxruntime InferenceSession on each batch Triton's dynamic batcher forms (max batch 32, 2 ms queue delay,
like the LARA server's defaults). pytriton needs Debian's /usr/bin/python3 (3.11.2), so the peer runs as a
subprocess of a separate venv's python (platform.md, "Serving protocol and real clients"):

    apt-get install -y python3-venv
    /usr/bin/python3 -m venv /tmp/pytriton-venv
    /tmp/pytriton-venv/bin/pip install nvidia-pytriton==0.7.0 onnxruntime==<the project's> numpy

The driver (project venv) then measures both servers with ONE load generator, tritonclient's asyncio HTTP
client (KServe v2 protocol, binary tensor extension), at the same concurrency on the same documents:
preprocessed INT64 `input_ids`/`attention_mask` [1, N] per request to both (so neither server pays for
tokenization), plus LARA Serve fed raw UTF-8 text (BYTES `raw`) as an extra row. Documents: BBC News test
documents of at least 2,048 bytes cut to exactly 2,048 bytes (model_export.data.load_news), else
synthetic text (clients.loadtest.make_doc). No document text is written to the results.

    .venv/bin/python benchmarks/triton_peer.py [--pytriton-python /tmp/pytriton-venv/bin/python]
    PYTRITON_PYTHON=/path/to/python .venv/bin/python benchmarks/triton_peer.py --requests 600 --seconds 30

Writes benchmarks/results/server_vs_triton.json and prints a markdown table.
(`triton_peer.py serve ...` is the peer itself; the driver starts it.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PYTRITON_PYTHON = "/tmp/pytriton-venv/bin/python"
SETUP_HELP = """\
the Triton peer needs a python with nvidia-pytriton==0.7.0, onnxruntime and numpy installed. pytriton's
tritonserver stub fails under the pyenv python, so use a venv of Debian's /usr/bin/python3 (3.11.2):
    apt-get install -y python3-venv
    /usr/bin/python3 -m venv /tmp/pytriton-venv
    /tmp/pytriton-venv/bin/pip install nvidia-pytriton==0.7.0 onnxruntime==<as in .venv> numpy
then pass --pytriton-python /tmp/pytriton-venv/bin/python (or set PYTRITON_PYTHON)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the peer (runs under the pytriton venv's python; only numpy, onnxruntime, pytriton there) -----------------


def serve(args: argparse.Namespace) -> int:
    import numpy as np
    import onnxruntime as ort
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    options = ort.SessionOptions()
    if args.num_threads:
        options.intra_op_num_threads = args.num_threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL  # as server/backends/onnx_runtime.py
    if args.ort_library:  # the fused LaraAttention kernel, as LARA Serve runs it by default
        options.register_custom_ops_library(args.ort_library)
    session = ort.InferenceSession(str(args.onnx), sess_options=options, providers=["CPUExecutionProvider"])
    input_names = [i.name for i in session.get_inputs()]
    output_name = session.get_outputs()[0].name
    per_item = session.get_outputs()[0].shape[1:]  # logits [batch, 5] -> (5,) per request item
    output_shape = tuple(d if isinstance(d, int) else -1 for d in per_item)

    def infer(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Triton's dynamic batcher only merges requests of equal shape, but pad to the longest anyway.
        sizes = [len(r["input_ids"]) for r in requests]
        width = max(r["input_ids"].shape[1] for r in requests)
        feeds = {}
        for name in input_names:
            padded = np.zeros((sum(sizes), width), dtype=np.int64)
            row = 0
            for r in requests:
                a = r[name]
                padded[row : row + len(a), : a.shape[1]] = a
                row += len(a)
            feeds[name] = padded
        (logits,) = session.run([output_name], feeds)
        bounds = np.cumsum([0, *sizes])
        return [{output_name: logits[b:e]} for b, e in zip(bounds[:-1], bounds[1:], strict=True)]

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_address="127.0.0.1",
        metrics_port=args.metrics_port,
        allow_gpu_metrics=False,
        exit_on_error=True,
    )

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # serve() catches it and stops tritonserver and the proxy cleanly

    signal.signal(signal.SIGTERM, on_term)
    with Triton(config=config) as triton:
        triton.bind(
            model_name=args.model,
            infer_func=infer,
            inputs=[Tensor(name=n, dtype=np.int64, shape=(-1,)) for n in input_names],
            outputs=[Tensor(name=output_name, dtype=np.float32, shape=output_shape)],
            config=ModelConfig(
                max_batch_size=args.max_batch_size,
                batcher=DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us),
            ),
            strict=False,
        )
        triton.serve()
    return 0


# -- the driver (project venv) ----------------------------------------------------------------------------


def resolve_pytriton_python(given: str | None) -> str:
    path = given or os.environ.get("PYTRITON_PYTHON") or DEFAULT_PYTRITON_PYTHON
    if not Path(path).is_file():
        raise SystemExit(f"error: pytriton python {path!r} not found.\n{SETUP_HELP}")
    probe = subprocess.run(
        [path, "-c", "import pytriton, onnxruntime, numpy; print(onnxruntime.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        raise SystemExit(
            f"error: {path} cannot import pytriton/onnxruntime/numpy:\n{probe.stderr[-1500:]}\n{SETUP_HELP}"
        )
    return path


def wait_ready(url: str, ready_path: str, proc: subprocess.Popen[bytes], log: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            raise RuntimeError(f"{what} did not become ready:\n{log.read().decode(errors='replace')[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}{ready_path}", timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)


@contextmanager
def triton_peer(python: str, onnx: Path, model: str, args: argparse.Namespace) -> Any:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    cmd = [python, str(Path(__file__).resolve()), "serve", "--onnx", str(onnx), "--model", model,
           "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
           "--max-batch-size", str(args.max_batch_size),
           "--max-queue-delay-us", str(round(args.max_queue_delay_ms * 1000)),
           "--num-threads", str(args.num_threads)]  # fmt: skip
    if args.ort_library:
        cmd += ["--ort-library", args.ort_library]
    with tempfile.TemporaryFile() as log:
        # Own session: on a hung stop, its whole group (tritonserver, the proxy) is killed, nothing else.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{http_port}"
            wait_ready(url, f"/v2/models/{model}/ready", proc, log, args.start_timeout_s, "the Triton peer")
            yield url, f"http://127.0.0.1:{metrics_port}/metrics"
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def load_docs(n_bytes: int, count: int) -> tuple[list[bytes], str]:
    try:
        from model_export.data import load_news

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
    from clients.loadtest import make_doc

    return [
        make_doc(n_bytes, seed).encode() for seed in range(count)
    ], f"synthetic (clients.loadtest.make_doc), {n_bytes} bytes"


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
    sub = parser.add_subparsers(dest="command")
    peer = sub.add_parser("serve", help="run the Triton peer (under the pytriton venv's python)")
    peer.add_argument("--onnx", type=Path, required=True)
    peer.add_argument("--model", required=True)
    peer.add_argument("--http-port", type=int, required=True)
    peer.add_argument("--grpc-port", type=int, required=True)
    peer.add_argument("--metrics-port", type=int, required=True)
    peer.add_argument("--max-batch-size", type=int, default=32)
    peer.add_argument("--max-queue-delay-us", type=int, default=2000)
    peer.add_argument("--num-threads", type=int, default=0)
    peer.add_argument("--ort-library", default="", help="custom-op library to register (the fused kernel)")

    parser.add_argument(
        "--pytriton-python", default=None, help=f"env PYTRITON_PYTHON; default {DEFAULT_PYTRITON_PYTHON}"
    )
    parser.add_argument("--model", default="lara-text-news")
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
    if args.command == "serve":
        return serve(args)
    if args.requests > 5000 or args.seconds > 120:
        parser.error("keep each measurement bounded: --requests <= 5000 and --seconds <= 120")

    python = resolve_pytriton_python(args.pytriton_python)
    sys.path.insert(0, str(ROOT))
    args.ort_library = ""
    if args.ort_attention == "fused":
        from kernels import ort_library

        if ort_library.library() is None:
            parser.error(f"--ort-attention fused: {ort_library.unavailable_reason()}")
        args.ort_library = str(ort_library.library())
    import numpy as np
    import onnxruntime
    import tritonclient.http.aio as aio_client

    from server.repository import read_config
    from server.settings import DEFAULT_MODEL_REPOSITORY
    from server.testing import server_process

    model_dir = DEFAULT_MODEL_REPOSITORY / args.model
    config = read_config(model_dir)
    onnx = model_dir / config.version / "model.onnx"
    docs, source = load_docs(args.doc_bytes, args.docs)
    byte_offset = config.preprocessing.byte_offset  # type: ignore[union-attr]
    toks = [tokens(d, byte_offset) for d in docs]

    def tensor_inputs(index: int) -> list[Any]:
        ids, mask = toks[index]
        a = aio_client.InferInput("input_ids", list(ids.shape), "INT64")
        a.set_data_from_numpy(ids)
        b = aio_client.InferInput("attention_mask", list(mask.shape), "INT64")
        b.set_data_from_numpy(mask)
        return [a, b]

    def raw_inputs(index: int) -> list[Any]:
        raw = aio_client.InferInput("raw", [1], "BYTES")
        raw.set_data_from_numpy(np.array([docs[index]], dtype=object))
        return [raw]

    def sync_tensor_inputs(index: int) -> Any:
        import tritonclient.http as sync_client

        ids, mask = toks[index]
        a = sync_client.InferInput("input_ids", list(ids.shape), "INT64")
        a.set_data_from_numpy(ids)
        b = sync_client.InferInput("attention_mask", list(mask.shape), "INT64")
        b.set_data_from_numpy(mask)
        return [a, b]

    lara_metrics = ("lara_batch_size_sum", "lara_batch_size_count")
    triton_metrics = ("nv_inference_request_success", "nv_inference_exec_count")
    flags = ["--max-batch-size", str(args.max_batch_size), "--max-queue-delay-ms", str(args.max_queue_delay_ms),
             "--num-threads", str(args.num_threads), "--log-level", "warning"]  # fmt: skip
    env = {"LARA_MODEL_REPOSITORY": str(DEFAULT_MODEL_REPOSITORY), "LARA_MODELS": args.model,
           "LARA_ORT_ATTENTION": args.ort_attention}  # fmt: skip
    cells: dict[str, Any] = {}
    with server_process(flags, env=env) as lara_url, triton_peer(python, onnx, args.model, args) as (triton_url, tm):
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

    pytriton_versions = subprocess.run(
        [python, "-c", "import importlib.metadata as m, onnxruntime as o, platform as p; "
         "print(m.version('nvidia-pytriton'), o.__version__, p.python_version())"],
        capture_output=True, text=True, timeout=60,
    ).stdout.split()  # fmt: skip
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
        + (" (kernels.ort_library's custom-op library)" if args.ort_library else " (the ONNX function body)"),
        "lara": {
            "server": "python -m server (FastAPI/uvicorn, token-budget batcher)",
            "onnxruntime": onnxruntime.__version__,
        },
        "triton": {
            "server": "tritonserver (nvidia-pytriton) + Python callable running onnxruntime",
            "pytriton": pytriton_versions[0] if pytriton_versions else None,
            "onnxruntime": pytriton_versions[1] if len(pytriton_versions) > 1 else None,
            "python": pytriton_versions[2] if len(pytriton_versions) > 2 else None,
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
