"""LARA in plain PyTorch, restructured for speed (any device; the CPU backend).

Same math as `reference.lara_attention_ref`; the differences are algebraic and exact:
* The -||q||^2/(2 sqrt d) term of log xi(q_n, w_c) is constant over c and cancels in the softmax over
  samples, so it is never formed.
* softmax_c(log alpha + log r) is computed as alpha * exp(log r - max) / sum: one exp, no log.
* The two query-side products (samples and query landmarks against q) are one matmul.
* The query pass runs in blocks of queries, so its [C, block] temporaries stay cache-sized and the
  extra memory is O(C * N) overall (the key pass holds one [C, N] tensor), never O(N^2).

Two variants share the stages: an inference variant that works in place (no autograd; used by the
op), and a functional variant that autograd can differentiate (eager training, the op's backward).
Computation runs in float32 (float64 for float64 inputs); the result is cast back.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lara_serve.kernels.inputs import LaraInputs
from lara_serve.kernels.reference import ALPHA_FLOOR

# Queries per block: 512 queries x 2C=128 rows x 4 B = 256 KiB of logits per (batch, head), L2-sized.
QUERY_BLOCK = 512


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _mask_value(valid: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """(~valid, rows that have any valid token): masked columns of all-padded rows stay finite (no NaN)."""
    if valid is None:
        return None
    return ~valid[:, None, None, :], valid.any(-1)[:, None, None, None]  # [B,1,1,N], [B,1,1,1]


def _masked(x: Tensor, masks: tuple[Tensor, Tensor] | None, cols: slice = slice(None)) -> Tensor:
    if masks is None:
        return x
    pad, any_valid = masks
    return x.masked_fill(pad[..., cols] & any_valid, float("-inf"))


def _proposal_terms(mu: Tensor, w: Tensor, lse: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Balance heuristic BH_c [B,H,C,1] and the per-sample log-ratio bias lse_c - log g_c(w_c) [B,H,C,1]."""
    lmu = (w * scale) @ mu.transpose(-1, -2) - (0.5 * scale) * (mu * mu).sum(-1).unsqueeze(-2)  # [B, H, C, C]
    own = lmu.diagonal(dim1=-2, dim2=-1)  # [B, H, C]
    bh = torch.exp(own - torch.logsumexp(lmu, -1)).unsqueeze(-1)
    return bh, (lse - own).unsqueeze(-1)


def _query_normalizer(ql: Tensor, q: Tensor, masks, scale: float) -> Tensor:
    """log sum over valid queries of exp(q~_c . q_n / sqrt d): rho's denominator, [B, H, C, 1]."""
    r = _masked(ql @ (q.transpose(-1, -2) * scale), masks)  # [B, H, C, N]
    return torch.logsumexp(r, -1, keepdim=True)


def _lara_functional(q, k, v, ql, kl, valid, alpha_coeff, noise, query_block) -> Tensor:
    """Differentiable variant (no in-place ops)."""
    n, d = q.shape[-2:]
    c = ql.shape[-2]
    scale = 1.0 / math.sqrt(d)
    masks = _mask_value(valid)
    mu = ql + kl  # [B, H, C, D]
    w = mu if noise is None else mu + noise

    # -- key pass: value summaries F_c and log-normalizers lse_c --
    lk = _masked((w * scale) @ k.transpose(-1, -2) - (0.5 * scale) * (k * k).sum(-1).unsqueeze(-2), masks)
    lse = torch.logsumexp(lk, -1)  # [B, H, C]
    f = torch.exp(lk - lse.unsqueeze(-1)) @ v  # [B, H, C, Dv]
    bh, bias = _proposal_terms(mu, w, lse, scale)
    r_lse = _query_normalizer(ql, q, masks, scale)

    # -- query pass --
    proj = torch.cat([w, ql], dim=-2) * scale  # [B, H, 2C, D]
    outs = []
    for start in range(0, n, query_block):
        cols = slice(start, start + query_block)
        lr = proj @ q[:, :, cols].transpose(-1, -2)  # [B, H, 2C, n_b]
        rho = torch.exp(_masked(lr[:, :, c:], masks, cols) - r_lse)  # [B, H, C, n_b]
        alpha = (bh + alpha_coeff * (rho - rho.mean(-2, keepdim=True))).clamp_min(ALPHA_FLOOR)
        logit = lr[:, :, :c] + bias  # [B, H, C, n_b]
        e = torch.exp(logit - logit.amax(-2, keepdim=True)) * alpha
        outs.append((e / e.sum(-2, keepdim=True)).transpose(-1, -2) @ f)  # [B, H, n_b, Dv]
    return torch.cat(outs, dim=-2)


