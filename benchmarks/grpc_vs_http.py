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
Both batch alike (max 32 items, 2 ms delay) and run onnxruntime with the same session options (default
intra-op threads, spinning off unless `--ort-spinning`). Each server leads its own session, so where Linux
groups CPU shares by session (autogroup) neither shares one with this driver or what else runs in its
session (`--lara-in-driver-session` is the old, lopsided set-up).
Latency: one client, one request at a time (median and p99), the lanes of a (payload, protocol) taking
turns request by request, so a change in the machine's load hits all alike; with it the server's CPU time
per request (all its processes and threads, from /proc), which a loaded machine stretches far less than
wall time. Throughput: `--concurrency` threads for `--seconds`, lane after lane; `--rounds` repeats, the
order reversed in odd rounds. By default the models are tiny synthetic ones (lara_serve.server.synthetic: compute is small, so the
protocols' own cost shows); `--models-dir model_repository` runs the shipped lara-text-news-bytes and
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
from benchmarks.grpc_vs_http_report import chart, markdown, paired, ratios, summarize
from lara_serve.server.repository import read_config
from lara_serve.server.testing import free_port, server_process

RESULTS = Path(__file__).resolve().parent / "results"
TEXT_MODEL, IMAGE_MODEL = "lara-text-news-bytes", "lara-vit-fashion"
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
    from lara_serve.server.synthetic import make_image_model, make_text_model

    root = Path(tempfile.mkdtemp(prefix="grpc_vs_http_"))
    make_text_model(root, TEXT_MODEL, max_length=32 * 1024)
    make_image_model(root, IMAGE_MODEL)
    return root


def _tensors(models_dir: Path, model: str, data: bytes) -> dict[str, np.ndarray]:
    """What the server computes from the raw bytes, with a batch axis: the input both servers accept."""
    from lara_serve.server.preprocess import image_item, text_item
    from lara_serve.server.repository import ImagePreprocessing, read_config

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


def session_cpu_ms(session: int) -> float | None:
    """CPU time (user + system, ms) used so far by the live processes of a session; None without /proc."""
    total, ticks = 0, os.sysconf("SC_CLK_TCK")
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
        if int(fields[3]) == session:
            total += int(fields[11]) + int(fields[12])  # utime, stime: every thread, live or ended
    return total * 1000 / ticks


def _child_session(marker: str) -> int:
    """The session id of this process's child that leads its own session and whose command has `marker`."""
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            stat, cmdline = Path(f"/proc/{pid}/stat").read_text(), Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == os.getpid() and int(fields[3]) == int(pid) and marker.encode() in cmdline:
            return int(pid)
    return 0


def _cpu_per_request(session: int, run: Callable[[], dict[str, float]]) -> dict[str, float]:
    """A throughput cell's numbers plus the server's CPU ms per request under that load (clock ticks)."""
    before = session_cpu_ms(session) if session else None
    out = run()
    after = session_cpu_ms(session) if session else None
    if before is not None and after is not None and out["throughput_requests"]:
        out["cpu_ms_per_request_loaded"] = (after - before) / out["throughput_requests"]
    return out


def _tasks(session: int) -> list[str]:
    """The schedstat files of every thread of a session's processes (threads that end later lose their time:
    the servers keep their pools, so the count is whole)."""
    paths = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[3]) == session:
                paths += [f"/proc/{pid}/task/{tid}/schedstat" for tid in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
    return paths


def _cpu_ns(paths: list[str]) -> int:
    total = 0
    for path in paths:
        try:
            total += int(Path(path).read_text().split()[0])  # ns on a CPU
        except OSError:
            continue
    return total


def _interleaved_latency(calls: dict[str, tuple[Callable[[], None], int]], n: int) -> dict[str, Any]:
    """Per lane (its call, its server's session or 0): p50/p99 of `n` one-at-a-time requests, the lanes taking
    turns request by request (order flipped every request), so a change in the machine's load hits every
    lane alike; and the server's CPU ms per request, read around each of its requests (threads' schedstat)."""
    for call, _ in calls.values():
        for _ in range(5):
            call()
    tasks = {lane: _tasks(session) if session else [] for lane, (_, session) in calls.items()}
    times: dict[str, list[float]] = {lane: [] for lane in calls}
    cpu: dict[str, int] = dict.fromkeys(calls, 0)
    lanes = list(calls)
    for i in range(n):
        for lane in reversed(lanes) if i % 2 else lanes:
            before = _cpu_ns(tasks[lane])
            start = time.perf_counter()
            calls[lane][0]()
            times[lane].append(time.perf_counter() - start)
            cpu[lane] += _cpu_ns(tasks[lane]) - before
    out = {}
    for lane in lanes:
        ms = np.array(times[lane]) * 1000
        out[lane] = {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "requests": n}
        if tasks[lane]:
            out[lane]["cpu_ms_per_request"] = cpu[lane] / n / 1e6
    return out


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
    elapsed = time.perf_counter() - start
    return {"requests_per_s": sum(counts) / elapsed, "concurrency": threads, "throughput_requests": sum(counts)}


def _compute_ms(onnx: Path, ort_library: str | None, feeds: dict[str, np.ndarray], n: int, spinning: bool) -> float:
    """The model alone on one request's tensors, in this process: median of n runs after 2 warm-ups."""
    import onnxruntime as ort

    from lara_serve.server.backends.onnx_runtime import SPIN_KEYS

    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL  # as both servers
    for key in SPIN_KEYS:
        options.add_session_config_entry(key, "1" if spinning else "0")
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


def _measure(lanes: dict[str, tuple[str, str, int]], payloads: dict[str, Any], args: argparse.Namespace,
             cells: list[dict[str, Any]]) -> None:  # fmt: skip
    """Every (payload, protocol, lane) cell, `args.rounds` times: latency with the lanes taking turns per
    request, then throughput lane after lane, in reverse order on odd rounds. A lane is (HTTP address, gRPC
    address, session id of the server's processes, 0 if unknown). Appends to `cells` as it goes, so an
    interrupted run still reports what it measured."""

    def sent(lane: str, data: bytes, feeds: dict[str, np.ndarray]) -> Inputs:
        return data if lane.endswith("/raw") else feeds

    def output(lane: str) -> str:
        return "logits" if lane.startswith("triton/") else "probabilities"

    for round_ in range(args.rounds):
        for payload, (model, data, feeds) in payloads.items():
            for protocol in ("http", "grpc"):
                order = list(lanes.items()) if round_ % 2 == 0 else list(reversed(lanes.items()))
                index = 0 if protocol == "http" else 1
                calls = {lane: (_caller(protocol, a[index], model, sent(lane, data, feeds), output(lane)), a[2])
                         for lane, a in order}  # fmt: skip
                latencies = _interleaved_latency(calls, args.requests)
                for lane, addresses in order:
                    server, input_ = lane.split("/")
                    address, session = addresses[index], addresses[2]
                    throughput = _cpu_per_request(
                        session,
                        lambda p=protocol, a=address, m=model, s=sent(lane, data, feeds), o=output(lane): _throughput(
                            lambda: _caller(p, a, m, s, o), args.concurrency, args.seconds
                        ),
                    )
                    wire = len(data) if input_ == "raw" else sum(a.nbytes for a in feeds.values())
                    cell = {"payload": payload, "bytes": len(data), "tensor_bytes": wire, "server": server,
                            "input": input_, "protocol": protocol, "round": round_,
                            **latencies[lane], **throughput}  # fmt: skip
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
    parser.add_argument("--ort-spinning", action="store_true", help="both servers: idle onnxruntime threads spin")
    parser.add_argument("--lara-in-driver-session", action="store_true",
                        help="the old set-up: LARA Serve shares this driver's session (and CPU share)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS / "grpc_vs_http.json")
    args = parser.parse_args(argv)
    if args.requests > 2000 or args.seconds > 60 or args.rounds > 10:
        parser.error("keep it bounded: --requests <= 2000, --seconds <= 60, --rounds <= 10")
    signal.signal(signal.SIGTERM, _interrupt)
    from lara_serve.kernels import ort_library

    library = ort_library.library()
    models_dir = args.models_dir or _synthetic_repository()
    unknown = set(args.payloads.split(",")) - set(_payloads())
    if unknown:
        parser.error(f"unknown payloads {sorted(unknown)}; choose from {', '.join(_payloads())}")
    chosen = {k: v for k, v in _payloads().items() if k in args.payloads.split(",")}
    payloads = {k: (m, d, _tensors(models_dir, m, d)) for k, (m, d) in chosen.items()}
    onnx = {m: models_dir / m / read_config(models_dir / m).version / "model.onnx" for m in (TEXT_MODEL, IMAGE_MODEL)}
    runs = max(5, args.requests // 4)
    compute = {
        k: _compute_ms(onnx[m], str(library or ""), f, runs, args.ort_spinning) for k, (m, _, f) in payloads.items()
    }
    python = None if args.no_triton else (args.triton_python or pytriton_peer.ensure_env())
    env = {"LARA_MODEL_REPOSITORY": str(models_dir), "LARA_MODELS": f"{TEXT_MODEL},{IMAGE_MODEL}",
           "LARA_ORT_ATTENTION": "fused" if library else "body", "LARA_ORT_SPINNING": str(args.ort_spinning).lower()}  # fmt: skip
    grpc_port = free_port()
    flags = ["--log-level", "warning", "--grpc-port", str(grpc_port),
             "--max-batch-size", "32", "--max-queue-delay-ms", "2"]  # fmt: skip
    with ExitStack() as stack:
        own = not args.lara_in_driver_session
        url = stack.enter_context(server_process(flags, env=env, timeout_s=300, new_session=own))
        lara_session = _child_session(f"{grpc_port}") if own else 0  # in the driver's: not its own CPU alone
        lanes = {"lara/tensors": (url.removeprefix("http://"), f"127.0.0.1:{grpc_port}", lara_session)}
        parity: dict[str, float] = {}
        if python is not None:
            # Both servers stay up through every cell, so each sees the same background.
            peer = stack.enter_context(
                pytriton_peer.running(python, onnx, str(library or ""), spinning=args.ort_spinning)
            )
            lanes["triton/tensors"] = (peer.http, peer.grpc, peer.session)
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
        "ort_session": {"intra_op_threads": "onnxruntime's default (0) in both", "spinning": args.ort_spinning,
                        "execution_mode": "sequential in both"},
        "sessions": "LARA Serve in this driver's session" if args.lara_in_driver_session
                    else "each server leads its own session (own autogroup CPU share)",
        "triton": pytriton_peer.versions(python) if python is not None else "not run (--no-triton)",
        "parity_max_abs_diff_probabilities": parity,
        "compute_ms": compute,
        "rows": rows,
        "ratios": ratios(rows),
        "paired": paired(cells),
        "cells": cells,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    chart(rows, args.out.with_suffix(".png"), f"gRPC vs binary HTTP, {report['settings']['models_dir']} models, "
          f"concurrency {args.concurrency}, {args.rounds} round(s), load avg {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")  # fmt: skip
    print(markdown(rows))
    print(json.dumps(report["ratios"], indent=2))
    print(json.dumps(report["paired"], indent=2))
    return report


if __name__ == "__main__":
    main()
