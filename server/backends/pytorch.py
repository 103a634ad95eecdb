"""PyTorch backend: the module from `lara_serve.model_export.load_pretrained(<model dir>)`.

On GPU its attention calls `torch.ops.lara.attention` (Triton kernels); on CPU the PyTorch path.
model_export is imported lazily: servers running onnxruntime do not need it.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lara_serve.server.backends.base import BackendBase, BackendUnavailable, Device, ModelOutputs
from lara_serve.server.repository import OOD_OUTPUT, TORCH_FILE, ModelConfig

Loader = Callable[[Path], Any]
HUB_VERSION = "1"  # the version folder lara_serve.model_export.load_pretrained reads its weights from
DIGEST_CHUNK = 1 << 20


def file_digests(paths: list[Path]) -> dict[Path, str]:
    """sha256 of each file, read in 1 MiB chunks: what a model version's files held when they were read, so
    a later read (the long-document torch forward, made at its first document) can be refused if they
    changed on disk since (every answer from one version's files)."""
    digests = {}
    for path in paths:
        sha = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(DIGEST_CHUNK):
                sha.update(chunk)
        digests[path] = sha.hexdigest()
    return digests


def default_loader() -> Loader:
    try:
        from lara_serve.model_export import load_pretrained
    except ImportError as exc:
        raise BackendUnavailable(
            f"backend=torch needs lara_serve.model_export.load_pretrained(model_dir) -> torch.nn.Module ({exc}); "
            "use backend=onnxruntime or install the model_export package"
        ) from exc
    if "serving" in inspect.signature(load_pretrained).parameters:
        # The model as served: logits / calibration temperature and, when fitted, (logits, ood_score); without
        # it a calibrated model's probabilities would differ from its model.onnx's.
        return functools.partial(load_pretrained, serving=True)
    return load_pretrained


def use_threads(num_threads: int) -> None:
    """torch's intra-op thread count belongs to the process, not to one model: whoever makes a torch backend
    (create_backend, the onnxruntime backend's long-document forward) sets it here. 0 keeps torch's."""
    if num_threads:
        import torch

        torch.set_num_threads(num_threads)


class TorchBackend(BackendBase):
    name = "torch"

    def __init__(self, model_dir: Path, config: ModelConfig, device: Device, loader: Loader | None = None) -> None:
        import torch

        super().__init__(model_dir, config, device)
        if device == "cuda" and not torch.cuda.is_available():
            raise BackendUnavailable(f"device=cuda but torch {torch.__version__} sees no CUDA device")
        weights = self.artifact(TORCH_FILE)
        if loader is None and not weights.is_file():
            raise BackendUnavailable(f"torch cannot serve {config.name!r}: {weights} does not exist")
        if loader is None and config.version != HUB_VERSION:  # it would serve another version's weights
            raise BackendUnavailable(
                f"torch cannot serve {config.name!r} version {config.version}: load_pretrained reads the weights "
                f"of version {HUB_VERSION} only; use backend=onnxruntime"
            )
        module = (loader or default_loader())(model_dir)
        temperature = config.float_graph_temperature
        if temperature is not None and isinstance(getattr(module, "temperature", None), torch.Tensor):
            # an int8-served model: its weights keep the float head's temperature, fitted before the int8 step
            # gave other sources their say in it; config.json records the one for these float logits
            with torch.no_grad():
                module.temperature.fill_(temperature)
        self.module = module.eval().to(device)
        self._torch = torch

    def run_outputs(self, inputs: dict[str, np.ndarray]) -> ModelOutputs:
        torch = self._torch
        # Positional, in config order: the same order the ONNX export took from forward().
        args = [torch.from_numpy(inputs[name]).to(self.device) for name in self._input_names]
        with torch.inference_mode():
            out = self.module(*args)
        logits, ood = _split_outputs(out)
        ood_np = ood.float().cpu().numpy() if ood is not None else None
        return self._checked(logits.float().cpu().numpy(), ood_np, args[0].shape[0])

    def close(self) -> None:
        del self.module


def _split_outputs(out: Any) -> tuple[Any, Any]:
    """forward()'s result -> (logits, ood_score or None): a tensor, a (logits, ood_score) tuple, a dict, or
    an object with those attributes."""
    if isinstance(out, dict):
        return out["logits"], out.get(OOD_OUTPUT)
    if isinstance(out, tuple | list):
        return out[0], out[1] if len(out) > 1 else None
    if hasattr(out, "logits"):
        return out.logits, getattr(out, OOD_OUTPUT, None)
    return out, None
