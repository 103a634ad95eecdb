"""Public attention functions. All share shapes and the padding convention:

* q, k, v: [B, H, N, D] (v may have its own last dim Dv); result [B, H, N, Dv] in q's dtype.
* key_padding_mask: [B, N] bool, True marks padding. Padded keys get no weight, padded query rows are
  zero, and a fully padded sequence gives zeros (never NaN).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lara_serve.kernels import reference
from lara_serve.kernels._cpu import lara_forward_cpu
from lara_serve.kernels.inputs import LaraInputs
from lara_serve.kernels.op import lara_attention_op

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4 [B, H, N, D], got shape {tuple(t.shape)}")
        if t.dtype not in _FLOATS:
            raise TypeError(f"{name} must be a floating tensor (fp16/bf16/fp32/fp64), got {t.dtype}")
        if t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"{name} is {t.dtype} on {t.device} but q is {q.dtype} on {q.device}; they must match")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"v must be [B, H, N, Dv] with [B, H, N] = {tuple(q.shape[:-1])}, got {tuple(v.shape)}")
    if q.shape[-1] == 0:
        raise ValueError("head dim D must be >= 1")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
            raise TypeError("key_padding_mask must be a bool tensor [B, N] (True = padding)")
        if key_padding_mask.shape != q.shape[:1] + q.shape[2:3]:
            raise ValueError(
                f"key_padding_mask must be [B, N] = {(q.shape[0], q.shape[2])}, got {tuple(key_padding_mask.shape)}"
            )
        if key_padding_mask.device != q.device:
            raise TypeError(f"key_padding_mask is on {key_padding_mask.device} but q is on {q.device}")


def _check_per_head(name: str, t: Tensor | None, q: Tensor, rows: int | None, batch_one_ok: bool) -> None:
    """t must be [B (or 1), H, rows, D] matching q's dtype/device (rows None: any >= 1)."""
    if t is None:
        return
    if not isinstance(t, Tensor) or t.dim() != 4:
        raise ValueError(f"{name} must be a rank-4 tensor [B, H, C, D], got {getattr(t, 'shape', type(t))}")
    b, h, _, d = q.shape
    ok_b = t.shape[0] == b or (batch_one_ok and t.shape[0] == 1)
    if not ok_b or t.shape[1] != h or t.shape[3] != d or (rows is not None and t.shape[2] != rows):
        want = f"[{'B or 1' if batch_one_ok else b}, {h}, {rows if rows is not None else 'C'}, {d}]"
        raise ValueError(f"{name} must be {want}, got {tuple(t.shape)}")
    if t.dtype != q.dtype or t.device != q.device:
        raise TypeError(f"{name} is {t.dtype} on {t.device} but q is {q.dtype} on {q.device}; they must match")


