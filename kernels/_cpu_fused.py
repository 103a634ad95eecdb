"""The fused CPU LARA kernel (`kernels/csrc/`): built on first use, loaded with ctypes, with a fallback.

The C++ source is one translation unit with a plain C ABI (see `kernels/csrc/lara_cpu.cpp` for why),
compiled by the system C++ compiler in a few seconds and cached (`kernels/native_build.py`).

If there is no compiler, the build fails, or `LARA_CPU_KERNEL=off`, `load()` returns None after ONE
warning and the dispatcher (`kernels/dispatch.py`) runs the PyTorch path (`kernels/_cpu.py`) instead:
a missing compiler never fails a request. `python -m lara_serve.kernels._cpu_fused` builds ahead of time (e.g.
in an image build), so no request pays the compile.

Numerics: float32 compute for fp16/bf16/fp32 inputs (cast back at the end), the same masks and math as
`lara_serve.kernels.reference.lara_attention_ref`. Per document, the arithmetic depends only on that document's
valid tokens: its output bits are the same alone, in any batch, with any padding, at any thread count.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch
from torch import Tensor

from lara_serve.kernels import native_build
from lara_serve.kernels.inputs import LaraInputs, unit_last_stride

ABI_VERSION = 2
DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})


def _open(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))  # torch is imported first, so libgomp resolves to torch's own copy
    lib.lara_cpu_abi_version.restype = ctypes.c_int
    if lib.lara_cpu_abi_version() != ABI_VERSION:
        raise RuntimeError(f"{path} has ABI {lib.lara_cpu_abi_version()}, expected {ABI_VERSION}")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.lara_cpu_forward.argtypes = (
        [i64] * 5 + [ptr] * 7 + [i64, ptr, ctypes.c_float, ptr, ctypes.c_int, ctypes.c_int]
    )  # fmt: skip
    lib.lara_cpu_forward.restype = ctypes.c_int
    lib.lara_cpu_variant.argtypes = [ctypes.c_int]
    lib.lara_cpu_variant.restype = ctypes.c_int
    return lib


def _load_or_reason() -> ctypes.CDLL | str:
    if os.environ.get("LARA_CPU_KERNEL", "").lower() in ("0", "off", "false", "no"):
        return "disabled by LARA_CPU_KERNEL"
    try:
        path = native_build.cached_library(
            "lara_cpu", [native_build.CSRC / "lara_cpu.cpp"], [native_build.CSRC / "lara_impl.h"], native_build.CXXFLAGS
        )
        return _open(path)
    except Exception as exc:  # any failure means "use the fallback", never a crash
        return f"fused CPU kernel unavailable: {exc}"


_kernel = native_build.Once(_load_or_reason, "LARA on CPU uses the PyTorch path (kernels/_cpu.py)")


def load() -> ctypes.CDLL | None:
    """The compiled kernel (built on first call), or None after one warning if it cannot be had."""
    return _kernel.get()


def unavailable_reason() -> str | None:
    """Why the compiled kernel cannot run (None when it can); builds it on first call."""
    return _kernel.reason()


def reset() -> None:
    """Forget the loaded library or the failure (tests, or after installing a compiler)."""
    _kernel.reset()


def variant(force_generic: bool = False) -> str:
    """Which compiled variant runs on this CPU: "avx512", "avx2" or "generic" (LARA_CPU_ISA caps it)."""
    lib = load()
    if lib is None:
        raise RuntimeError(unavailable_reason())
    return ("generic", "avx2", "avx512")[lib.lara_cpu_variant(int(force_generic))]


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def lara_forward_fused(inputs: LaraInputs, *, force_generic: bool = False, num_threads: int | None = None) -> Tensor:
    """LARA forward with the compiled kernel. Shapes as in `lara_serve.kernels.inputs`; CPU tensors,
    fp16/bf16/fp32, Dv == D; returns [B, H, N, D] in q's dtype. Callers check availability first."""
    lib = load()
    if lib is None:
        raise RuntimeError(unavailable_reason())
    q, k, v, q_landmarks, k_landmarks, key_padding_mask, alpha_coeff, noise = inputs.as_args()
    b, h, n, d = q.shape
    c = q_landmarks.shape[-2]
    # q, k, v keep their (B, H, N) strides (e.g. views of one fused qkv projection): no copy when the
    # last dim is contiguous. The small per-head tensors are made contiguous.
    qkv = [unit_last_stride(t.to(torch.float32)) for t in (q, k, v)]
    ql, kl = (t.to(torch.float32).contiguous() for t in (q_landmarks, k_landmarks))
    strides = (ctypes.c_int64 * 9)(*(s for t in qkv for s in t.stride()[:3]))
    nz = None if noise is None else noise.to(torch.float32).contiguous()
    mask = None if key_padding_mask is None else key_padding_mask.contiguous().view(torch.uint8)
    out = torch.empty(b, h, n, d, dtype=torch.float32)
    if b * h * n == 0:
        return out.to(q.dtype)
    threads = num_threads or torch.get_num_threads()
    nz_stride = 0 if nz is None or nz.shape[0] == 1 else h * c * d
    rc = lib.lara_cpu_forward(
        b, h, n, d, c, *(_ptr(t) for t in qkv), ctypes.addressof(strides), _ptr(ql), _ptr(kl), _ptr(nz), nz_stride,
        _ptr(mask), alpha_coeff, _ptr(out), threads, int(force_generic),
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"lara_cpu_forward failed with code {rc} for q {tuple(q.shape)}, C = {c}")
    return out.to(q.dtype)


if __name__ == "__main__":
    lib = load()
    print(f"fused CPU kernel: {'ready, variant ' + variant() if lib is not None else unavailable_reason()}")
    print(f"cache: {native_build.cache_dir()}")
