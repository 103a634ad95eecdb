"""Inference backends: run one padded batch, return logits. They know nothing of HTTP or batching.

Each backend declares why it cannot serve a model/device (`not_supported_reasons`) so start-up can say
exactly what is missing instead of failing at the first request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from server.repository import ModelConfig

BackendName = Literal["onnxruntime", "torch"]
Device = Literal["cpu", "cuda"]
# How onnxruntime runs LaraAttention nodes on the CPU (settings.ort_attention).
OrtAttention = Literal["auto", "fused", "body"]


class Backend(Protocol):
    name: str
    device: str

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Inputs named as in config.json, batch first -> FP32 logits [batch, n_labels]."""
        ...

    def close(self) -> None: ...


class BackendUnavailable(RuntimeError):
    """The backend cannot serve this model on this device; the message lists every reason."""


def create_backend(
    name: BackendName,
    model_dir: Path,
    config: ModelConfig,
    device: Device,
    num_threads: int = 0,
    ort_attention: OrtAttention = "auto",
) -> Backend:
    if name == "onnxruntime":
        from server.backends.onnx_runtime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(model_dir, config, device, num_threads, ort_attention)
    if name == "torch":
        from server.backends.pytorch import TorchBackend

        return TorchBackend(model_dir, config, device, num_threads)
    raise BackendUnavailable(f"unknown backend {name!r}; choose onnxruntime or torch")


def check_logits(logits: np.ndarray, batch: int, config: ModelConfig) -> np.ndarray:
    """Backends return what the model says; a wrong shape is a broken artifact, refused loudly."""
    expected = (batch, len(config.labels))
    if logits.shape != expected:
        raise RuntimeError(f"model returned logits {logits.shape}, expected {expected}")
    return np.ascontiguousarray(logits, dtype=np.float32)
