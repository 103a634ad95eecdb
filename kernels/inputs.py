"""`LaraInputs`: the arguments of one LARA forward, in one place for every backend.

Each backend's forward (`kernels/_cpu.py`, `kernels/_cpu_fused.py`, `kernels/_triton/lara.py`) takes one
`LaraInputs` instead of restating the eight arguments, as xformers' fmha backends take one `Inputs`.
Shapes: q, k, v [B, H, N, D] (v may have its own Dv); q_landmarks, k_landmarks [B, H, C, D];
key_padding_mask [B, N] bool (True = padding) or None; noise [B or 1, H, C, D] raw-space or None.
`lara_serve.kernels.api.lara_attention` validates them; this module imports no backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class LaraInputs:
    """The validated arguments of one LARA call (see `lara_serve.kernels.lara_attention`)."""

    q: Tensor
    k: Tensor
    v: Tensor
    q_landmarks: Tensor
    k_landmarks: Tensor
    key_padding_mask: Tensor | None
    alpha_coeff: float
    noise: Tensor | None

    def as_args(self) -> tuple:
        """The fields in declaration order: q, k, v, q_landmarks, k_landmarks, key_padding_mask, alpha_coeff, noise."""
        return (
            self.q,
            self.k,
            self.v,
            self.q_landmarks,
            self.k_landmarks,
            self.key_padding_mask,
            self.alpha_coeff,
            self.noise,
        )

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]

    @property
    def num_landmarks(self) -> int:
        return self.q_landmarks.shape[-2]


def unit_last_stride(t: Tensor) -> Tensor:
    """`t` itself when its last dim is contiguous, else a contiguous copy: the compiled and Triton kernels
    take any strides over (B, H, N), e.g. views of one fused qkv projection, but need the head dim dense."""
    return t if t.stride(-1) == 1 else t.contiguous()
