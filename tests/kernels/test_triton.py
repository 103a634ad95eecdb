"""The fused Triton LARA kernels (`kernels/_triton/`) against the float64 reference, on the CPU interpreter.

Tolerances, per dtype, follow flash-attention's rule: the kernel's error against the float64 reference
(run on the same, already rounded, inputs) may be at most twice the error of plain PyTorch in the
kernel's dtype, plus a floor of one output rounding:
* plain PyTorch = the blocked PyTorch backend (`lara_forward_cpu`), which like the kernel computes in
  fp32 and rounds the output once; this is the stricter of the two PyTorch baselines. fp16 inputs are
  additionally checked against the reference evaluated in fp16 arithmetic throughout.
* floor: fp32 5e-6 (the logits reach ~20 in base 2, so exp2 turns a 1-ulp logit error into ~2e-6
  relative); fp16 2^-11 * max|y| (half an fp16 ulp at the output's scale: one rounding of the result).
bf16 is not run: the interpreter's bf16 is broken (platform.md); `benchmarks/gpu.py` checks it on a GPU.
Shapes are tiny and awkward (N = 1, 5, 97; C > N; C over several blocks) because the interpreter is slow.
"""

from __future__ import annotations

import os

from lara_serve import kernels

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernels import (decoration time)

import pytest  # noqa: E402
import torch  # noqa: E402

from lara_serve.kernels._cpu import lara_forward_cpu  # noqa: E402
from lara_serve.kernels._triton import LaunchConfig, lara_forward_triton  # noqa: E402
from lara_serve.kernels.inputs import LaraInputs  # noqa: E402
from lara_serve.kernels.reference import lara_attention_ref  # noqa: E402

F64 = torch.float64
FLOOR = {torch.float32: lambda ref: 5e-6, torch.float16: lambda ref: 2.0**-11 * ref.abs().max().item()}

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 set before kernels is imported"
)


