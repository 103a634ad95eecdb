"""Backends for LARA behind one entry point, in the style of xformers' fmha dispatch.

Each backend states what it supports and, for given inputs, every reason it cannot run them. The
dispatcher picks the first backend with no reasons; if none fits, the error lists every backend's
reasons, so a user sees at once why (say) the Triton kernel was skipped.
"""

from __future__ import annotations

import os
from typing import ClassVar

import torch
from torch import Tensor

from lara_serve.kernels import _cpu_fused
from lara_serve.kernels._cpu import lara_forward_cpu
from lara_serve.kernels.inputs import LaraInputs


class Backend:
    """One implementation of the LARA forward."""

    name: ClassVar[str]
    dtypes: ClassVar[frozenset[torch.dtype]]

    @classmethod
    def not_supported_reasons(cls, inputs: LaraInputs) -> list[str]:
        reasons = []
        if inputs.q.dtype not in cls.dtypes:
            allowed = ", ".join(sorted(str(d) for d in cls.dtypes))
            reasons.append(f"dtype {inputs.q.dtype} not supported (supports {allowed})")
        return reasons

    @classmethod
    def forward(cls, inputs: LaraInputs) -> Tensor:
        raise NotImplementedError  # every concrete backend overrides this


class TorchBackend(Backend):
    """Blocked PyTorch (`kernels/_cpu.py`): any device and dtype, O(N*C) extra memory, differentiable.
    The CPU fallback when the compiled kernel is unavailable (and for float64)."""

    name = "torch"
    dtypes = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

    @classmethod
    def forward(cls, inputs: LaraInputs) -> Tensor:
        return lara_forward_cpu(inputs)


class CpuFusedBackend(Backend):
    """Compiled C++ kernel (`kernels/csrc/`, loaded by `kernels/_cpu_fused.py`): CPU, streams keys with
    an online softmax, O(N) extra memory, bitwise batch invariant. The CPU default where it builds."""

    name = "cpu_fused"
    dtypes = _cpu_fused.DTYPES

    @classmethod
    def not_supported_reasons(cls, inputs: LaraInputs) -> list[str]:
        reasons = super().not_supported_reasons(inputs)
        if inputs.device.type != "cpu":
            reasons.append(f"device {inputs.device} is not the CPU")
        if inputs.v.shape[-1] != inputs.head_dim:
            reasons.append(f"value dim {inputs.v.shape[-1]} != head dim {inputs.head_dim}")
        if not reasons:
            why = _cpu_fused.unavailable_reason()  # builds the kernel on first use
            if why:
                reasons.append(why)
        return reasons

    @classmethod
    def forward(cls, inputs: LaraInputs) -> Tensor:
        return _cpu_fused.lara_forward_fused(inputs)


def _triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class TritonBackend(Backend):
    """Fused Triton kernels (`kernels/_triton/`): CUDA, or CPU under TRITON_INTERPRET=1 (tests only)."""

    name = "triton"
    dtypes = frozenset({torch.float16, torch.bfloat16, torch.float32})
    head_dims: ClassVar[frozenset[int]] = frozenset({16, 32, 64, 128})
    max_landmarks: ClassVar[int] = 256

    @classmethod
    def not_supported_reasons(cls, inputs: LaraInputs) -> list[str]:
        reasons = super().not_supported_reasons(inputs)
        if inputs.device.type != "cuda" and not (inputs.device.type == "cpu" and _triton_interpreting()):
            reasons.append(f"device {inputs.device} is not CUDA (CPU only with TRITON_INTERPRET=1)")
        if inputs.head_dim not in cls.head_dims:
            reasons.append(f"head dim {inputs.head_dim} not supported (supports {sorted(cls.head_dims)})")
        if inputs.num_landmarks > cls.max_landmarks:
            reasons.append(f"{inputs.num_landmarks} landmarks > {cls.max_landmarks}")
        if not reasons:
            try:
                import lara_serve.kernels._triton  # noqa: F401
            except Exception as exc:  # an import failure is a reason, not a crash
                reasons.append(f"triton kernels unavailable: {exc}")
        return reasons

    @classmethod
    def forward(cls, inputs: LaraInputs) -> Tensor:
        from lara_serve.kernels._triton import lara_forward_triton

        return lara_forward_triton(inputs)


# Order is preference: the fused kernels where they run, the blocked PyTorch path everywhere else.
BACKENDS: dict[str, type[Backend]] = {"triton": TritonBackend, "cpu_fused": CpuFusedBackend, "torch": TorchBackend}


def select_backend(inputs: LaraInputs, backend: str | None = None) -> type[Backend]:
    """The backend to run `inputs` on: `backend` if forced (and able), else the first that fits."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS)} or None (automatic)")
    candidates = [BACKENDS[backend]] if backend else list(BACKENDS.values())
    if backend is None and inputs.device.type == "cpu":
        # The Triton interpreter is for testing kernels, never for speed: on CPU, automatic means the
        # compiled kernel, or the PyTorch path when it is unavailable (no compiler) or cannot run the inputs.
        candidates = [CpuFusedBackend, TorchBackend]
    why = {}
    for cand in candidates:
        reasons = cand.not_supported_reasons(inputs)
        if not reasons:
            return cand
        why[cand.name] = reasons
    lines = "; ".join(f"{name}: {', '.join(r)}" for name, r in why.items())
    raise ValueError(f"no LARA backend can run these inputs ({lines})")


def backend_info(inputs: LaraInputs) -> dict[str, list[str]]:
    """For diagnostics: every backend with the reasons it cannot run `inputs` (empty list = can)."""
    return {name: b.not_supported_reasons(inputs) for name, b in BACKENDS.items()}
