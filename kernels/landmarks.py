"""Proposal landmarks (spec 5.2): 1-D chunk means over valid tokens, 2-D adaptive pooling over grids."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def chunk_assignment(valid: Tensor, num_landmarks: int, min_chunk: int = 1) -> Tensor:
    """Row-normalized chunk membership [B, C, N] over the VALID tokens of each sequence.

    valid: [B, N] bool. A sequence with n valid tokens is cut into C contiguous chunks of its valid
    tokens, chunk c holding ranks [floor(c n / C), floor((c+1) n / C)). When n < C that range can be
    empty; it then holds the single token of rank floor(c n / C), so every landmark is a real token
    (the spec's "C_eff = N" case, with tokens repeated to keep C fixed across a batch). Padding never
    enters a chunk and never shifts chunk boundaries, so landmarks do not depend on padding.

    min_chunk M > 1: a sequence shorter than C * M is cut into k = max(1, n // M) chunks of at least M
    tokens, landmark c the mean of chunk floor(c k / C) (repeated to keep C). Why: an encoder converted on
    long windows learned landmarks that are means of several tokens; single-token landmarks of a short text
    are another distribution (research/minilm_short_landmarks.py). M = 1 is the rule above exactly, and at
    n >= C * M nothing changes.
    """
    if min_chunk < 1:
        raise ValueError(f"min_chunk must be >= 1, got {min_chunk}")
    b, n = valid.shape
    c = num_landmarks
    n_valid = valid.sum(-1, keepdim=True)  # [B, 1]
    rank = valid.long().cumsum(-1) - 1  # [B, N], rank among valid tokens
    idx = torch.arange(c, device=valid.device)
    if min_chunk == 1:  # the spec's rule, as every model before min_chunk was exported (the same graph, op for op)
        start = (idx[None, :] * n_valid) // c  # [B, C]
        end = torch.maximum(((idx[None, :] + 1) * n_valid) // c, start + 1)  # [B, C]
    else:
        k = torch.clamp(n_valid // min_chunk, min=1, max=c)  # [B, 1]: distinct chunks
        chunk = (idx[None, :] * k) // c  # [B, C]: each landmark's chunk
        start = (chunk * n_valid) // k  # [B, C]
        end = torch.maximum(((chunk + 1) * n_valid) // k, start + 1)  # [B, C]
    r = rank[:, None, :]  # [B, 1, N]
    member = (r >= start[:, :, None]) & (r < end[:, :, None]) & valid[:, None, :]  # [B, C, N]
    weights = member.to(torch.float32)
    return weights / weights.sum(-1, keepdim=True).clamp_min(1.0)


def chunk_means_1d(x: Tensor, num_landmarks: int, key_padding_mask: Tensor | None = None, min_chunk: int = 1) -> Tensor:
    """Landmarks of a 1-D sequence: x [B, H, N, D] -> [B, H, C, D] chunk means over valid tokens
    (chunk_assignment; min_chunk tokens at least per chunk)."""
    if x.dim() != 4:
        raise ValueError(f"x must be [B, H, N, D], got shape {tuple(x.shape)}")
    if num_landmarks < 1:
        raise ValueError(f"num_landmarks must be >= 1, got {num_landmarks}")
    b, _, n, _ = x.shape
    valid = torch.ones(b, n, dtype=torch.bool, device=x.device) if key_padding_mask is None else ~key_padding_mask
    if key_padding_mask is None or not x.is_cpu or tracing():
        a = chunk_assignment(valid, num_landmarks, min_chunk).to(x.dtype)  # [B, C, N]
        return a.unsqueeze(1) @ x  # [B, H, C, D]
    # Eager on CPU with padding: one sequence at a time over its own valid tokens. The batched product reduces
    # over the padded length N, and a matmul's summation order depends on N, so a sequence's landmarks
    # (and through them every later layer) would round differently alone and in a batch (~4e-7).
    counts = valid.sum(-1).tolist()
    weights: dict[int, Tensor] = {}  # chunk weights [1, 1, C, n] per distinct length
    out = []
    for i, n in enumerate(counts):
        # [1, H, n, D] contiguous: the same values and layout as the sequence alone and unpadded
        # (a slice when the padding is on the right, the common case; else a gather of the valid tokens).
        own = x[i : i + 1, :, :n].contiguous() if bool(valid[i, :n].all()) else x[i : i + 1][:, :, valid[i]]
        if n not in weights:
            ones = torch.ones(1, n, dtype=torch.bool, device=x.device)
            weights[n] = chunk_assignment(ones, num_landmarks, min_chunk).to(x.dtype).unsqueeze(1)
        out.append(weights[n] @ own)
    return torch.cat(out)


def tracing() -> bool:
    """True while torch.export / ONNX export / jit tracing records the graph (loops over the batch would
    be unrolled to the example's batch size there, so callers keep the batched form)."""
    return torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def pool_2d(x: Tensor, grid: tuple[int, int], num_landmarks: int) -> Tensor:
    """Landmarks of an image token grid: x [B, H, gh*gw, D] -> [B, H, C, D] by adaptive average pooling.

    C must be a perfect square; the grid is pooled to sqrt(C) x sqrt(C) cells (spec 5.2, `pool`).
    """
    side = math.isqrt(num_landmarks)
    if side * side != num_landmarks or num_landmarks < 1:
        raise ValueError(f"2-D pooling needs a perfect-square num_landmarks (e.g. 49, 64), got {num_landmarks}")
    b, h, n, d = x.shape
    gh, gw = grid
    if gh * gw != n:
        raise ValueError(f"grid {grid} has {gh * gw} cells but x has {n} tokens")
    g = x.reshape(b * h, gh, gw, d).permute(0, 3, 1, 2)  # [B*H, D, gh, gw]
    p = F.adaptive_avg_pool2d(g, (side, side))  # [B*H, D, s, s]
    return p.flatten(2).transpose(1, 2).reshape(b, h, num_landmarks, d)
