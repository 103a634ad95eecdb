"""LARA on the CPU in plain PyTorch, restructured for speed (any device; differentiable).

Same math as `reference.lara_attention_ref`; the differences are algebraic and exact:
* The -||q||^2/(2 sqrt d) term of log xi(q_n, w_c) is constant over c and cancels in the softmax over
  samples, so it is never formed.
* softmax_c(log alpha + log r) is computed as alpha * exp(log r - max) / sum: one exp, no log.
* The two query-side products (samples and query landmarks against q) are one matmul.
* Work is done per block of queries, so the [C, N] temporaries of the query pass never exceed
  [C, block]: extra memory is O(C * N) for the key pass and O(C * block) for the query pass.
Computation runs in float32 (or float64 for float64 inputs) and the result is cast back.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernels.reference import ALPHA_FLOOR

# Queries per block in the query pass; 2048 x 64 proposals x 4 B = 512 KiB per temporary, L2-sized.
QUERY_BLOCK = 2048


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def lara_forward_cpu(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_landmarks: Tensor,
    k_landmarks: Tensor,
    key_padding_mask: Tensor | None,
    alpha_coeff: float,
    noise: Tensor | None,
    query_block: int = QUERY_BLOCK,
) -> Tensor:
    """LARA forward. Shapes as in `kernels.lara_attention`; returns [B, H, N, Dv] in q's dtype."""
    out_dtype = q.dtype
    ct = _compute_dtype(q.dtype)
    q, k, v, ql, kl = (t.to(ct) for t in (q, k, v, q_landmarks, k_landmarks))
    b, h, n, d = q.shape
    c = ql.shape[-2]
    scale = 1.0 / math.sqrt(d)

    mu = ql + kl  # [B, H, C, D]
    w = mu if noise is None else mu + noise.to(ct)
    ws = w * scale  # [B, H, C, D]

    # -- key pass: value summaries F_c and log-normalizers lse_c --
    lk = ws @ k.transpose(-1, -2) - (0.5 * scale) * (k * k).sum(-1).unsqueeze(-2)  # [B, H, C, N]
    valid = None
    if key_padding_mask is not None:
        valid = ~key_padding_mask  # [B, N]
        any_valid = valid.any(-1)[:, None, None, None]  # [B, 1, 1, 1]
        lk = lk.masked_fill(~valid[:, None, None, :] & any_valid, float("-inf"))
    m = lk.amax(-1, keepdim=True)  # [B, H, C, 1]
    p = torch.exp(lk - m)  # [B, H, C, N]
    s = p.sum(-1, keepdim=True)  # [B, H, C, 1]
    f = (p @ v) / s  # [B, H, C, Dv]
    lse = m.squeeze(-1) + torch.log(s.squeeze(-1))  # [B, H, C]

    # -- balance heuristic over proposals --
    lmu = ws @ mu.transpose(-1, -2) - (0.5 * scale) * (mu * mu).sum(-1).unsqueeze(-2)  # [B, H, C, C]
    own = lmu.diagonal(dim1=-2, dim2=-1)  # [B, H, C]
    bh = torch.exp(own - torch.logsumexp(lmu, -1)).unsqueeze(-1)  # [B, H, C, 1]
    bias = (lse - own).unsqueeze(-1)  # [B, H, C, 1]

    # -- query pass --
    proj = torch.cat([ws, ql * scale], dim=-2)  # [B, H, 2C, D]
    # rho is a softmax over all valid queries: its normalizer needs one pass over every query first.
    r = ql @ (q.transpose(-1, -2) * scale)  # [B, H, C, N]
    if valid is not None:
        r = r.masked_fill(~valid[:, None, None, :] & any_valid, float("-inf"))
    r_max = r.amax(-1, keepdim=True)  # [B, H, C, 1]
    r_lse = r_max + torch.log(torch.exp(r - r_max).sum(-1, keepdim=True))  # [B, H, C, 1]
    del r

    outs = []
    for start in range(0, n, query_block):
        qb = q[:, :, start : start + query_block]  # [B, H, n_b, D]
        lr = proj @ qb.transpose(-1, -2)  # [B, H, 2C, n_b]
        lq, rb = lr[:, :, :c], lr[:, :, c:]
        if valid is not None:
            rb = rb.masked_fill(~valid[:, None, None, start : start + query_block] & any_valid, float("-inf"))
        rho = torch.exp(rb - r_lse)  # [B, H, C, n_b]
        alpha = (bh + alpha_coeff * (rho - rho.mean(-2, keepdim=True))).clamp_min(ALPHA_FLOOR)
        logit = lq + bias  # [B, H, C, n_b]
        e = torch.exp(logit - logit.amax(-2, keepdim=True)) * alpha  # [B, H, C, n_b]
        wt = e / e.sum(-2, keepdim=True)  # [B, H, C, n_b], SNIS weights
        outs.append(wt.transpose(-1, -2) @ f)  # [B, H, n_b, Dv]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)
    if valid is not None:
        out = out * valid[:, None, :, None].to(ct)
    return out.to(out_dtype)
