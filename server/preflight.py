"""Start-up checks that need no model: can the server listen, and can the chosen backend use the device?

Each returns one line saying what is wrong and what to do, so `lara-serve` fails in a second with a
sentence instead of after loading every model with a traceback.
"""

from __future__ import annotations

import errno
import importlib.util
import socket
from pathlib import Path

from lara_serve.server.settings import Settings


def preflight(settings: Settings) -> str | None:
    ports = [("port", settings.port)] + ([("metrics_port", settings.metrics_port)] if settings.metrics_port else [])
    ports += [("grpc_port", settings.grpc_port)] if settings.grpc_port else []
    for what, port in ports:
        problem = port_problem(settings.host, port, what)
        if problem is not None:
            return problem
    if settings.grpc_port and importlib.util.find_spec("grpc") is None:
        return "grpc_port is set but grpcio is not installed: pip install 'lara-serve[grpc]' (or leave --grpc-port 0)"
    return device_problem(settings)


def port_problem(host: str, port: int, what: str = "port") -> str | None:
    """Bind and release (SO_REUSEADDR as uvicorn does, so a port in TIME_WAIT counts as free)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve host {host!r} ({exc.strerror}); use an address such as 127.0.0.1 or 0.0.0.0"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{host}:{port} is already in use (another server?); choose a free {what} with --{what.replace('_', '-')} or LARA_{what.upper()}"
            if exc.errno == errno.EACCES:
                return f"no permission to listen on {host}:{port}; use a {what} above 1023"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{host!r} is not an address of this machine; use 127.0.0.1 (local) or 0.0.0.0 (all interfaces)"
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


def _gpu_visible() -> bool:
    return Path("/dev/nvidiactl").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def device_problem(settings: Settings) -> str | None:
    kinds = {settings.backend, *settings.model_backends.values()}
    if "torch" in kinds and importlib.util.find_spec("torch") is None:
        return "backend=torch needs PyTorch, which this install lacks: pip install 'lara-serve[train]' (or use --backend onnxruntime)"
    if settings.device != "cuda":
        return None
    if "onnxruntime" in kinds:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
        if "CUDAExecutionProvider" not in providers:
            return (
                f"device=cuda needs the GPU build of onnxruntime (pip install 'lara-serve[gpu]', see pyproject.toml); "
                f"this onnxruntime {onnxruntime.__version__} has only {providers}. Or use --device cpu"
            )
        if not _gpu_visible():
            return "device=cuda but no NVIDIA GPU is visible on this machine (no /dev/nvidia*); use --device cpu"
    if "torch" in kinds:
        import torch

        if not torch.cuda.is_available():
            return f"device=cuda but torch {torch.__version__} sees no CUDA device (a CPU build, or no GPU); use --device cpu"
    return None
