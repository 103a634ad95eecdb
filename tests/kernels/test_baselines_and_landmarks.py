"""Public softmax / Performer / RA functions and the landmark helpers."""

from __future__ import annotations

import pytest
import torch

from lara_serve import kernels
from lara_serve.kernels.landmarks import chunk_assignment
from lara_serve.kernels.reference import (
    orthogonal_gaussian_projection,
    performer_attention_ref,
    randomized_attention_ref,
    softmax_attention_ref,
)
from tests.kernels.conftest import make_inputs, tail_padding

# fp32 public paths vs the float64 reference on O(1) outputs: fp32 rounding accumulated over <= 100 keys.
ATOL_FP32 = 1e-5


@pytest.mark.parametrize("n", [1, 97])
@pytest.mark.parametrize("padded", [False, True])
def test_baselines_match_reference(n, padded):
    q, k, v, _, _ = make_inputs(2, 2, n, 32, 1, seed=n)
    mask = tail_padding([n, max(n // 3, 1)], n) if padded else None
    proj = orthogonal_gaussian_projection(2, 16, 32, torch.Generator().manual_seed(0))
    q32, k32, v32 = (t.float() for t in (q, k, v))
    cases = {
        "softmax": (
            kernels.softmax_attention(q32, k32, v32, key_padding_mask=mask),
            softmax_attention_ref(q, k, v, mask),
        ),
        "performer": (
            kernels.performer_attention(q32, k32, v32, proj.float(), key_padding_mask=mask),
            performer_attention_ref(q, k, v, proj, mask),
        ),
        "ra": (
            kernels.randomized_attention(q32, k32, v32, key_padding_mask=mask),
            randomized_attention_ref(q, k, v, mask),
        ),
    }
    for name, (fast, ref) in cases.items():
        assert fast.dtype == torch.float32, name
        torch.testing.assert_close(fast.double(), ref, rtol=0, atol=ATOL_FP32, msg=name)


def test_fully_padded_baselines_are_zero():
    q, k, v, _, _ = make_inputs(2, 2, 5, 16, 1, seed=1, dtype=torch.float32)
    mask = tail_padding([5, 0], 5)
    proj = orthogonal_gaussian_projection(2, 8, 16, torch.Generator().manual_seed(0)).float()
    outs = [
        kernels.softmax_attention(q, k, v, key_padding_mask=mask),
        kernels.performer_attention(q, k, v, proj, key_padding_mask=mask),
        kernels.randomized_attention(q, k, v, key_padding_mask=mask),
    ]
    for out in outs:
        assert not out.isnan().any() and (out[1] == 0).all()


def test_ra_fixed_noise_is_deterministic_and_batch_independent():
    q, k, v, _, _ = make_inputs(3, 2, 11, 16, 1, seed=2, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    noise, uniforms = torch.randn(1, 2, 11, 16, generator=g), torch.rand(1, 2, 11, generator=g)
    out = kernels.randomized_attention(q, k, v, noise=noise, uniforms=uniforms)
    assert torch.equal(out, kernels.randomized_attention(q, k, v, noise=noise, uniforms=uniforms))
    alone = kernels.randomized_attention(q[2:], k[2:], v[2:], noise=noise, uniforms=uniforms)
    torch.testing.assert_close(alone, out[2:], rtol=0, atol=1e-6)


def test_chunk_landmarks_use_valid_tokens_only():
    x = torch.arange(10, dtype=torch.float64).reshape(1, 1, 10, 1).expand(2, 1, 10, 1).contiguous()
    mask = tail_padding([10, 6], 10)
    lm = kernels.chunk_means_1d(x, 3, mask)[:, 0, :, 0]  # [B, C]
    # 10 valid tokens -> chunks [0,3) [3,6) [6,10); 6 valid -> [0,2) [2,4) [4,6)
    torch.testing.assert_close(lm[0], torch.tensor([1.0, 4.0, 7.5], dtype=torch.float64))
    torch.testing.assert_close(lm[1], torch.tensor([0.5, 2.5, 4.5], dtype=torch.float64))
    x2 = x.clone()
    x2[1, :, 6:] = 1e6
    torch.testing.assert_close(kernels.chunk_means_1d(x2, 3, mask), kernels.chunk_means_1d(x, 3, mask))


def test_short_sequences_use_each_token_as_a_landmark():
    """N <= C (spec C_eff = N): every landmark is a real token, each token used; C stays fixed."""
    valid = tail_padding([3], 5).logical_not()
    a = chunk_assignment(valid, 8)  # [1, 8, 5]
    assert a.shape == (1, 8, 5)
    assert ((a == 0) | (a == 1)).all() and (a.sum(-1) == 1).all()
    assert set(a[0].argmax(-1).tolist()) == {0, 1, 2}
    empty = chunk_assignment(torch.zeros(1, 4, dtype=torch.bool), 2)
    assert (empty == 0).all()


def test_min_chunk_landmarks_hold_at_least_that_many_tokens():
    """min_chunk M: a sequence of n < C * M valid tokens has k = max(1, n // M) chunks, landmark c the mean of
    chunk floor(c k / C); padding still never enters; n >= C * M and M = 1 are the plain rule."""
    x = torch.arange(10, dtype=torch.float64).reshape(1, 1, 10, 1).expand(3, 1, 10, 1).contiguous()
    mask = tail_padding([10, 3, 9], 10)
    lm = kernels.chunk_means_1d(x, 4, mask, min_chunk=4)[:, 0, :, 0]  # [B, C]
    # 10 tokens -> 2 chunks [0,5) [5,10), each landmark twice; 3 tokens -> one chunk [0,3); 9 -> [0,4) [4,9)
    torch.testing.assert_close(lm[0], torch.tensor([2.0, 2.0, 7.0, 7.0], dtype=torch.float64))
    torch.testing.assert_close(lm[1], torch.tensor([1.0] * 4, dtype=torch.float64))
    torch.testing.assert_close(lm[2], torch.tensor([1.5, 1.5, 6.0, 6.0], dtype=torch.float64))
    x2 = x.clone()
    x2[1, :, 3:] = 1e6
    torch.testing.assert_close(kernels.chunk_means_1d(x2, 4, mask, min_chunk=4), kernels.chunk_means_1d(x, 4, mask, 4))
    valid = torch.arange(300)[None, :] < torch.tensor([[1], [7], [63], [64], [255], [256], [300]])
    for m in (2, 4):  # long enough for C chunks of m tokens: the plain rule
        long = valid[valid.sum(-1) >= 64 * m]
        assert len(long) >= 2
        torch.testing.assert_close(chunk_assignment(long, 64, m), chunk_assignment(long, 64))
    # M = 1 is the plain rule at every length (a chunk of the plain rule holds floor((c+1) n / C) - floor(c n / C))
    plain = chunk_assignment(valid, 64)
    torch.testing.assert_close(chunk_assignment(valid, 64, 1), plain)
    assert torch.equal(((chunk_assignment(valid, 64, 4) > 0).sum(-1) >= 4)[1:], torch.ones(6, 64, dtype=torch.bool))
    with pytest.raises(ValueError, match="min_chunk"):
        chunk_assignment(valid, 64, 0)


def test_pool_2d_shapes_and_errors():
    x = torch.randn(2, 3, 14 * 14, 8)
    lm = kernels.pool_2d(x, (14, 14), 49)
    assert lm.shape == (2, 3, 49, 8)
    torch.testing.assert_close(lm[:, :, 0], x.reshape(2, 3, 14, 14, 8)[:, :, :2, :2].mean((2, 3)))
    with pytest.raises(ValueError, match="perfect-square"):
        kernels.pool_2d(x, (14, 14), 50)
    with pytest.raises(ValueError, match="grid"):
        kernels.pool_2d(x, (14, 13), 49)
