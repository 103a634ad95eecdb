"""Fused Triton kernels for the LARA forward (eval and fixed-noise modes; spec 5.3-5.4).

Same math as `lara_serve.kernels.reference.lara_attention_ref`, with the exact algebra of `kernels/_cpu.py`:
the -||q||^2/(2 sqrt d) term of log xi(q_n, w_c) cancels in the softmax over samples and is never
formed, and softmax_c(log alpha + log r) is computed as alpha * exp(log r - max) / sum (no log).
Every log-space quantity inside the kernels is in base 2 (natural log times log2(e)), so that each
exponential is one exp2: the samples and query landmarks are pre-scaled by log2(e) / sqrt(d).

Three launches per call:
1. `_lara_keys_kernel`, grid (splits of N, blocks of C, B*H): one pass over a slice of the keys with
   an online softmax (running max / sum) producing partial value summaries F_c and their log
   normalizers; the same pass reads the queries of the slice for the normalizer of rho (a softmax over
   valid queries of q~_c . q_n / sqrt(d)). Splitting N keeps a GPU full when B*H is small.
2. `_lara_combine_kernel`, grid (blocks of C, B*H): merges the split partials into F_c, lse_c and the
   rho normalizer; computes the balance heuristic BH_c and log g_c(w_c) over all C proposals (C x C).
3. `_lara_queries_kernel`, grid (blocks of N, B*H): one pass over queries computing the mis-opt weights
   alpha, the SNIS weights over the C samples (online over blocks of C) and the output W^T F.

Samples w_c = q~_c + k~_c (+ noise_c) are recomputed from the landmarks inside each kernel (a [C, D]
load) instead of being written by a separate launch. Statistics, F and all accumulation are fp32.
Matmul operands: q, k, v keep their dtype (fp16 / bf16 tensor cores, fp32 accumulation); the samples
are rounded to that dtype for the logit products, as flash attention rounds its scaled queries. The
output product uses tf32 so that the weights keep fp32's exponent range (small SNIS weights would
underflow in fp16) and F is not rounded to 16 bits. fp32 inputs, and the C x C products of the balance
heuristic, use "tf32x3" (three tf32 products: about fp32 accuracy on tensor cores; Triton's "ieee"
products run on FMA units and spill heavily at these tile sizes, as seen in sm_90 builds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from lara_serve.kernels.inputs import LaraInputs, unit_last_stride
from lara_serve.kernels.reference import ALPHA_FLOOR

LOG2E = 1.4426950408889634  # log2(e): natural-log quantities times this are base-2


# ----------------------------------------------------------------------------- shared device helpers
@triton.jit
def _load_samples(QL, KL, NOISE, lm_off, noise_off, c_idx, d_idx, C, D: tl.constexpr, HAS_NOISE: tl.constexpr):
    """Samples and landmarks of proposals c_idx: (w_c, q~_c, mu_c) fp32 [BLOCK_C, D], raw space.

    Rows c >= C load as zero; callers mask them.
    """
    offs = c_idx[:, None] * D + d_idx[None, :]  # [BLOCK_C, D]
    cm = (c_idx < C)[:, None]
    ql = tl.load(QL + lm_off + offs, mask=cm, other=0.0).to(tl.float32)
    kl = tl.load(KL + lm_off + offs, mask=cm, other=0.0).to(tl.float32)
    mu = ql + kl  # proposal means (spec 5.2)
    w = mu
    if HAS_NOISE:
        w = mu + tl.load(NOISE + noise_off + offs, mask=cm, other=0.0).to(tl.float32)
    return w, ql, mu


@triton.jit
def _batch_head(AXIS: tl.constexpr, H):
    """This program's index on the grid axis AXIS, which runs over B*H, and its (b, h); b in int64, as
    b * stride may pass 2^31 for large batches."""
    pid_bh = tl.program_id(AXIS)
    return pid_bh, (pid_bh // H).to(tl.int64), pid_bh % H


@triton.jit
def _valid_rows(MASK, b, n_idx, N, HAS_MASK: tl.constexpr):
    """[BLOCK_N] bool: inside the sequence and not padding."""
    inside = n_idx < N
    if HAS_MASK:
        pad = tl.load(MASK + b * N + n_idx, mask=inside, other=1)
        inside = inside & (pad == 0)
    return inside


# ----------------------------------------------------------------------------- kernel 1: keys
@triton.jit
def _lara_keys_kernel(
    Q, K, V, QL, KL, NOISE, MASK,
    PART_M, PART_L, PART_ACC, PART_RM, PART_RL,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_noise_b,
    H, N, C, keys_per_split, num_splits, qk_scale2,
    D: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_NOISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid_s = tl.program_id(0)
    pid_c = tl.program_id(1)
    pid_bh, b, h = _batch_head(2, H)
    c_idx = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    d_idx = tl.arange(0, D)
    op_dtype = K.dtype.element_ty

    # -- samples and query landmarks of this block of proposals, base-2 scaled --
    lm_off = pid_bh * C * D
    noise_off = b * stride_noise_b + h * C * D
    w, ql, _ = _load_samples(QL, KL, NOISE, lm_off, noise_off, c_idx, d_idx, C, D, HAS_NOISE)
    ws2 = (w * qk_scale2).to(op_dtype)  # [BLOCK_C, D]
    qls2 = (ql * qk_scale2).to(op_dtype)  # [BLOCK_C, D]

    m_i = tl.full([BLOCK_C], float("-inf"), tl.float32)  # running max of key log-features
    l_i = tl.zeros([BLOCK_C], tl.float32)  # running sum of exp2(feature - m_i)
    acc = tl.zeros([BLOCK_C, D], tl.float32)  # running sum of exp2(feature - m_i) * v
    rm_i = tl.full([BLOCK_C], float("-inf"), tl.float32)  # same two for the rho normalizer
    rl_i = tl.zeros([BLOCK_C], tl.float32)

    n_start = pid_s * keys_per_split
    n_end = tl.minimum(n_start + keys_per_split, N)
    for n0 in range(n_start, n_end, BLOCK_N):
        n_idx = n0 + tl.arange(0, BLOCK_N)
        inside = n_idx < n_end
        # padded rows load as zero: whatever a batcher left there (even inf/NaN) never enters a product
        valid = _valid_rows(MASK, b, n_idx, N, HAS_MASK) & inside

        # -- log xi(k_m, w_c) = w^.k^ - ||k^||^2/2, masked; online softmax over keys --
        k = tl.load(K + b * stride_kb + h * stride_kh + n_idx[:, None] * stride_kn + d_idx[None, :],
                    mask=valid[:, None], other=0.0)  # fmt: skip
        kf = k.to(tl.float32)
        k_sq = tl.sum(kf * kf, axis=1)  # [BLOCK_N]
        s = tl.dot(ws2, tl.trans(k), input_precision=DOT_PRECISION) - (0.5 * qk_scale2) * k_sq[None, :]
        s = tl.where(valid[None, :], s, float("-inf"))  # [BLOCK_C, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all keys so far padded: no NaN
        p = tl.exp2(s - m_use[:, None])
        corr = tl.exp2(m_i - m_use)
        l_i = l_i * corr + tl.sum(p, axis=1)
        v = tl.load(V + b * stride_vb + h * stride_vh + n_idx[:, None] * stride_vn + d_idx[None, :],
                    mask=valid[:, None], other=0.0)  # fmt: skip
        acc = acc * corr[:, None] + tl.dot(p.to(op_dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

        # -- rho normalizer: log-sum-exp over valid queries of q~_c . q_n / sqrt(d) --
        q = tl.load(Q + b * stride_qb + h * stride_qh + n_idx[:, None] * stride_qn + d_idx[None, :],
                    mask=valid[:, None], other=0.0)  # fmt: skip
        r = tl.dot(qls2, tl.trans(q), input_precision=DOT_PRECISION)
        r = tl.where(valid[None, :], r, float("-inf"))  # [BLOCK_C, BLOCK_N]
        rm_new = tl.maximum(rm_i, tl.max(r, axis=1))
        rm_use = tl.where(rm_new == float("-inf"), 0.0, rm_new)
        rl_i = rl_i * tl.exp2(rm_i - rm_use) + tl.sum(tl.exp2(r - rm_use[:, None]), axis=1)
        rm_i = rm_new

    # epilogue: partial statistics of this split, [B*H, splits, C] and [B*H, splits, C, D]
    cm = c_idx < C
    row = (pid_bh * num_splits + pid_s) * C + c_idx
    tl.store(PART_M + row, m_i, mask=cm)
    tl.store(PART_L + row, l_i, mask=cm)
    tl.store(PART_RM + row, rm_i, mask=cm)
    tl.store(PART_RL + row, rl_i, mask=cm)
    tl.store(PART_ACC + row[:, None] * D + d_idx[None, :], acc, mask=cm[:, None])


# ----------------------------------------------------------------------------- kernel 2: combine + BH
@triton.jit
def _lara_combine_kernel(
    QL, KL, NOISE,
    PART_M, PART_L, PART_ACC, PART_RM, PART_RL,
    F, BIAS, RLSE, BH,
    stride_noise_b, H, C, num_splits, qk_scale2,
    D: tl.constexpr, BLOCK_C: tl.constexpr, HAS_NOISE: tl.constexpr,
):  # fmt: skip
    pid_c = tl.program_id(0)
    pid_bh, b, h = _batch_head(1, H)
    c_idx = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    d_idx = tl.arange(0, D)
    cm = c_idx < C
    lm_off = pid_bh * C * D

    # -- balance heuristic: log g_c'(w_c) = w^_c.mu^_c' - ||mu^_c'||^2/2 (base 2), softmax over c' --
    noise_off = b * stride_noise_b + h * C * D
    w, _, mu = _load_samples(QL, KL, NOISE, lm_off, noise_off, c_idx, d_idx, C, D, HAS_NOISE)
    ws2 = w * qk_scale2  # [BLOCK_C, D]
    own = tl.sum(ws2 * mu, axis=1) - (0.5 * qk_scale2) * tl.sum(mu * mu, axis=1)  # log2 g_c(w_c)
    g_max = tl.full([BLOCK_C], float("-inf"), tl.float32)
    g_sum = tl.zeros([BLOCK_C], tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        _, _, mu_cols = _load_samples(QL, KL, NOISE, lm_off, 0, cols, d_idx, C, D, False)
        mu_sq = tl.sum(mu_cols * mu_cols, axis=1)
        g = tl.dot(ws2, tl.trans(mu_cols), input_precision="tf32x3") - (0.5 * qk_scale2) * mu_sq[None, :]
        g = tl.where((cols < C)[None, :], g, float("-inf"))  # [BLOCK_C, BLOCK_C]
        g_new = tl.maximum(g_max, tl.max(g, axis=1))
        g_sum = g_sum * tl.exp2(g_max - g_new) + tl.sum(tl.exp2(g - g_new[:, None]), axis=1)
        g_max = g_new
    bh = tl.exp2(own - g_max - tl.log2(g_sum))  # BH_c = g_c(w_c) / sum_c' g_c'(w_c)

    # -- merge split partials: global max, then rescaled sums --
    base = pid_bh * num_splits * C + c_idx  # split s lives at base + s * C
    m_all = tl.full([BLOCK_C], float("-inf"), tl.float32)
    rm_all = tl.full([BLOCK_C], float("-inf"), tl.float32)
    for s in range(num_splits):
        m_all = tl.maximum(m_all, tl.load(PART_M + base + s * C, mask=cm, other=float("-inf")))
        rm_all = tl.maximum(rm_all, tl.load(PART_RM + base + s * C, mask=cm, other=float("-inf")))
    m_use = tl.where(m_all == float("-inf"), 0.0, m_all)  # fully padded sequence: no NaN
    rm_use = tl.where(rm_all == float("-inf"), 0.0, rm_all)
    l_all = tl.zeros([BLOCK_C], tl.float32)
    rl_all = tl.zeros([BLOCK_C], tl.float32)
    acc = tl.zeros([BLOCK_C, D], tl.float32)
    for s in range(num_splits):
        scale = tl.exp2(tl.load(PART_M + base + s * C, mask=cm, other=float("-inf")) - m_use)
        l_all += scale * tl.load(PART_L + base + s * C, mask=cm, other=0.0)
        part = tl.load(PART_ACC + (base + s * C)[:, None] * D + d_idx[None, :], mask=cm[:, None], other=0.0)
        acc += scale[:, None] * part
        r_scale = tl.exp2(tl.load(PART_RM + base + s * C, mask=cm, other=float("-inf")) - rm_use)
        rl_all += r_scale * tl.load(PART_RL + base + s * C, mask=cm, other=0.0)

    # epilogue: F_c (softmax over keys applied to v), lse_c - log g_c(w_c), rho log-normalizer, BH
    has_keys = l_all > 0
    f = acc / tl.where(has_keys, l_all, 1.0)[:, None]
    lse = tl.where(has_keys, m_use + tl.log2(tl.where(has_keys, l_all, 1.0)), 0.0)
    rlse = tl.where(rl_all > 0, rm_use + tl.log2(tl.where(rl_all > 0, rl_all, 1.0)), 0.0)
    row = pid_bh * C + c_idx
    tl.store(F + row[:, None] * D + d_idx[None, :], f, mask=cm[:, None])
    tl.store(BIAS + row, lse - own, mask=cm)
    tl.store(RLSE + row, rlse, mask=cm)
    tl.store(BH + row, bh, mask=cm)


# ----------------------------------------------------------------------------- kernel 3: queries
@triton.jit
def _lara_queries_kernel(
    Q, QL, KL, NOISE, MASK, F, BIAS, RLSE, BH, OUT,
    stride_qb, stride_qh, stride_qn,
    stride_ob, stride_oh, stride_on,
    stride_noise_b,
    H, N, C, alpha_coeff, qk_scale2,
    D: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr, NUM_C_BLOCKS: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_NOISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    OUT_PRECISION: tl.constexpr, ALPHA_MIN: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_bh, b, h = _batch_head(1, H)
    n_idx = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    d_idx = tl.arange(0, D)
    valid = _valid_rows(MASK, b, n_idx, N, HAS_MASK)
    op_dtype = Q.dtype.element_ty
    lm_off = pid_bh * C * D
    noise_off = b * stride_noise_b + h * C * D
    q = tl.load(Q + b * stride_qb + h * stride_qh + n_idx[:, None] * stride_qn + d_idx[None, :],
                mask=valid[:, None], other=0.0)  # fmt: skip

    # -- mean over c of rho_nc: a first sweep over C, needed only when C spans several blocks --
    rho_sum = tl.zeros([BLOCK_N], tl.float32)
    if NUM_C_BLOCKS > 1:
        for cb in range(NUM_C_BLOCKS):
            c_idx = cb * BLOCK_C + tl.arange(0, BLOCK_C)
            _, ql, _ = _load_samples(QL, KL, NOISE, lm_off, noise_off, c_idx, d_idx, C, D, False)
            r = tl.dot(q, tl.trans((ql * qk_scale2).to(op_dtype)), input_precision=DOT_PRECISION)
            rlse = tl.load(RLSE + pid_bh * C + c_idx, mask=c_idx < C, other=0.0)
            rho = tl.where((c_idx < C)[None, :], tl.exp2(r - rlse[None, :]), 0.0)  # [BLOCK_N, BLOCK_C]
            rho_sum += tl.sum(rho, axis=1)

    # -- SNIS weights over samples, online over blocks of C, and the output W^T F --
    m_i = tl.full([BLOCK_N], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_N], tl.float32)
    acc = tl.zeros([BLOCK_N, D], tl.float32)
    for cb in range(NUM_C_BLOCKS):
        c_idx = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        cm = c_idx < C
        w, ql, _ = _load_samples(QL, KL, NOISE, lm_off, noise_off, c_idx, d_idx, C, D, HAS_NOISE)
        # rho_nc = softmax over valid queries of q~_c . q_n / sqrt(d)
        r = tl.dot(q, tl.trans((ql * qk_scale2).to(op_dtype)), input_precision=DOT_PRECISION)
        rlse = tl.load(RLSE + pid_bh * C + c_idx, mask=cm, other=0.0)
        rho = tl.where(cm[None, :], tl.exp2(r - rlse[None, :]), 0.0)  # [BLOCK_N, BLOCK_C]
        if NUM_C_BLOCKS == 1:
            rho_sum = tl.sum(rho, axis=1)
        # mis-opt: alpha = BH_c + lambda (rho_nc - mean_c rho_nc), clamped (spec 5.3)
        bh = tl.load(BH + pid_bh * C + c_idx, mask=cm, other=0.0)
        alpha = tl.maximum(bh[None, :] + alpha_coeff * (rho - rho_sum[:, None] / C), ALPHA_MIN)
        # log r_nc up to a per-query constant: w^_c.q^_n + lse_c - log g_c(w_c)
        bias = tl.load(BIAS + pid_bh * C + c_idx, mask=cm, other=0.0)
        logit = tl.dot(q, tl.trans((w * qk_scale2).to(op_dtype)), input_precision=DOT_PRECISION)
        logit = tl.where(cm[None, :], logit + bias[None, :], float("-inf"))  # [BLOCK_N, BLOCK_C]
        m_new = tl.maximum(m_i, tl.max(logit, axis=1))  # finite: every block has a real proposal
        corr = tl.exp2(m_i - m_new)
        e = alpha * tl.exp2(logit - m_new[:, None])  # unnormalized SNIS weights
        l_i = l_i * corr + tl.sum(e, axis=1)
        f = tl.load(F + (pid_bh * C + c_idx)[:, None] * D + d_idx[None, :], mask=cm[:, None], other=0.0)
        acc = acc * corr[:, None] + tl.dot(e, f, input_precision=OUT_PRECISION)
        m_i = m_new

    # epilogue: normalize; padded query rows are zero
    out = tl.where(valid[:, None], acc / l_i[:, None], 0.0)
    tl.store(OUT + b * stride_ob + h * stride_oh + n_idx[:, None] * stride_on + d_idx[None, :],
             out.to(OUT.dtype.element_ty), mask=(n_idx < N)[:, None])  # fmt: skip


# ----------------------------------------------------------------------------- launcher
@dataclass(frozen=True)
class LaunchConfig:
    """Block sizes and launch options. None fields are chosen by `_default_config` (see there why)."""

    block_c: int | None = None  # proposals per program (a power of two >= 16)
    block_n_keys: int | None = None  # keys per inner step of kernel 1
    block_n_queries: int | None = None  # queries per program of kernel 3
    num_splits: int | None = None  # slices of N in kernel 1
    warps_keys: int | None = None  # default 4, or 8 for D = 128 (larger [*, D] accumulators)
    warps_queries: int | None = None
    stages: int = 2


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter: a few splits, so that tests exercise the combine step


def _default_config(
    cfg: LaunchConfig, bh: int, n: int, c: int, d: int, dtype: torch.dtype, device: torch.device
) -> LaunchConfig:
    """Fill the None fields of cfg.

    The defaults are the largest tiles that compiled for sm_90 (Triton 3.7, offline ptxas) without
    register spills, or with a few bytes at D = 128: tl.dot needs every dimension >= 16; 64 proposals
    per block keep the [C, BLOCK_N] logit tiles and the [C, D] accumulator in registers, and a larger C is
    swept in blocks (kernel 3 then computes rho twice). fp32 operands take twice the shared memory, so
    their key blocks are halved. Speed is unmeasured: `benchmarks/gpu.py` sweeps alternatives.
    """
    c_blocks_hint = triton.cdiv(c, cfg.block_c or 64)
    block_c = cfg.block_c or max(16, min(64, triton.next_power_of_2(c)))
    block_nk = cfg.block_n_keys or (32 if dtype == torch.float32 else 128 if d == 16 else 64)
    block_nq = cfg.block_n_queries or 64
    if device.type != "cuda":  # the interpreter pays per element: no padding past the sequence
        block_nk = cfg.block_n_keys or max(16, min(block_nk, triton.next_power_of_2(n)))
        block_nq = cfg.block_n_queries or max(16, min(block_nq, triton.next_power_of_2(n)))
    splits = cfg.num_splits
    if splits is None:
        # Fill the device about twice over, but give every split at least four key blocks.
        programs = bh * triton.cdiv(c, block_c)
        splits = max(1, min(triton.cdiv(2 * _sm_count(device), programs), triton.cdiv(n, 4 * block_nk)))
    splits = max(1, min(splits, triton.cdiv(n, block_nk)))
    warps_keys = cfg.warps_keys or (8 if d > 64 else 4)
    wide = d > 64 or c_blocks_hint > 1 or dtype == torch.float32
    warps_queries = cfg.warps_queries or (8 if wide else 4)
    return LaunchConfig(block_c, block_nk, block_nq, splits, warps_keys, warps_queries, cfg.stages)


def _check_inputs(q, k, v, q_landmarks, k_landmarks, key_padding_mask, noise) -> None:
    assert q.dim() == 4 and q.shape == k.shape == v.shape, f"q, k, v must be [B,H,N,D] alike, got {q.shape}"
    b, h, n, d = q.shape
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {q.dtype}"
    assert d in (16, 32, 64, 128), f"head dim must be 16, 32, 64 or 128, got {d}"
    assert k.dtype == v.dtype == q.dtype, "q, k, v must share a dtype"
    c = q_landmarks.shape[-2]
    assert q_landmarks.shape == k_landmarks.shape == (b, h, c, d), (
        f"landmarks must be [B,H,C,D] = [{b},{h},C,{d}], got {q_landmarks.shape} and {k_landmarks.shape}"
    )
    assert 1 <= c <= 256, f"1 <= C <= 256 landmarks supported, got {c}"
    if key_padding_mask is not None:
        assert key_padding_mask.dtype == torch.bool and key_padding_mask.shape == (b, n), (
            f"key_padding_mask must be bool [B, N] = [{b}, {n}], got {key_padding_mask.dtype} {key_padding_mask.shape}"
        )
    if noise is not None:
        assert noise.shape[0] in (1, b) and noise.shape[1:] == (h, c, d), (
            f"noise must be [B or 1, H, C, D] = [{b}|1, {h}, {c}, {d}], got {noise.shape}"
        )
    devices = {t.device for t in (q, k, v, q_landmarks, k_landmarks, key_padding_mask, noise) if t is not None}
    assert len(devices) == 1, f"all inputs must be on one device, got {devices}"


def lara_forward_triton(inputs: LaraInputs, *, config: LaunchConfig | None = None) -> Tensor:
    """LARA forward with the fused kernels; same contract as `lara_serve.kernels._cpu.lara_forward_cpu`.

    q, k, v: [B, H, N, D] fp16/bf16/fp32, D in {16, 32, 64, 128}; q_landmarks, k_landmarks: [B, H, C, D],
    C <= 256; key_padding_mask: [B, N] bool (True = padding) or None; noise: [B or 1, H, C, D] or None.
    Returns [B, H, N, D] in q's dtype; padded query rows and fully padded sequences are zero.
    """
    q, k, v, q_landmarks, k_landmarks, key_padding_mask, alpha_coeff, noise = inputs.as_args()
    _check_inputs(q, k, v, q_landmarks, k_landmarks, key_padding_mask, noise)
    b, h, n, d = q.shape
    c = q_landmarks.shape[-2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if n == 0 or b * h == 0:
        return out
    q, k, v = (unit_last_stride(t) for t in (q, k, v))
    ql, kl = q_landmarks.contiguous(), k_landmarks.contiguous()
    cfg = _default_config(config or LaunchConfig(), b * h, n, c, d, q.dtype, q.device)
    has_noise, has_mask = noise is not None, key_padding_mask is not None
    noise_t = noise.to(q.dtype).contiguous() if has_noise else ql  # dummy pointer when absent
    noise_sb = (0 if noise_t.shape[0] == 1 else h * c * d) if has_noise else 0
    mask_t = key_padding_mask.contiguous().view(torch.uint8) if has_mask else q  # dummy pointer when absent
    qk_scale2 = LOG2E / math.sqrt(d)
    dot_precision = "tf32x3" if q.dtype == torch.float32 else "tf32"  # tf32 is unused by 16-bit products
    out_precision = "tf32x3" if q.dtype == torch.float32 else "tf32"
    c_blocks = triton.cdiv(c, cfg.block_c)

    # kernel 1: split partials of the key pass and of the rho normalizer
    splits = cfg.num_splits
    keys_per_split = triton.cdiv(triton.cdiv(n, splits), cfg.block_n_keys) * cfg.block_n_keys
    splits = triton.cdiv(n, keys_per_split)
    f32 = dict(device=q.device, dtype=torch.float32)
    part_m, part_l, part_rm, part_rl = (torch.empty(b * h, splits, c, **f32) for _ in range(4))
    part_acc = torch.empty(b * h, splits, c, d, **f32)
    _lara_keys_kernel[(splits, c_blocks, b * h)](
        q, k, v, ql, kl, noise_t, mask_t,
        part_m, part_l, part_acc, part_rm, part_rl,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        noise_sb, h, n, c, keys_per_split, splits, qk_scale2,
        D=d, BLOCK_C=cfg.block_c, BLOCK_N=cfg.block_n_keys,
        HAS_MASK=has_mask, HAS_NOISE=has_noise, DOT_PRECISION=dot_precision,
        num_warps=cfg.warps_keys, num_stages=cfg.stages,
    )  # fmt: skip

    # kernel 2: F [B*H, C, D], lse - log g (bias), rho normalizer, BH
    f = torch.empty(b * h, c, d, **f32)
    bias, rlse, bh = (torch.empty(b * h, c, **f32) for _ in range(3))
    # Small blocks: this launch is tiny, and [32, D] fp32 tiles with a C x C tf32x3 product stay in registers.
    combine_block_c = max(16, min(32 if d <= 64 else 16, triton.next_power_of_2(c)))
    _lara_combine_kernel[(triton.cdiv(c, combine_block_c), b * h)](
        ql, kl, noise_t, part_m, part_l, part_acc, part_rm, part_rl, f, bias, rlse, bh,
        noise_sb, h, c, splits, qk_scale2,
        D=d, BLOCK_C=combine_block_c, HAS_NOISE=has_noise, num_warps=4,
    )  # fmt: skip

    # kernel 3: weights and output
    _lara_queries_kernel[(triton.cdiv(n, cfg.block_n_queries), b * h)](
        q, ql, kl, noise_t, mask_t, f, bias, rlse, bh, out,
        q.stride(0), q.stride(1), q.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        noise_sb, h, n, c, float(alpha_coeff), qk_scale2,
        D=d, BLOCK_C=cfg.block_c, BLOCK_N=cfg.block_n_queries, NUM_C_BLOCKS=c_blocks,
        HAS_MASK=has_mask, HAS_NOISE=has_noise, DOT_PRECISION=dot_precision,
        OUT_PRECISION=out_precision, ALPHA_MIN=ALPHA_FLOOR,
        num_warps=cfg.warps_queries, num_stages=cfg.stages,
    )  # fmt: skip
    return out
