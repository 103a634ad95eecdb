"""A real Triton Inference Server as a benchmark peer: its venv, its process, its models (127.0.0.1 only).

The peer is tritonserver from PyPI `nvidia-pytriton` 0.7.0 serving ONNX files through a pytriton Python
inference callable that runs one onnxruntime InferenceSession per model on each batch Triton's dynamic
batcher forms, with the custom-op library of the fused LaraAttention kernel registered as LARA Serve
registers it (`lara_serve.kernels.ort_library`). pytriton's stub fails under the pyenv python (platform.md), so the
peer runs under a venv of Debian's /usr/bin/python3, `.venv-triton/` (git-ignored):

    python -m benchmarks.pytriton_peer setup     # or `make bench-triton-env`; idempotent

`ensure_env` creates it on demand. This file is also the peer's entry point (`python
benchmarks/pytriton_peer.py serve ...`): that side imports only the standard library, numpy,
onnxruntime and pytriton, never the project.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-triton"
DEBIAN_PYTHON = "/usr/bin/python3"
PYTRITON = "nvidia-pytriton==0.7.0"
PROBE = "import pytriton, onnxruntime, numpy; print(onnxruntime.__version__)"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the environment (driver side) ------------------------------------------------------------------------


def probe(python: Path) -> str | None:
    """None when `python` imports pytriton, onnxruntime and numpy; else why not."""
    if not python.is_file():
        return f"{python} does not exist"
    done = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=180)
    return None if done.returncode == 0 else f"{python} cannot import pytriton/onnxruntime/numpy: {done.stderr[-800:]}"


def requirements() -> list[str]:
    """pytriton plus the driver's own onnxruntime version, so both servers run the same runtime."""
    return [PYTRITON, f"onnxruntime=={importlib.metadata.version('onnxruntime')}", "numpy"]


def ensure_env(venv: Path = VENV, base_python: str = DEBIAN_PYTHON) -> Path:
    """The peer's python, creating the venv and installing into it only when the probe fails."""
    python = venv / "bin" / "python"
    if probe(python) is None:
        return python
    if not Path(base_python).is_file():
        raise RuntimeError(f"{base_python} not found: pytriton needs Debian's python3 (3.11), not pyenv's")
    if not python.is_file():
        subprocess.run([base_python, "-m", "venv", str(venv)], check=True, timeout=600)
    pip = [str(python), "-m", "pip", "install", "-q", *requirements()]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(pip)} failed: {done.stderr[-1500:]}")
    why = probe(python)
    if why is not None:
        raise RuntimeError(why)
    return python


def versions(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, onnxruntime as o, platform as p; "
        "print(m.version('nvidia-pytriton'), o.__version__, p.python_version())"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120).stdout.split()
    return dict(zip(("pytriton", "onnxruntime", "python"), out, strict=False))


# -- the running peer (driver side) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    http: str  # host:port, as tritonclient takes it
    grpc: str
    metrics: str  # full URL of the Prometheus endpoint
    session: int = 0  # session id of its processes (tritonserver, the stub, the proxies), for CPU accounting


def _wait_ready(peer: Peer, models: Sequence[str], proc: subprocess.Popen[bytes], log: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(models)
    while pending:
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-4000:]
            raise RuntimeError(f"the Triton peer did not become ready (waiting for {pending}):\n{tail}")
        try:
            with urllib.request.urlopen(f"http://{peer.http}/v2/models/{pending[0]}/ready", timeout=1.0) as r:
                if r.status == 200:
                    pending.pop(0)
                    continue
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)


@contextmanager
def running(
    python: Path,
    models: dict[str, Path],
    ort_library: str | None,
    max_batch_size: int = 32,
    max_queue_delay_us: int = 2000,
    start_timeout_s: float = 300.0,
    num_threads: int = 0,
    spinning: bool = False,
) -> Iterator[Peer]:
    """Start tritonserver serving `models` (name -> model.onnx) and stop it (its whole process group) after."""
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    cmd = [str(python), str(Path(__file__).resolve()), "serve", "--max-batch-size", str(max_batch_size),
           "--max-queue-delay-us", str(max_queue_delay_us), "--http-port", str(http), "--grpc-port", str(grpc),
           "--metrics-port", str(metrics), "--num-threads", str(num_threads)]  # fmt: skip
    for name, onnx in models.items():
        cmd += ["--model", f"{name}={onnx}"]
    if ort_library:
        cmd += ["--ort-library", ort_library]
    if spinning:
        cmd += ["--ort-spinning"]
    with tempfile.TemporaryFile() as log:
        # Own session: a stop that hangs kills its group (tritonserver, the proxy), nothing else.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        peer = Peer(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}/metrics", proc.pid)
        try:
            _wait_ready(peer, list(models), proc, log, start_timeout_s)
            yield peer
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# -- the peer itself (runs under the peer venv's python) ---------------------------------------------------


