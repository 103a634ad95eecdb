"""Input factories for the kernel tests."""

from __future__ import annotations

import torch
from torch import Tensor


def make_inputs(
    b: int,
    h: int,
    n: int,
    d: int,
    c: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    scale: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Unit-normal q, k, v [B,H,N,D] and landmarks [B,H,C,D] (scaled by 0.5, like LayerNorm'd pools)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) * scale for _ in range(3))
    ql, kl = (torch.randn(b, h, c, d, generator=g, dtype=torch.float64) * 0.5 for _ in range(2))
    return tuple(t.to(dtype) for t in (q, k, v, ql, kl))  # type: ignore[return-value]


def tail_padding(lengths: list[int], n: int) -> Tensor:
    """[B, N] bool mask, True after each sequence's length."""
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]
