"""What every backend shares: the output record, the protocol a backend implements, its refusal, and the
checks that a batch's outputs have the shapes config.json declares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from lara_serve.server.repository import OOD_OUTPUT, ModelConfig

BackendName = Literal["onnxruntime", "torch"]
Device = Literal["cpu", "cuda"]
# How onnxruntime runs LaraAttention nodes on the CPU (settings.ort_attention).
OrtAttention = Literal["auto", "fused", "body"]


@dataclass(frozen=True)
class ModelOutputs:
    logits: np.ndarray  # [batch, n_labels] float32
    ood_score: np.ndarray | None = None  # [batch] float32, when the model has the output


@dataclass(frozen=True)
class OrtOptions:
    """How onnxruntime runs a model: settings.ort_attention, ort_spinning, ort_long_via_torch and
    ort_shared_arena, grouped so that the factory passes them on as one value (the torch backend has no use
    for them)."""

    attention: OrtAttention = "auto"
    spinning: bool = False
    long_via_torch: bool = True
    shared_arena: bool = True


class Backend(Protocol):
    name: str
    device: str

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Inputs named as in config.json, batch first -> FP32 logits [batch, n_labels]."""
        ...

    def run_outputs(self, inputs: dict[str, np.ndarray]) -> ModelOutputs:
        """The same batch -> logits and, when config.json declares it, ood_score [batch]."""
        ...

    def close(self) -> None: ...


class BackendBase:
    """The path the onnxruntime and torch backends share: where the model's artifacts are, its inputs in
    config.json's order, `run` as the logits of `run_outputs`, and the shape checks of every batch."""

    name: str

    def __init__(self, model_dir: Path, config: ModelConfig, device: Device) -> None:
        self.model_dir, self.device, self._config = model_dir, device, config
        self._input_names = [spec.name for spec in config.inputs]

    def artifact(self, file: str) -> Path:
        """`<model>/<served version>/<file>` (the version its version_policy chose)."""
        return self.model_dir / self._config.version / file

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.run_outputs(inputs).logits

    def run_outputs(self, inputs: dict[str, np.ndarray]) -> ModelOutputs:
        raise NotImplementedError  # each backend (onnx_runtime, pytorch) runs its own session or module

    def _checked(self, logits: np.ndarray, ood_score: np.ndarray | None, batch: int) -> ModelOutputs:
        return check_outputs(logits, ood_score, batch, self._config)


class BackendUnavailable(RuntimeError):
    """The backend cannot serve this model on this device; the message lists every reason."""


def check_logits(logits: np.ndarray, batch: int, config: ModelConfig) -> np.ndarray:
    """Backends return what the model says; a wrong shape is a broken artifact, refused loudly."""
    expected = (batch, len(config.labels))
    if logits.shape != expected:
        raise RuntimeError(f"model returned logits {logits.shape}, expected {expected}")
    return np.ascontiguousarray(logits, dtype=np.float32)


def run_outputs(backend: Backend, inputs: dict[str, np.ndarray]) -> ModelOutputs:
    """All outputs of a batch; a backend written before `run_outputs` existed gives logits alone."""
    method = getattr(backend, "run_outputs", None)
    return method(inputs) if method is not None else ModelOutputs(backend.run(inputs))


def check_outputs(logits: np.ndarray, ood_score: np.ndarray | None, batch: int, config: ModelConfig) -> ModelOutputs:
    """check_logits, and an ood_score of one value per item when config.json declares one."""
    checked = check_logits(logits, batch, config)
    if not config.has_ood_output:
        return ModelOutputs(checked)
    if ood_score is None:
        raise RuntimeError(f"config.json declares output {OOD_OUTPUT!r} but the model did not return it")
    score = np.asarray(ood_score, dtype=np.float32).reshape(-1) if np.ndim(ood_score) <= 2 else None
    if score is None or score.shape != (batch,):
        raise RuntimeError(f"model returned {OOD_OUTPUT} {np.shape(ood_score)}, expected ({batch},)")
    return ModelOutputs(checked, np.ascontiguousarray(score))
