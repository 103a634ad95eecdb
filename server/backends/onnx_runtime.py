"""ONNX Runtime backend over `<model>/<version>/model.onnx`.

LaraAttention nodes run either as their ONNX function body (inlined by onnxruntime at load) or, on the
CPU, as the fused C++ kernel registered as a custom op (`kernels.ort_library`); `attention_kernel` says
which. The kernel is CPU-only: on CUDA the body runs on the GPU.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from server.backends import BackendUnavailable, Device, ModelOutputs, OrtAttention, check_outputs
from server.repository import ONNX_FILE, OOD_OUTPUT, ModelConfig

# onnxruntime's session config keys for busy-waiting worker threads (onnxruntime_session_options_config_keys.h).
SPIN_KEYS = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def not_supported_reasons(model_dir: Path, config: ModelConfig, device: Device) -> list[str]:
    reasons = []
    path = model_dir / config.version / ONNX_FILE
    if not path.is_file():
        reasons.append(f"{path} does not exist")
    try:
        import onnxruntime as ort
    except ImportError:
        return [*reasons, "onnxruntime is not installed (pip install onnxruntime or onnxruntime-gpu)"]
    if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        reasons.append(
            f"device=cuda but onnxruntime offers only {ort.get_available_providers()} "
            "(install onnxruntime-gpu, not onnxruntime, and check the CUDA libraries)"
        )
    return reasons


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(
        self,
        model_dir: Path,
        config: ModelConfig,
        device: Device,
        num_threads: int = 0,
        attention: OrtAttention = "auto",
        spinning: bool = False,
    ) -> None:
        reasons = not_supported_reasons(model_dir, config, device)
        if reasons:
            raise BackendUnavailable(f"onnxruntime cannot serve {config.name!r}: " + "; ".join(reasons))
        import onnxruntime as ort

        options = ort.SessionOptions()
        if num_threads:
            options.intra_op_num_threads = num_threads
        # One batch runs at a time per model (the batcher's worker thread): no inter-op parallelism.
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Spinning keeps each idle intra-op thread busy-waiting after every parallel section, so a request
        # burned about twice its compute in CPU time (settings.ort_spinning): cores the event loop, the other
        # models and everything else on the machine need.
        for key in SPIN_KEYS:
            options.add_session_config_entry(key, "1" if spinning else "0")
        self.attention_kernel = "body"
        if device == "cpu" and attention != "body":
            self.attention_kernel = _fused_or_body(options, attention)
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        path = model_dir / config.version / ONNX_FILE
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        self.device = device
        self._config = config
        self._input_names = [i.name for i in self.session.get_inputs()]
        declared = [spec.name for spec in config.inputs]
        if sorted(self._input_names) != sorted(declared):
            raise BackendUnavailable(f"{path} has inputs {self._input_names} but config.json declares {declared}")
        graph_outputs = [o.name for o in self.session.get_outputs()]
        # By name when the graph has both; else the first output is the logits, as before ood_score existed.
        logits_name = "logits" if "logits" in graph_outputs else graph_outputs[0]
        self._output_names = [logits_name]
        if config.has_ood_output:
            if OOD_OUTPUT not in graph_outputs:
                raise BackendUnavailable(
                    f"config.json declares output {OOD_OUTPUT!r} but {path} has outputs {graph_outputs}"
                )
            self._output_names.append(OOD_OUTPUT)

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.run_outputs(inputs).logits

    def run_outputs(self, inputs: dict[str, np.ndarray]) -> ModelOutputs:
        batch = next(iter(inputs.values())).shape[0]
        outs = self.session.run(self._output_names, {name: inputs[name] for name in self._input_names})
        return check_outputs(outs[0], outs[1] if len(outs) > 1 else None, batch, self._config)

    def close(self) -> None:
        del self.session


def _fused_or_body(options: object, attention: OrtAttention) -> str:
    """Register the fused LaraAttention kernel on `options`; "fused", or "body" when it cannot be had."""
    try:
        from kernels import ort_library
    except ImportError:  # an install that copied server/ alone
        why = "the kernels package is not installed"
        if attention == "auto":
            warnings.warn(f"{why}; onnxruntime runs LaraAttention's ONNX function body", stacklevel=2)
    else:
        if ort_library.register(options):
            return "fused"
        why = ort_library.unavailable_reason() or "unknown"
    if attention == "fused":
        raise BackendUnavailable(f"ort_attention=fused but the fused kernel is unavailable: {why}")
    return "body"
