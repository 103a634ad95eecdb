"""The compiled CPU kernel (`kernels/csrc/`, `kernels/_cpu_fused.py`): accuracy, padding, batch
invariance, fallback.

Tolerances (style.md rule, as in test_lara_op.py): the kernel may be at most 2x as far from the float64
reference as the plain reference run in float32, plus a floor of a few float32 roundings of an O(1)
output (1e-6). The kernel computes in float32 for every input dtype, so fp16/bf16 inputs add only the
error their rounded INPUTS cause (the float64 reference on the rounded inputs), plus 2 ulp of the
output dtype at 4 (fp16 2e-3, bf16 1.6e-2) for the final cast.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lara_serve import kernels
from lara_serve.kernels import _cpu_fused
from lara_serve.kernels._cpu import lara_forward_cpu
from lara_serve.kernels.dispatch import CpuFusedBackend, LaraInputs, TorchBackend, select_backend
from lara_serve.kernels.landmarks import chunk_means_1d
from lara_serve.kernels.reference import lara_attention_ref
from tests.kernels.conftest import make_inputs, tail_padding

FLOOR = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
VARIANTS = [False, True]  # force_generic: the run-time selected variant (AVX2 here), then the portable one


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """The kernel must build wherever a compiler exists (CI has g++): a failure here is a real failure."""
    _cpu_fused.reset()
    assert _cpu_fused.load() is not None, _cpu_fused.unavailable_reason()


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def _fused(args, mask, noise, dtype=torch.float32, force_generic=False, threads=None):
    cast = [t.to(dtype) for t in args]
    nz = None if noise is None else noise.to(dtype)
    return _cpu_fused.lara_forward_fused(
        LaraInputs(*cast, mask, 1.0, nz), force_generic=force_generic, num_threads=threads
    )


@pytest.mark.parametrize("force_generic", VARIANTS)
@pytest.mark.parametrize("n,c,d", [(1, 4, 32), (97, 16, 64), (97, 130, 32), (1025, 49, 64), (1025, 64, 32)])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("with_noise", [False, True])
def test_matches_float64_reference(n, c, d, padded, with_noise, force_generic):
    q, k, v, ql, kl = make_inputs(2, 2, n, d, c, seed=n + c + d)
    mask = tail_padding([n, max(n // 2, 1)], n) if padded else None
    if padded and n > 4:
        mask[0, 1:3] = True  # a hole, not only tail padding: exercises the gather path
    gen = torch.Generator().manual_seed(1)
    noise = torch.randn(1, 2, c, d, dtype=torch.float64, generator=gen) if with_noise else None
    ref = lara_attention_ref(q, k, v, ql, kl, mask, 1.0, noise)
    f32 = [t.float() for t in (q, k, v, ql, kl)]
    plain = lara_attention_ref(*f32, mask, 1.0, None if noise is None else noise.float())
    out = _fused((q, k, v, ql, kl), mask, noise, force_generic=force_generic)
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert _max_err(out, ref) <= 2 * _max_err(plain, ref) + FLOOR[torch.float32]
    if mask is not None:
        assert (out[mask[:, None, :, None].expand_as(out)] == 0).all()  # padded query rows are zero


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_dtypes_compute_in_float32(dtype):
    q, k, v, ql, kl = make_inputs(2, 2, 300, 64, 16, seed=4)
    mask = tail_padding([300, 123], 300)
    ref = lara_attention_ref(q, k, v, ql, kl, mask, 1.0, None)
    out = _fused((q, k, v, ql, kl), mask, None, dtype=dtype)
    rounded = lara_attention_ref(*(t.to(dtype).double() for t in (q, k, v, ql, kl)), mask, 1.0, None)
    assert out.dtype == dtype
    assert _max_err(out, ref) <= 2 * _max_err(rounded, ref) + FLOOR[dtype]


def _fused_near_reference(args, mask):
    """The kernel's float32 output (eval, lambda 1), checked against the float64 reference."""
    ref = lara_attention_ref(*args, mask, 1.0, None)
    plain = lara_attention_ref(*(t.float() for t in args), mask, 1.0, None)
    out = _fused(args, mask, None)
    assert _max_err(out, ref) <= 2 * _max_err(plain, ref) + FLOOR[torch.float32]
    return out


