"""The sliced forward for very long documents (lara_serve.model_export.models.long_forward): against a float64 reference of
the plain forward, bitwise independent of batch and padding, deterministic, and only where it applies.

The thresholds are lowered so that a few hundred tokens exercise what a 1 MiB document does: many slices,
slices shorter than the embedding halo, a last slice of a few rows.
"""

from __future__ import annotations

import copy

import pytest
import torch

from lara_serve.model_export import create_model
from lara_serve.model_export.models import long_forward

CONFIGS = {
    # the shipped text models' kind: conv positions, byte n-grams, attention pooling, case folding
    "conv-ngrams-attnpool": {"pooling": "attention", "case_fold": True, "depth": 2, "conv_kernel": 5},
    # the other embedding paths: absolute positions, hashed whole words (a 16-byte left halo), fixed noise
    "sinusoidal-words-fixednoise": {
        "positions": "sinusoidal",
        "word_buckets": 31,
        "ngram_orders": (2, 3, 4, 5),
        "attention": {"kind": "lara", "num_landmarks": 4, "eval_noise": "fixed"},
    },
}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = create_model("tiny-text", **CONFIGS[name]).eval()
    with torch.no_grad():  # larger weights than init's 0.02, so that rounding differences would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def _features(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.forward_features(ids, mask)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize(("n", "chunk"), [(1025, 97), (333, 7), (97, 1)])
def test_sliced_features_match_a_float64_reference(
    name: str, n: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sliced fp32 features may be at most 2x as far from the float64 plain forward as the plain fp32
    forward is (the plain forward's own float32 error sets the scale; both paths run float32 arithmetic with
    different summation orders)."""
    model = _model(name)
    ids = torch.randint(1, 257, (1, n), generator=torch.Generator().manual_seed(n))
    mask = torch.ones_like(ids)
    monkeypatch.setattr(long_forward, "LONG_FROM", 10**9)
    reference = _features(copy.deepcopy(model).double(), ids, mask)  # the plain forward in float64
    plain = _features(model, ids, mask)
    monkeypatch.setattr(long_forward, "LONG_FROM", 0)
    monkeypatch.setattr(long_forward, "CHUNK", chunk)
    sliced = _features(model, ids, mask)
    assert sliced.dtype == torch.float32 and sliced.shape == plain.shape
    plain_err = (plain.double() - reference).abs().max().item()
    sliced_err = (sliced.double() - reference).abs().max().item()
    assert 0 < plain_err < 1e-4  # the scale is a float32 rounding error, not a bug in the reference
    assert sliced_err <= 2 * plain_err + 1e-6, (sliced_err, plain_err)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_document_is_the_same_bits_alone_and_in_any_batch(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(name)
    monkeypatch.setattr(long_forward, "LONG_FROM", 100)
    monkeypatch.setattr(long_forward, "CHUNK", 64)
    gen = torch.Generator().manual_seed(1)
    docs = [torch.randint(1, 257, (n,), generator=gen) for n in (300, 181)]
    alone = [_features(model, d[None], torch.ones(1, len(d), dtype=torch.long))[0] for d in docs]
    ids = torch.zeros(2, 310, dtype=torch.long)
    mask = torch.zeros_like(ids)
    ids[0, 10:], mask[0, 10:] = docs[0], 1  # left padding
    ids[1, :181], mask[1, :181] = docs[1], 1  # right padding
    ids[1, 181:] = 77  # what padded positions hold must not matter
    batch = _features(model, ids, mask)
    assert torch.equal(batch[0, 10:], alone[0]) and torch.equal(batch[1, :181], alone[1])
    assert not batch[0, :10].any() and not batch[1, 181:].any()  # padded rows are zeros
    with torch.inference_mode():
        logits_batch = model(ids, mask)
        logits_alone = [model(d[None], torch.ones(1, len(d), dtype=torch.long)) for d in docs]
    assert torch.equal(logits_batch, torch.cat(logits_alone))
    assert torch.equal(_features(model, ids, mask), batch)  # deterministic


def test_only_eager_inference_of_long_lara_inputs_takes_the_sliced_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(long_forward, "LONG_FROM", 100)
    model = _model("conv-ngrams-attnpool")
    long_ids, short_ids = torch.ones(1, 101, dtype=torch.long), torch.ones(1, 100, dtype=torch.long)
    with torch.inference_mode():
        assert long_forward.applies(model, long_ids)
        assert not long_forward.applies(model, short_ids)
    assert not long_forward.applies(model, long_ids)  # gradients on: training keeps the plain forward
    with torch.no_grad():
        assert not long_forward.applies(model.train(), long_ids)
        softmax = create_model("tiny-text", attention="softmax").eval()
        assert not long_forward.applies(softmax, long_ids)
