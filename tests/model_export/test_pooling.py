"""Attention pooling of the text encoder: the math against a float64 loop, padding and batch independence,
export round trip, bad settings refused."""

from __future__ import annotations

import pytest
import torch

from lara_serve.model_export import create_model
from lara_serve.model_export.models.text import AttentionPool
from tests.model_export.conftest import export_round_trip, padded_batch


def reference_pool(pool: AttentionPool, x: torch.Tensor, n: int) -> torch.Tensor:
    """Float64 loops over one document's first n rows: per group, softmax of its scores, weighted sum."""
    x64 = x[:n].double()
    w, b = pool.score.weight.double(), pool.score.bias.double()
    d = x.shape[-1] // pool.groups
    out = torch.zeros(x.shape[-1], dtype=torch.float64)
    for g in range(pool.groups):
        s = torch.tensor([float(x64[i] @ w[g] + b[g]) for i in range(n)], dtype=torch.float64)
        a = torch.exp(s - s.max())
        a = a / a.sum()
        for i in range(n):
            out[g * d : (g + 1) * d] += a[i] * x64[i, g * d : (g + 1) * d]
    return out


def test_pooling_matches_a_float64_reference_and_ignores_padding() -> None:
    torch.manual_seed(0)
    pool = AttentionPool(12, 3)
    with torch.no_grad():
        pool.score.weight.mul_(20.0)  # sharp weights: a wrong mask or group would show, not average out
        x = torch.randn(2, 9, 12)
        x[0, 5:] = 1e3  # padding rows with huge values must get weight exactly 0
        valid = torch.tensor([[True] * 5 + [False] * 4, [True] * 9])
        got = pool(x, valid)
    for row, n in enumerate((5, 9)):
        # float32 softmax and a 9-term weighted sum: about 1e-6 relative to values of order 1
        torch.testing.assert_close(got[row].double(), reference_pool(pool, x[row], n), rtol=1e-5, atol=1e-5)


def test_zero_scores_give_the_masked_mean_and_no_tokens_give_zeros() -> None:
    pool = AttentionPool(8, 2)
    with torch.no_grad():
        pool.score.weight.zero_()
        pool.score.bias.zero_()
        x = torch.randn(2, 6, 8)
        valid = torch.tensor([[True] * 4 + [False] * 2, [False] * 6])
        got = pool(x, valid)
    torch.testing.assert_close(got[0], x[0, :4].mean(0), rtol=1e-6, atol=1e-6)
    assert torch.equal(got[1], torch.zeros(8))  # a mean of nothing is 0 in the mean path too, not NaN


def test_a_documents_logits_do_not_depend_on_padding_or_batch() -> None:
    """Eager CPU pools each document's own rows, so alone, padded or batched it is bitwise the same."""
    torch.manual_seed(0)
    model = create_model("tiny-text", pooling="attention", attention={"eval_noise": "fixed"}).eval()
    docs = [torch.randint(1, 257, (n,)) for n in (30, 7, 55)]
    ids, mask = padded_batch(docs, 60)  # content under the first row's mask
    with torch.no_grad():
        batched = model(ids, mask)
        for i, d in enumerate(docs):
            alone = model(d[None], torch.ones(1, len(d), dtype=torch.long))
            torch.testing.assert_close(batched[i : i + 1], alone, rtol=0, atol=0)


def test_attention_pooling_round_trips_through_save_export_and_load(tmp_path) -> None:
    torch.manual_seed(0)
    model = create_model("tiny-text", pooling="attention", attention={"eval_noise": "fixed"}).eval()
    with torch.no_grad():
        model.pool.score.weight.normal_(std=1.0)  # away from the near-uniform init: the graph must carry it
    loaded = export_round_trip(model, tmp_path / "tiny-text")
    assert loaded.cfg.pooling == "attention" and loaded.pool is not None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"pooling": "max"}, r"pooling must be one of \('mean', 'attention', 'passages'\), got 'max'"),
        ({"pooling": "attention", "heads": 3}, "divisible"),
    ],
)
def test_bad_pooling_settings_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_model("tiny-text", **overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"positions": "rope"}, r"positions must be one of \('sinusoidal', 'conv'\), got 'rope'"),
        ({"attention": {"eval_noise": "sampled"}}, r"eval_noise must be one of \('mean', 'fixed'\)"),
        ({"attention": {"landmark_module": "heavy"}}, r"landmark_module must be one of \('light', 'none'\)"),
    ],
)
def test_misspelt_config_choices_are_refused_not_defaulted(overrides: dict, message: str) -> None:
    # Before the check, positions "rope" built a model with sinusoidal positions and no error.
    with pytest.raises(ValueError, match=message):
        create_model("tiny-text", **overrides)


def test_pool_lr_mult_moves_the_pooling_scores_that_many_times_faster(tmp_path) -> None:
    """Adam's first steps move each weight by about the lr: with --pool-lr-mult 40 the pooling scores move
    ~40x as far as with the base lr, from the same initial weights, and nothing else changes speed."""
    from safetensors.torch import load_file

    from lara_serve.model_export.training import train

    moved = {}
    for mult, steps in ((0.0, 0), (1.0, 2), (40.0, 2)):  # 0 steps: the initial weights, the same for all
        out = tmp_path / f"m{mult}"
        argv = ["--model", "lara-text-news-bytes", "--limit", "16", "--max-steps", str(steps), "--epochs", "1"]
        argv += ["--eval-limit", "4"]
        argv += ["--no-test", "--threads", "1", "--train-length", "256", "--batch-size", "4", "--lr", "1e-3"]
        argv += ["--override", '{"pooling": "attention", "depth": 1, "ngram_buckets": 0}', "--pool-lr-mult", str(mult)]
        train.main([*argv, "--out", str(out), "--run-dir", str(tmp_path / f"ckpt{mult}")])
        moved[mult] = load_file(str(out / "1" / "model.safetensors"))
    init = moved.pop(0.0)
    step = {m: (s["pool.score.weight"] - init["pool.score.weight"]).abs().mean().item() for m, s in moved.items()}
    head = {m: (s["head.weight"] - init["head.weight"]).abs().mean().item() for m, s in moved.items()}
    assert step[40.0] > 15 * step[1.0] > 0
    assert head[40.0] == pytest.approx(head[1.0], rel=0.5)