def test_long_sequence_33000_keys():
    """Many key chunks and query blocks (N = 33,000 is not a multiple of any tile); kept cheap: B=H=1, D=32."""
    q, k, v, ql, kl = make_inputs(1, 1, 33_000, 32, 16, seed=9)
    ql, kl = chunk_means_1d(q, 16), chunk_means_1d(k, 16)
    mask = tail_padding([32_001], 33_000)
    _fused_near_reference((q, k, v, ql, kl), mask)


@pytest.mark.parametrize("cap", ["", "avx2", "generic"])
def test_every_isa_variant_matches_the_reference(cap, monkeypatch):
    """The widest variant the CPU has runs by default (AVX-512 where present); LARA_CPU_ISA caps it. Each
    one must meet the float64 reference's tolerance on its own."""
    monkeypatch.setenv("LARA_CPU_ISA", cap)
    expected = {"generic": "generic", "avx2": "avx2" if _cpu_fused.variant() != "generic" else "generic"}
    if cap:
        assert _cpu_fused.variant() == expected[cap]
    q, k, v, ql, kl = make_inputs(2, 2, 1_500, 64, 49, seed=11)
    mask = tail_padding([1_500, 700], 1_500)
    _fused_near_reference((q, k, v, ql, kl), mask)


def test_head_groups_of_a_long_batch():
    """At N = 9,000, D = 64 one head's q, k, v and output (9.2 MB) fill most of the kernel's 16 MiB head-group
    budget, so the 6 (batch, head) pairs run as 6 groups of all four phases: still the reference's
    numbers, and each document's bits are the same alone (one group per head) as in the batch."""
    q, k, v, ql, kl = make_inputs(2, 3, 9_000, 64, 16, seed=4)
    mask = tail_padding([9_000, 5_000], 9_000)
    out = _fused_near_reference((q, k, v, ql, kl), mask)
    alone = _fused(tuple(t[1:2, :, :5_000] if t.shape[2] == 9_000 else t[1:2] for t in (q, k, v, ql, kl)), None, None)
    assert torch.equal(alone[0], out[1, :, :5_000])


def test_all_padding_gives_zeros_and_garbage_in_padding_is_ignored():
    q, k, v, ql, kl = make_inputs(3, 2, 40, 32, 4, seed=2, dtype=torch.float32)
    mask = tail_padding([40, 0, 17], 40)
    out = _fused((q, k, v, ql, kl), mask, None)
    assert not out.isnan().any() and (out[1] == 0).all()
    junk = [t.clone() for t in (q, k, v)]
    for t in junk:
        t[2, :, 17:] = 1e30  # huge values at padded positions must not leak into valid rows
    again = _fused((*junk, ql, kl), mask, None)
    assert torch.equal(out[2, :, :17], again[2, :, :17])


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=4),
    extra_pad=st.integers(min_value=0, max_value=40),
    target=st.integers(min_value=0, max_value=3),
    c=st.sampled_from([1, 5, 16, 64]),
    threads=st.sampled_from([1, 2, 3]),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_bitwise_same_alone_and_in_any_batch(lengths, extra_pad, target, c, threads, seed):
    """A document's output BITS are the same alone (no mask, default threads) and padded inside any
    batch at any thread count. Landmarks are computed per document, as the models do."""
    target %= len(lengths)
    lengths[target] = max(lengths[target], 1)
    n = max(lengths) + extra_pad
    q, k, v, _, _ = make_inputs(len(lengths), 2, n, 64, 1, seed=seed, dtype=torch.float32)
    mask = tail_padding(lengths, n)
    ql, kl = chunk_means_1d(q, c, mask), chunk_means_1d(k, c, mask)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(1, 2, c, 64, generator=gen)
    m = lengths[target]
    one = [t[target : target + 1, :, :m].contiguous() for t in (q, k, v)]
    one_l = [t[target : target + 1].contiguous() for t in (ql, kl)]
    for nz in (None, noise):
        batched = _cpu_fused.lara_forward_fused(LaraInputs(q, k, v, ql, kl, mask, 1.0, nz), num_threads=threads)
        alone = _cpu_fused.lara_forward_fused(LaraInputs(*one, *one_l, None, 1.0, nz))
        assert torch.equal(alone, batched[target : target + 1, :, :m])
        assert (batched[target, :, m:] == 0).all()


