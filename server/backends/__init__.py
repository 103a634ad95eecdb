"""Inference backends: run one padded batch, return its outputs. They know nothing of HTTP or batching.

Every model has `logits`; a model may also have `ood_score` [batch] (higher = less like its training
data), declared in config.json's outputs. `run_outputs` returns both; `run` stays the logits alone.

Each backend declares why it cannot serve a model/device (`not_supported_reasons`) so start-up can say
exactly what is missing instead of failing at the first request.
"""

from __future__ import annotations

from pathlib import Path

from lara_serve.server.backends.base import (
    Backend,
    BackendName,
    BackendUnavailable,
    Device,
    ModelOutputs,
    OrtAttention,
    OrtOptions,
    check_logits,
    check_outputs,
    run_outputs,
)
from lara_serve.server.repository import ModelConfig

__all__ = [
    "Backend",
    "BackendName",
    "BackendUnavailable",
    "Device",
    "ModelOutputs",
    "OrtAttention",
    "OrtOptions",
    "check_logits",
    "check_outputs",
    "create_backend",
    "run_outputs",
]


def create_backend(
    name: BackendName,
    model_dir: Path,
    config: ModelConfig,
    device: Device,
    num_threads: int = 0,
    ort_options: OrtOptions = OrtOptions(),
) -> Backend:
    if name == "onnxruntime":
        from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(model_dir, config, device, num_threads, ort_options)
    if name == "torch":
        from lara_serve.server.backends.pytorch import TorchBackend, use_threads

        backend = TorchBackend(model_dir, config, device)
        use_threads(num_threads)
        return backend
    raise BackendUnavailable(f"unknown backend {name!r}; choose onnxruntime or torch")