def lara_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_landmarks: Tensor,
    k_landmarks: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    alpha_coeff: float = 1.0,
    noise: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Linear randomized attention (LARA, spec 5): one sample per proposal, mis-opt weights, SNIS.

    q, k, v: [B, H, N, D]. q_landmarks, k_landmarks: [B, H, C, D]; proposal means are their sum.
    key_padding_mask: [B, N] bool, True = padding. alpha_coeff: lambda of the mis-opt weighting.
    noise: None for eval (each sample at its proposal mean, deterministic), or [B or 1, H, C, D]
    raw-space noise added to the means (fresh in training, a fixed buffer for fixed-noise eval).
    backend: None picks automatically (Triton on CUDA; on CPU the compiled kernel, else PyTorch);
    "triton" / "cpu_fused" / "torch" force one.
    Returns [B, H, N, D] in q's dtype; cost is linear in N.
    """
    _check_qkv(q, k, v, key_padding_mask)
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"LARA needs Dv == D (got {v.shape[-1]} and {q.shape[-1]})")
    _check_per_head("q_landmarks", q_landmarks, q, None, batch_one_ok=False)
    if q_landmarks.shape[2] == 0:
        raise ValueError("q_landmarks must hold at least one landmark (C >= 1), got C = 0")
    _check_per_head("k_landmarks", k_landmarks, q, q_landmarks.shape[2], batch_one_ok=False)
    _check_per_head("noise", noise, q, q_landmarks.shape[2], batch_one_ok=True)
    needs_grad = any(t.requires_grad for t in (q, k, v, q_landmarks, k_landmarks))
    if needs_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling():
        # Eager training: differentiate the PyTorch path directly (one forward, no recompute).
        if backend not in (None, "torch"):
            raise ValueError(f"backend {backend!r} has no backward; training runs the 'torch' backend")
        return lara_forward_cpu(LaraInputs(q, k, v, q_landmarks, k_landmarks, key_padding_mask, alpha_coeff, noise))
    return lara_attention_op(
        q, k, v, q_landmarks, k_landmarks, key_padding_mask, noise, float(alpha_coeff), backend or ""
    )


def describe_backends(q: Tensor, k: Tensor, v: Tensor, q_landmarks: Tensor, k_landmarks: Tensor) -> dict:
    """Which LARA backends could run these inputs, and why not (for logs and the server's /v2 info)."""
    from lara_serve.kernels.dispatch import backend_info, select_backend

    inputs = LaraInputs(q, k, v, q_landmarks, k_landmarks, None, 1.0, None)
    try:
        chosen = select_backend(inputs).name
    except ValueError:
        chosen = None
    return {"chosen": chosen, "reasons": backend_info(inputs)}


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None = None) -> Tensor:
    """Exact softmax attention through torch SDPA (flash/memory-efficient kernels where available)."""
    _check_qkv(q, k, v, key_padding_mask)
    if key_padding_mask is None:
        return F.scaled_dot_product_attention(q, k, v)
    valid = ~key_padding_mask  # [B, N]
    # A fully padded row would be an all -inf softmax (NaN): let it attend everywhere, then zero it.
    attend = (valid | ~valid.any(-1, keepdim=True))[:, None, None, :]  # [B, 1, 1, N]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
    return out * valid[:, None, :, None].to(out.dtype)


def performer_attention(
    q: Tensor, k: Tensor, v: Tensor, projection: Tensor, *, key_padding_mask: Tensor | None = None
) -> Tensor:
    """RFA / Performer with positive random features (spec 3); projection: [H, S, D] (fixed at eval)."""
    _check_qkv(q, k, v, key_padding_mask)
    if projection.dim() != 3 or projection.shape[0] != q.shape[1] or projection.shape[2] != q.shape[3]:
        raise ValueError(
            f"projection must be [H, S, D] = [{q.shape[1]}, S, {q.shape[3]}], got {tuple(projection.shape)}"
        )
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32  # features in fp32 (spec 3.2)
    out = reference.performer_attention_ref(
        q.to(ct), k.to(ct), v.to(ct), projection.to(device=q.device, dtype=ct), key_padding_mask
    )
    return out.to(q.dtype)


def randomized_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    noise: Tensor | None = None,
    uniforms: Tensor | None = None,
) -> Tensor:
    """RA (spec 4), quadratic. Eval: noise=None, uniforms=None uses the deterministic mixture mean.

    noise: [B or 1, H, N, D] raw-space noise added to the per-query mean; uniforms: [B or 1, H, N] in
    [0, 1) to draw each query's key index by inverse CDF. Fixed buffers give fixed-noise eval.
    """
    _check_qkv(q, k, v, key_padding_mask)
    _check_per_head("noise", noise, q, q.shape[2], batch_one_ok=True)
    if uniforms is not None and (uniforms.dim() != 3 or tuple(uniforms.shape[1:]) != tuple(q.shape[1:3])):
        raise ValueError(
            f"uniforms must be [B or 1, H, N] = [., {q.shape[1]}, {q.shape[2]}], got {tuple(uniforms.shape)}"
        )
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = reference.randomized_attention_ref(
        q.to(ct),
        k.to(ct),
        v.to(ct),
        key_padding_mask,
        None if noise is None else noise.to(ct),
        None if uniforms is None else uniforms.to(ct),
    )
    return out.to(q.dtype)