def _inputs(b, h, n, d, c, *, seed, scale=1.0, lengths=None, noise_batch=None):
    """q, k, v, landmarks (float64), mask (lengths -> tail padding) and raw-space noise [noise_batch, H, C, D]."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=F64) * scale for _ in range(3))
    ql, kl = (torch.randn(b, h, c, d, generator=g, dtype=F64) * 0.5 * scale for _ in range(2))
    mask = None if lengths is None else torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]
    noise = None if noise_batch is None else torch.randn(noise_batch, h, c, d, generator=g, dtype=F64)
    return (q, k, v, ql, kl), mask, noise


def _run(fn, xs, mask, noise, alpha, dtype, **kw):
    return fn(LaraInputs(*(x.to(dtype) for x in xs), mask, alpha, None if noise is None else noise.to(dtype)), **kw)


def _err(out, ref):
    return (out.to(F64) - ref).abs().max().item()


# (b, h, n, d, c, lengths, noise batch, alpha, input scale, forced splits)
CASES = {
    "n1": (1, 1, 1, 16, 4, None, None, 1.0, 1.0, None),
    "c_gt_n_pad_noise1": (2, 1, 5, 32, 8, [5, 3], 1, 1.0, 1.0, None),
    "n97_fully_padded_row_splits": (2, 2, 97, 64, 20, [60, 0], 2, 1.0, 1.0, 3),
    "c70_two_c_blocks": (1, 2, 97, 16, 70, [90], 1, 1.0, 1.0, 2),
    "alpha2_no_mask": (1, 2, 33, 32, 16, None, None, 2.0, 1.0, None),
    "large_logits": (1, 1, 40, 64, 8, [37], None, 1.0, 2.5, None),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_float64_reference(case, dtype):
    b, h, n, d, c, lengths, noise_b, alpha, scale, splits = CASES[case]
    xs, mask, noise = _inputs(b, h, n, d, c, seed=n + c, scale=scale, lengths=lengths, noise_batch=noise_b)
    xs_r = [x.to(dtype).to(F64) for x in xs]  # the reference sees the same rounded inputs
    noise_r = None if noise is None else noise.to(dtype).to(F64)
    ref = lara_attention_ref(*xs_r, mask, alpha, noise_r)

    out = _run(lara_forward_triton, xs_r, mask, noise_r, alpha, dtype, config=LaunchConfig(num_splits=splits))
    assert out.dtype == dtype and out.shape == (b, h, n, d)
    assert torch.isfinite(out).all()
    err = _err(out, ref)
    torch_err = _err(_run(lara_forward_cpu, xs_r, mask, noise_r, alpha, dtype), ref)
    assert err <= 2 * torch_err + FLOOR[dtype](ref), f"kernel {err:.3g} vs PyTorch {torch_err:.3g}"
    if dtype == torch.float16:  # flash-attention's baseline: the reference evaluated in fp16 throughout
        naive_err = _err(
            _run(lambda inputs: lara_attention_ref(*inputs.as_args()), xs_r, mask, noise_r, alpha, dtype), ref
        )
        assert err <= 2 * naive_err + FLOOR[dtype](ref), f"kernel {err:.3g} vs fp16 reference {naive_err:.3g}"
    if mask is not None:  # padded query rows (and a fully padded sequence) are exactly zero
        assert (out.masked_select(mask[:, None, :, None]) == 0).all()


def test_split_count_does_not_change_the_result():
    xs, mask, noise = _inputs(1, 1, 64, 32, 8, seed=1, lengths=[50], noise_batch=1)
    xs, noise = [x.float() for x in xs], noise.float()
    outs = [
        lara_forward_triton(LaraInputs(*xs, mask, 1.0, noise), config=LaunchConfig(num_splits=s)) for s in (1, 2, 4)
    ]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-6, atol=1e-6)


def test_padding_content_is_ignored_and_runs_are_deterministic():
    """Spec check 5: whatever sits at padded positions (here NaN, as in an uninitialized batch buffer),
    outputs at valid positions are unchanged."""
    xs, mask, _ = _inputs(2, 1, 24, 16, 4, seed=2, lengths=[24, 10])
    xs = [x.float() for x in xs]
    out = lara_forward_triton(LaraInputs(*xs, mask, 1.0, None))
    junk = [x.clone() for x in xs]
    for t in junk[:3]:
        t[1, :, 10:] = float("nan")
    out_junk = lara_forward_triton(LaraInputs(*junk, mask, 1.0, None))
    torch.testing.assert_close(out_junk, out, rtol=0, atol=0)
    assert torch.equal(lara_forward_triton(LaraInputs(*xs, mask, 1.0, None)), out)


def test_strided_inputs():
    """q, k, v as views of a [B, N, H, D] projection (no copy): only the head dim must be contiguous."""
    b, n, h, d, c = 2, 13, 2, 16, 4
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(b, n, 3, h, d, generator=g)  # like a fused qkv Linear output
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, N, D] views
    ql, kl = (torch.randn(b, h, c, d, generator=g) * 0.5 for _ in range(2))
    out = lara_forward_triton(LaraInputs(q, k, v, ql, kl, None, 1.0, None))
    ref = lara_attention_ref(*(x.double() for x in (q, k, v, ql, kl)))
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)


def test_public_api_runs_triton_through_the_op():
    xs, mask, noise = _inputs(2, 2, 17, 32, 6, seed=4, lengths=[17, 9], noise_batch=1)
    q, k, v, ql, kl = (x.half() for x in xs)
    kw = dict(key_padding_mask=mask, alpha_coeff=1.5, noise=noise.half())
    out = kernels.lara_attention(q, k, v, ql, kl, backend="triton", **kw)
    direct = lara_forward_triton(LaraInputs(q, k, v, ql, kl, mask, 1.5, noise.half()))
    assert torch.equal(out, direct)
    torch.testing.assert_close(out, kernels.lara_attention(q, k, v, ql, kl, backend="torch", **kw), rtol=0, atol=2e-3)


def test_launcher_rejects_bad_inputs_with_a_message():
    xs, _, _ = _inputs(1, 1, 4, 24, 2, seed=5)
    with pytest.raises(AssertionError, match="head dim"):
        lara_forward_triton(LaraInputs(*(x.float() for x in xs), None, 1.0, None))
    xs, _, _ = _inputs(1, 1, 4, 16, 2, seed=5)
    with pytest.raises(AssertionError, match="key_padding_mask"):
        lara_forward_triton(LaraInputs(*(x.float() for x in xs), torch.zeros(1, 5, dtype=torch.bool), 1.0, None))
