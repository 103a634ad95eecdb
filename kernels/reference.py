"""Plain PyTorch reference implementations: the attention spec in code.

Every function here is written for clarity, works in any floating dtype (tests run it in float64) and
follows `shared/docs/lara-spec.md` stage by stage. Faster paths (`kernels/_cpu.py`, `kernels/_triton/`)
are tested against these functions; nothing in the serving path calls them.

Conventions shared by all methods:
* q, k, v: [B, H, N, D] raw (unscaled) head-split projections.
* key_padding_mask: [B, N] bool, True marks padding. The same mask applies to queries and keys
  (self-attention): padded keys get zero weight, padded query rows are zero, and a fully padded
  sequence produces zeros, never NaN.
* "Scaled space" means x^ = d^{-1/4} x so that q^.k^ = q.k / sqrt(d) (spec section 1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# alpha is clamped before its log so negative mis-opt weights get (almost) no mass (spec 5.3).
ALPHA_FLOOR = 1e-8
# Performer constants from the reference repository (spec 3.2).
PERFORMER_EPS = 1e-4
PERFORMER_DEN_FLOOR = 1e-2


# ----------------------------------------------------------------------------- shared helpers
def log_features(w: Tensor, x: Tensor) -> Tensor:
    """log xi(x^, w^) for raw-space samples w and raw inputs x (spec section 1).

    w: [..., C, D], x: [..., N, D] -> [..., C, N]
    log xi = (w . x) / sqrt(d) - ||x||^2 / (2 sqrt(d)), i.e. w^.x^ - ||x^||^2/2 with w^ = d^{-1/4} w.
    """
    d = x.shape[-1]
    inv = 1.0 / math.sqrt(d)
    return (w @ x.transpose(-1, -2)) * inv - 0.5 * inv * (x * x).sum(-1).unsqueeze(-2)  # [..., C, N]


def _valid(mask: Tensor | None, b: int, n: int, device: torch.device) -> Tensor:
    """[B, N] bool, True for real tokens."""
    if mask is None:
        return torch.ones(b, n, dtype=torch.bool, device=device)
    return ~mask


def _masked_fill_rows(logits: Tensor, valid: Tensor) -> Tensor:
    """Mask invalid columns with -inf, except in rows with no valid column at all.

    logits: [B, H, R, N], valid: [B, N]. A row with no valid column keeps finite logits (its result is
    zeroed later by the caller) so that no NaN is ever formed (spec section 8).
    """
    v = valid[:, None, None, :]  # [B, 1, 1, N]
    any_valid = valid.any(-1)[:, None, None, None]  # [B, 1, 1, 1]
    return logits.masked_fill(~v & any_valid, float("-inf"))


def _zero_padded_queries(out: Tensor, valid: Tensor) -> Tensor:
    return out * valid[:, None, :, None].to(out.dtype)  # [B, H, N, Dv]


# ----------------------------------------------------------------------------- softmax
def softmax_attention_ref(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
    """Exact attention y_n = sum_m softmax_m(q.k_m / sqrt(d)) v_m. [B,H,N,D] -> [B,H,N,Dv]."""
    b, _, n, d = q.shape
    valid = _valid(key_padding_mask, b, n, q.device)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(d)  # [B, H, N, N]
    p = torch.softmax(_masked_fill_rows(logits, valid), dim=-1)
    return _zero_padded_queries(p @ v, valid)


# ----------------------------------------------------------------------------- RFA / Performer
def orthogonal_gaussian_projection(heads: int, features: int, dim: int, generator: torch.Generator) -> Tensor:
    """Fixed Performer projection [H, S, D]: blocks of orthogonal rows with chi-distributed norms (spec 3.2).

    Rows are orthogonal within each block of D rows; each row's norm is drawn as the norm of a D-dim
    standard Gaussian, so every row is marginally N(0, I) while blocks stay orthogonal.
    """
    blocks = []
    for _ in range(heads):
        rows = []
        for _ in range(math.ceil(features / dim)):
            g = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
            qmat, _ = torch.linalg.qr(g)
            rows.append(qmat.T)
        w = torch.cat(rows, 0)[:features]  # [S, D], orthonormal rows per block
        norms = torch.randn(features, dim, generator=generator, dtype=torch.float64).norm(dim=-1)
        blocks.append(w * norms[:, None])
    return torch.stack(blocks, 0)  # [H, S, D]


def performer_features(x: Tensor, projection: Tensor) -> Tensor:
    """Log positive random features in scaled space: W x^ - ||x^||^2/2. x [B,H,N,D], W [H,S,D] -> [B,H,N,S]."""
    d = x.shape[-1]
    xs = x * d**-0.25
    return xs @ projection.transpose(-1, -2).unsqueeze(0) - 0.5 * (xs * xs).sum(-1, keepdim=True)


def performer_attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    projection: Tensor,
    key_padding_mask: Tensor | None = None,
    eps: float = PERFORMER_EPS,
    den_floor: float = PERFORMER_DEN_FLOOR,
) -> Tensor:
    """RFA with positive features (spec 3.3). projection: [H, S, D] scaled-space samples.

    Stabilizers (a per-query max; one max per (batch, head) over valid keys) cancel in the ratio
    except through eps, exactly as in the reference repository. eps=0, den_floor=0 gives the plain
    estimator of spec 3.1.
    """
    b, _, n, _ = q.shape
    valid = _valid(key_padding_mask, b, n, q.device)
    lq = performer_features(q, projection)  # [B, H, N, S]
    lk = performer_features(k, projection)  # [B, H, N, S]
    vk = valid[:, None, :, None]  # [B, 1, N, 1]
    lk = lk.masked_fill(~vk, float("-inf"))
    fq = torch.exp(lq - lq.amax(-1, keepdim=True)) + eps
    kmax = lk.amax(dim=(-1, -2), keepdim=True)  # [B, H, 1, 1]
    kmax = torch.where(torch.isfinite(kmax), kmax, torch.zeros_like(kmax))
    fk = (torch.exp(lk - kmax) + eps) * vk.to(lk.dtype)  # padded keys: feature 0
    kv = fk.transpose(-1, -2) @ v  # [B, H, S, Dv]
    z = fk.sum(-2)  # [B, H, S]
    num = fq @ kv  # [B, H, N, Dv]
    den = (fq * z.unsqueeze(-2)).sum(-1, keepdim=True)  # [B, H, N, 1]
    out = num / den.clamp_min(den_floor) if den_floor > 0 else num / den
    return _zero_padded_queries(torch.nan_to_num(out), valid)


# ----------------------------------------------------------------------------- RA
def ra_proposal_mean(q: Tensor, k: Tensor, valid: Tensor, uniforms: Tensor | None) -> Tensor:
    """Per-query proposal mean mu_n in raw space (spec 4.2).

    uniforms None: deterministic mixture mean q_n + sum_m pi_nm k_m.
    uniforms [B or 1, H, N] in [0,1): draw j_n ~ pi_n by inverse CDF, mu_n = q_n + k_{j_n}.
    """
    d = q.shape[-1]
    pi = torch.softmax(_masked_fill_rows((q @ k.transpose(-1, -2)) / math.sqrt(d), valid), -1)  # [B,H,N,N]
    if uniforms is None:
        return q + pi @ k
    cdf = pi.cumsum(-1)  # [B, H, N, N]
    j = torch.searchsorted(cdf, uniforms.to(cdf.dtype).expand(q.shape[:-1]).unsqueeze(-1).contiguous())
    j = j.squeeze(-1).clamp_max(k.shape[-2] - 1)  # [B, H, N]
    return q + torch.gather(k, -2, j.unsqueeze(-1).expand(-1, -1, -1, d))


def randomized_attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None = None,
    noise: Tensor | None = None,
    uniforms: Tensor | None = None,
) -> Tensor:
    """RA, one sample per query (spec 4.3): w_n = mu_n + noise_n; y_n = softmax_m(log xi(k_m, w_n)) v.

    noise: [B or 1, H, N, D] raw-space perturbation (None = eval, no noise). For the unbiased estimator
    of spec 4.1 pass d^{1/4} * N(0, I) ("exact" scale); the reference repo used N(0, I) ("repo" scale).
    """
    b, _, n, _ = q.shape
    valid = _valid(key_padding_mask, b, n, q.device)
    w = ra_proposal_mean(q, k, valid, uniforms)  # [B, H, N, D]
    if noise is not None:
        w = w + noise
    p = torch.softmax(_masked_fill_rows(log_features(w, k), valid), -1)  # [B, H, N, N]
    return _zero_padded_queries(p @ v, valid)


# ----------------------------------------------------------------------------- LARA (spec 5.3-5.4)
def lara_samples(q_landmarks: Tensor, k_landmarks: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor]:
    """Proposal means mu_c = q~_c + k~_c and samples w_c = mu_c (+ noise). Both [B, H, C, D] raw."""
    mu = q_landmarks + k_landmarks
    return mu, (mu if noise is None else mu + noise)


def lara_key_summaries(w: Tensor, k: Tensor, v: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """F_c = f(w_c) = sum_m softmax_m(log xi(k_m, w_c)) v_m and lse_c = log sum_m xi(k_m, w_c).

    Returns F [B, H, C, Dv] and lse [B, H, C]. Query independent: computed once per sample.
    """
    lk = _masked_fill_rows(log_features(w, k), valid)  # [B, H, C, N]
    return torch.softmax(lk, -1) @ v, torch.logsumexp(lk, -1)


def lara_balance_heuristic(w: Tensor, mu: Tensor) -> tuple[Tensor, Tensor]:
    """BH_c = g_c(w_c) / sum_c' g_c'(w_c) and log g_c(w_c) up to a constant shared by all c'.

    log N(w; mu', I) = log xi(mu'^, w^) - ||w^||^2/2 + const; the last terms cancel in BH and in
    the SNIS weights, so log xi stands in for the density. Returns BH [B,H,C] and logq_own [B,H,C].
    """
    lmu = log_features(w, mu)  # [B, H, C(sample), C(proposal)]
    own = lmu.diagonal(dim1=-2, dim2=-1)  # [B, H, C]
    return torch.exp(own - torch.logsumexp(lmu, -1)), own


def lara_query_responsibility(q_landmarks: Tensor, q: Tensor, valid: Tensor) -> Tensor:
    """rho_nc = softmax over VALID queries n of q~_c . q_n / sqrt(d). [B, H, C, N]."""
    d = q.shape[-1]
    logits = (q_landmarks @ q.transpose(-1, -2)) / math.sqrt(d)  # [B, H, C, N]
    return torch.softmax(_masked_fill_rows(logits, valid), -1)


def lara_mis_weights(bh: Tensor, rho: Tensor, alpha_coeff: float) -> Tensor:
    """mis-opt weighting alpha_nc = BH_c + lambda (rho_nc - mean_c' rho_nc'), clamped >= 1e-8. [B,H,C,N]."""
    alpha = bh.unsqueeze(-1) + alpha_coeff * (rho - rho.mean(-2, keepdim=True))
    return alpha.clamp_min(ALPHA_FLOOR)


def lara_attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_landmarks: Tensor,
    k_landmarks: Tensor,
    key_padding_mask: Tensor | None = None,
    alpha_coeff: float = 1.0,
    noise: Tensor | None = None,
) -> Tensor:
    """LARA, one sample per proposal, mis-opt weights, SNIS over samples (spec 5.4).

    q, k, v: [B, H, N, D]; q_landmarks, k_landmarks: [B, H, C, D]; noise: [B or 1, H, C, D] raw-space
    perturbation of the proposal means (None = eval, w_c = mu_c). Returns [B, H, N, Dv].
    """
    b, _, n, _ = q.shape
    valid = _valid(key_padding_mask, b, n, q.device)
    mu, w = lara_samples(q_landmarks, k_landmarks, noise)  # [B, H, C, D]
    f, lse = lara_key_summaries(w, k, v, valid)  # [B, H, C, Dv], [B, H, C]
    bh, own = lara_balance_heuristic(w, mu)  # [B, H, C]
    rho = lara_query_responsibility(q_landmarks, q, valid)  # [B, H, C, N]
    alpha = lara_mis_weights(bh, rho, alpha_coeff)  # [B, H, C, N]
    # log r_nc = log xi(q_n, w_c) + lse_c - log g_c(w_c): the target/proposal importance ratio
    log_r = log_features(w, q) + (lse - own).unsqueeze(-1)  # [B, H, C, N]
    weights = torch.softmax(torch.log(alpha) + log_r, dim=-2)  # [B, H, C, N], sums to 1 over C
    out = weights.transpose(-1, -2) @ f  # [B, H, N, Dv]
    return _zero_padded_queries(out, valid)