def _pad_concat(arrays: list[Any]) -> Any:
    """Concatenate on the batch axis, zero-padding the other axes to the largest (text: mask 0 there)."""
    import numpy as np

    shape = [sum(a.shape[0] for a in arrays), *np.max([a.shape[1:] for a in arrays], axis=0)]
    out = np.zeros(shape, dtype=arrays[0].dtype)
    row = 0
    for a in arrays:
        out[(slice(row, row + a.shape[0]), *(slice(0, d) for d in a.shape[1:]))] = a
        row += a.shape[0]
    return out


def _bind(triton: Any, name: str, onnx: str, args: argparse.Namespace) -> None:
    import numpy as np
    import onnxruntime as ort
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL  # as server/backends/onnx_runtime.py
    if args.num_threads:
        options.intra_op_num_threads = args.num_threads
    for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):  # as LARA's ort_spinning
        options.add_session_config_entry(key, "1" if args.ort_spinning else "0")
    if args.ort_library:
        options.register_custom_ops_library(args.ort_library)
    session = ort.InferenceSession(onnx, sess_options=options, providers=["CPUExecutionProvider"])
    dtypes = {"tensor(int64)": np.int64, "tensor(float)": np.float32}
    inputs = [(i.name, dtypes[i.type], tuple(d if isinstance(d, int) else -1 for d in i.shape[1:]))
              for i in session.get_inputs()]  # fmt: skip
    first = session.get_outputs()[0]  # logits [batch, labels]; ood_score [batch] has no per-item axis
    out_shape = tuple(d if isinstance(d, int) else -1 for d in first.shape[1:])

    def infer(requests: list[Any]) -> list[dict[str, Any]]:
        feeds = {n: _pad_concat([r[n] for r in requests]) for n, _, _ in inputs}
        (logits,) = session.run([first.name], feeds)
        bounds = np.cumsum([0, *(len(r[inputs[0][0]]) for r in requests)])
        return [{first.name: logits[b:e]} for b, e in zip(bounds[:-1], bounds[1:], strict=True)]

    triton.bind(
        model_name=name,
        infer_func=infer,
        inputs=[Tensor(name=n, dtype=t, shape=s) for n, t, s in inputs],
        outputs=[Tensor(name=first.name, dtype=np.float32, shape=out_shape)],
        config=ModelConfig(
            max_batch_size=args.max_batch_size,
            batcher=DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us),
        ),
        strict=False,
    )


def serve(args: argparse.Namespace) -> int:
    from pytriton.triton import Triton, TritonConfig

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
        raise KeyboardInterrupt  # leaves the with-block: pytriton stops tritonserver and its proxies

    signal.signal(signal.SIGTERM, on_term)
    try:
        with Triton(config=config) as triton:
            for spec in args.model:
                name, onnx = spec.split("=", 1)
                _bind(triton, name, onnx, args)
            triton.serve()
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pytriton_peer", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    setup = sub.add_parser("setup", help=f"create {VENV.name}/ with {PYTRITON} (idempotent)")
    setup.add_argument("--venv", type=Path, default=VENV)
    peer = sub.add_parser("serve", help="run the peer (under the peer venv's python)")
    peer.add_argument("--model", action="append", required=True, help="NAME=path/to/model.onnx (repeatable)")
    peer.add_argument("--http-port", type=int, required=True)
    peer.add_argument("--grpc-port", type=int, required=True)
    peer.add_argument("--metrics-port", type=int, required=True)
    peer.add_argument("--max-batch-size", type=int, default=32)
    peer.add_argument("--max-queue-delay-us", type=int, default=2000)
    peer.add_argument("--num-threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default)")
    peer.add_argument("--ort-spinning", action="store_true", help="let idle onnxruntime threads busy-wait")
    peer.add_argument("--ort-library", default="", help="custom-op library to register (the fused kernel)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    python = ensure_env(args.venv)
    print(f"{python}: {versions(python)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