def test_bitwise_invariance_through_the_public_function_at_a_multi_chunk_length():
    """Through lara_serve.kernels.lara_attention (dispatch picks the kernel); 5,000 tokens = 3 key chunks."""
    q, k, v, _, _ = make_inputs(2, 2, 5_000, 64, 1, seed=11, dtype=torch.float32)
    mask = tail_padding([4_321, 5_000], 5_000)
    ql, kl = chunk_means_1d(q, 64, mask), chunk_means_1d(k, 64, mask)
    batched = kernels.lara_attention(q, k, v, ql, kl, key_padding_mask=mask)
    alone = kernels.lara_attention(*(t[:1, :, :4_321] for t in (q, k, v)), ql[:1], kl[:1])
    assert torch.equal(alone, batched[:1, :, :4_321])


def test_strided_views_of_a_fused_qkv_give_the_same_bits_as_contiguous_copies():
    """The models pass q, k, v as permuted views of one [B, N, 3, H, D] projection; the kernel reads
    them in place (row stride 3*H*D) and must give exactly what it gives on contiguous copies."""
    b, n, h, d, c = 2, 300, 3, 32, 8
    qkv = torch.randn(b, n, 3, h, d, generator=torch.Generator().manual_seed(5)).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # [B, H, N, D] views, not contiguous
    assert not q.is_contiguous()
    mask = tail_padding([300, 200], n)
    ql, kl = chunk_means_1d(q, c, mask), chunk_means_1d(k, c, mask)
    views = _cpu_fused.lara_forward_fused(LaraInputs(q, k, v, ql, kl, mask, 1.0, None))
    copies = _cpu_fused.lara_forward_fused(
        LaraInputs(q.contiguous(), k.contiguous(), v.contiguous(), ql, kl, mask, 1.0, None)
    )
    assert torch.equal(views, copies)
    odd = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # last dim not contiguous: copied first
    assert torch.equal(_cpu_fused.lara_forward_fused(LaraInputs(odd, k, v, ql, kl, mask, 1.0, None)), views)


def test_dispatch_prefers_the_kernel_on_cpu():
    args = make_inputs(1, 1, 8, 16, 2, seed=0, dtype=torch.float32)
    assert select_backend(LaraInputs(*args, None, 1.0, None)) is CpuFusedBackend
    f64 = make_inputs(1, 1, 8, 16, 2, seed=0)
    assert select_backend(LaraInputs(*f64, None, 1.0, None)) is TorchBackend  # float64: the PyTorch path


@pytest.fixture
def no_kernel(monkeypatch, tmp_path):
    """Simulates a machine without a compiler: empty cache, CXX pointing at nothing."""
    monkeypatch.setenv("LARA_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    _cpu_fused.reset()
    yield
    monkeypatch.undo()
    _cpu_fused.reset()
    assert _cpu_fused.load() is not None


def test_missing_compiler_warns_once_and_falls_back(no_kernel):
    q, k, v, ql, kl = make_inputs(2, 2, 33, 32, 4, seed=3, dtype=torch.float32)
    mask = tail_padding([33, 20], 33)
    with pytest.warns(UserWarning, match="unavailable.*PyTorch path"):
        out = kernels.lara_attention(q, k, v, ql, kl, key_padding_mask=mask)
    assert torch.equal(out, lara_forward_cpu(LaraInputs(q, k, v, ql, kl, mask, 1.0, None)))
    reasons = kernels.describe_backends(q, k, v, ql, kl)
    assert reasons["chosen"] == "torch" and "no-such-compiler" in reasons["reasons"]["cpu_fused"][0]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning is given once, not per request
        kernels.lara_attention(q, k, v, ql, kl, key_padding_mask=mask)
    with pytest.raises(RuntimeError, match="no-such-compiler"):
        _cpu_fused.lara_forward_fused(LaraInputs(q, k, v, ql, kl, mask, 1.0, None))


def test_switch_off_by_environment(monkeypatch):
    monkeypatch.setenv("LARA_CPU_KERNEL", "off")
    _cpu_fused.reset()
    try:
        with pytest.warns(UserWarning, match="disabled by LARA_CPU_KERNEL"):
            assert _cpu_fused.load() is None
    finally:
        monkeypatch.undo()
        _cpu_fused.reset()
    assert _cpu_fused.load() is not None