@torch.no_grad()
def _lara_inplace(q, k, v, ql, kl, valid, alpha_coeff, noise, query_block) -> Tensor:
    """Inference variant: the same stages with in-place elementwise work on cache-sized blocks."""
    b, h, n, d = q.shape
    c = ql.shape[-2]
    scale = 1.0 / math.sqrt(d)
    masks = _mask_value(valid)
    mu = ql + kl  # [B, H, C, D]
    w = mu if noise is None else mu + noise

    # -- key pass --
    k_sq = (k * k).sum(-1).mul_(-0.5 * scale).unsqueeze(-2)  # [B, H, 1, N]
    lk = _masked(torch.matmul(w * scale, k.transpose(-1, -2)).add_(k_sq), masks)  # [B, H, C, N]
    m = lk.amax(-1, keepdim=True)
    p = lk.sub_(m).exp_()
    s = p.sum(-1, keepdim=True)  # [B, H, C, 1]
    f = torch.matmul(p, v).div_(s)  # [B, H, C, Dv]
    lse = (m + s.log()).squeeze(-1)
    del lk, p
    bh, bias = _proposal_terms(mu, w, lse, scale)
    r_lse = _query_normalizer(ql, q, masks, scale)

    # -- query pass, one cache-sized block at a time --
    proj = torch.cat([w, ql], dim=-2).mul_(scale)  # [B, H, 2C, D]
    out = torch.empty(b, h, n, v.shape[-1], dtype=q.dtype, device=q.device)
    for start in range(0, n, query_block):
        cols = slice(start, start + query_block)
        lr = torch.matmul(proj, q[:, :, cols].transpose(-1, -2))  # [B, H, 2C, n_b]
        lq, rho = lr[:, :, :c], _masked(lr[:, :, c:], masks, cols)
        rho = rho.sub_(r_lse).exp_()  # [B, H, C, n_b]
        shift = rho.mean(-2, keepdim=True).mul_(alpha_coeff)  # [B, H, 1, n_b]
        alpha = rho.mul_(alpha_coeff).add_(bh).sub_(shift).clamp_min_(ALPHA_FLOOR)
        lq.add_(bias)
        e = lq.sub_(lq.amax(-2, keepdim=True)).exp_().mul_(alpha)  # [B, H, C, n_b]
        total = e.sum(-2).unsqueeze(-1)  # [B, H, n_b, 1]
        block = out[:, :, cols]
        torch.matmul(e.transpose(-1, -2), f, out=block)
        block.div_(total)
    return out


def lara_forward_cpu(inputs: LaraInputs, query_block: int = QUERY_BLOCK) -> Tensor:
    """LARA forward. Shapes as in `lara_serve.kernels.inputs`; returns [B, H, N, Dv] in q's dtype."""
    q, k, v, q_landmarks, k_landmarks, key_padding_mask, alpha_coeff, noise = inputs.as_args()
    out_dtype = q.dtype
    ct = _compute_dtype(q.dtype)
    args = [t.to(ct) for t in (q, k, v, q_landmarks, k_landmarks)]
    nz = None if noise is None else noise.to(ct)
    valid = None if key_padding_mask is None else ~key_padding_mask  # [B, N]
    differentiable = torch.is_grad_enabled() and any(t.requires_grad for t in args)
    impl = _lara_functional if differentiable else _lara_inplace
    out = impl(*args, valid, alpha_coeff, nz, query_block)
    if valid is not None:
        out = out * valid[:, None, :, None].to(ct)  # padded query rows are zero
    return out.to(out_dtype)
