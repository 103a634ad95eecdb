"""The PyTorch backend and the `lara::attention` op against the float64 reference.

Tolerance rule (style.md): a fast path may be at most 2x as far from the float64 reference as the
plain reference run in the same dtype, plus a floor of a few units of that dtype's rounding of an O(1)
output (fp32 1e-6, fp16 2e-3 ~ 2 ulp at 4, bf16 1.6e-2 ~ 2 ulp at 4). The PyTorch backend computes in
fp32 for every reduced dtype, so in practice it sits well inside this bound.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lara_serve import kernels
from lara_serve.kernels._cpu import lara_forward_cpu
from lara_serve.kernels.inputs import LaraInputs
from lara_serve.kernels.landmarks import chunk_means_1d
from lara_serve.kernels.reference import lara_attention_ref
from tests.kernels.conftest import make_inputs, tail_padding

FLOOR = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


@pytest.mark.parametrize("n,c,d", [(1, 4, 32), (97, 16, 64), (97, 130, 32), (1025, 64, 64)])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("with_noise", [False, True])
def test_torch_backend_matches_float64_reference(n, c, d, padded, with_noise):
    q, k, v, ql, kl = make_inputs(2, 2, n, d, c, seed=n + c + d)
    mask = tail_padding([n, max(n // 2, 1)], n) if padded else None
    noise = (
        torch.randn(1, 2, c, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) if with_noise else None
    )
    ref = lara_attention_ref(q, k, v, ql, kl, mask, 1.0, noise)
    torch.testing.assert_close(
        lara_forward_cpu(LaraInputs(q, k, v, ql, kl, mask, 1.0, noise), 256), ref, rtol=0, atol=1e-12
    )
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        args = [t.to(dtype) for t in (q, k, v, ql, kl)]
        nz = None if noise is None else noise.to(dtype)
        out = kernels.lara_attention(*args, key_padding_mask=mask, noise=nz, backend="torch")
        assert out.dtype == dtype and out.shape == q.shape
        plain = lara_attention_ref(*args, mask, 1.0, nz) if dtype == torch.float32 else None
        # The reference in fp16/bf16 on CPU is itself unreliable (logsumexp/softmax in half), so the
        # dtype-run reference error is only taken in fp32; reduced dtypes use the input-rounding floor.
        ref_err = _max_err(plain, ref) if plain is not None else 0.0
        assert _max_err(out, ref) <= 2 * ref_err + FLOOR[dtype] + _rounding_of_inputs(args, ref, mask, noise, dtype)


def _rounding_of_inputs(args, ref, mask, noise, dtype) -> float:
    """Error the reduced-precision INPUTS alone cause: float64 reference on the rounded inputs."""
    if dtype == torch.float32:
        return 0.0
    rounded = [t.double() for t in args]
    nz = None if noise is None else noise.to(dtype).double()
    return _max_err(lara_attention_ref(*rounded, mask, 1.0, nz), ref)


def test_eval_is_bitwise_repeatable():
    q, k, v, ql, kl = make_inputs(2, 4, 300, 64, 16, seed=3, dtype=torch.float32)
    a = kernels.lara_attention(q, k, v, ql, kl)
    assert torch.equal(a, kernels.lara_attention(q, k, v, ql, kl))


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=70), min_size=1, max_size=4),
    extra_pad=st.integers(min_value=0, max_value=9),
    target=st.integers(min_value=0, max_value=3),
    c=st.sampled_from([1, 4, 16]),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_output_does_not_depend_on_batch_or_padding(lengths, extra_pad, target, c, seed):
    """A sequence alone (no mask) equals the same sequence padded inside any batch (D = 64, unit normal)."""
    target = target % len(lengths)
    n = max(lengths) + extra_pad
    if lengths[target] == 0:
        lengths[target] = 1
        n = max(n, 1)
    q, k, v, _, _ = make_inputs(len(lengths), 2, n, 64, 1, seed=seed, dtype=torch.float32)
    mask = tail_padding(lengths, n)
    ql, kl = chunk_means_1d(q, c, mask), chunk_means_1d(k, c, mask)
    batched = kernels.lara_attention(q, k, v, ql, kl, key_padding_mask=mask)
    assert not batched.isnan().any()
    m = lengths[target]
    one = [t[target : target + 1, :, :m] for t in (q, k, v)]
    alone = kernels.lara_attention(*one, chunk_means_1d(one[0], c), chunk_means_1d(one[1], c))
    assert _max_err(alone, batched[target : target + 1, :, :m]) <= 1e-5
    assert (batched[target, :, m:] == 0).all()


def test_opcheck_and_gradcheck():
    q, k, v, ql, kl = make_inputs(2, 2, 9, 16, 3, seed=5)
    mask = tail_padding([9, 4], 9)
    args = [t.requires_grad_() for t in (q, k, v, ql, kl)]
    torch.library.opcheck(torch.ops.lara.attention.default, (*args, mask, None, 1.0, ""))
    torch.library.opcheck(
        torch.ops.lara.attention.default,
        (*args, None, torch.randn(1, 2, 3, 16, dtype=torch.float64), 0.5, "torch"),
    )
    assert torch.autograd.gradcheck(lambda *a: torch.ops.lara.attention(*a, mask, None, 1.0, ""), args)


def test_training_path_gradients_match_the_op_backward():
    q, k, v, ql, kl = make_inputs(1, 2, 12, 16, 3, seed=6)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, ql, kl)]
    kernels.lara_attention(*leaves).square().sum().backward()  # eager training path
    via_op = [t.clone().requires_grad_() for t in (q, k, v, ql, kl)]
    torch.ops.lara.attention(*via_op, None, None, 1.0, "").square().sum().backward()
    for a, b in zip(leaves, via_op, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_fp16_gradients_are_finite_with_large_inputs():
    """Spec check 7: gradients stay finite with fp16 inputs scaled by 10."""
    q, k, v, ql, kl = make_inputs(1, 2, 33, 32, 4, seed=7, dtype=torch.float16, scale=10.0)
    leaves = [t.requires_grad_() for t in (q, k, v, ql, kl)]
    kernels.lara_attention(*leaves).float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)


class _Attn(torch.nn.Module):
    def forward(self, q, k, v, ql, kl, mask):
        return kernels.lara_attention(q, k, v, ql, kl, key_padding_mask=mask)


def test_export_and_compile_see_one_node():
    q, k, v, ql, kl = make_inputs(2, 2, 10, 16, 2, seed=8, dtype=torch.float32)
    mask = tail_padding([10, 6], 10)
    ep = torch.export.export(_Attn(), (q, k, v, ql, kl, mask))
    calls = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert calls == [torch.ops.lara.attention.default]
    seen = []

    def record(gm, example_inputs):
        seen.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm

    compiled = torch.compile(_Attn(), backend=record, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, ql, kl, mask), _Attn()(q, k, v, ql, kl, mask))
    assert torch.ops.lara.attention.default in seen


# ----------------------------------------------------------------------------- bad input
def _good():
    return list(make_inputs(2, 2, 8, 16, 4, seed=0, dtype=torch.float32))


@pytest.mark.parametrize(
    "mutate,error,words",
    [
        (lambda a: a.__setitem__(0, a[0][0]), ValueError, "q must have rank 4"),
        (lambda a: a.__setitem__(1, a[1][:, :, :5]), ValueError, "k must have q's shape"),
        (lambda a: a.__setitem__(2, a[2].double()), TypeError, "v is torch.float64"),
        (lambda a: a.__setitem__(3, a[3][:, :, :0]), ValueError, "C >= 1"),
        (lambda a: a.__setitem__(4, a[4][:, :, :3]), ValueError, "k_landmarks must be"),
        (lambda a: a.__setitem__(0, a[0].long()), TypeError, "q must be a floating tensor"),
    ],
)
def test_bad_input_is_a_clear_error(mutate, error, words):
    args = _good()
    mutate(args)
    with pytest.raises(error, match=words):
        kernels.lara_attention(*args)


def test_bad_mask_noise_and_backend_are_clear_errors():
    args = _good()
    with pytest.raises(TypeError, match="key_padding_mask must be a bool"):
        kernels.lara_attention(*args, key_padding_mask=torch.zeros(2, 8))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \[B, N\]"):
        kernels.lara_attention(*args, key_padding_mask=torch.zeros(2, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match="noise must be"):
        kernels.lara_attention(*args, noise=torch.zeros(3, 2, 4, 16))
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        kernels.lara_attention(*args, backend="cuda")


def test_forced_triton_lists_every_reason(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v, ql, kl = make_inputs(1, 1, 4, 24, 2, seed=0, dtype=torch.float64)
    with pytest.raises(ValueError) as info:
        kernels.lara_attention(q, k, v, ql, kl, backend="triton")
    msg = str(info.value)
    assert "dtype torch.float64 not supported" in msg
    assert "device cpu is not CUDA" in msg
    assert "head dim 24 not supported" in msg


def test_describe_backends_on_cpu_picks_the_compiled_kernel_then_torch():
    q, k, v, ql, kl = make_inputs(1, 1, 4, 16, 2, seed=0, dtype=torch.float32)
    info = kernels.describe_backends(q, k, v, ql, kl)
    assert info["chosen"] == "cpu_fused" and info["reasons"]["cpu_fused"] == [] and info["reasons"]["torch"] == []
    info = kernels.describe_backends(*(t.double() for t in (q, k, v, ql, kl)))
    assert info["chosen"] == "torch" and "dtype torch.float64 not supported" in info["reasons"]["cpu_fused"][0]
