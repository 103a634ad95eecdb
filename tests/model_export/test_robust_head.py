"""The filler-robust head (pretrained.robust_head, models.bert_lara.AttentionPool): the flat-segment pool the
fit uses equals the served module and a float64 loop; at score zero the pool is the mean; the fit learns to
outweigh filler that a mean-pool head follows; composites and the cache behave as documented."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from torch import nn

from lara_serve.model_export.models.bert_lara import AttentionPool
from lara_serve.model_export.pretrained.robust_head import (
    CompositeRecipe,
    TokenSet,
    cached,
    composite_batch,
    fit_pool,
    pool_logits,
    pooled_logits,
)


def token_set(rows: list[torch.Tensor]) -> TokenSet:
    lengths = torch.tensor([len(r) for r in rows])
    return TokenSet(torch.cat(rows).half(), torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]))


def test_flat_pool_equals_the_served_module_and_float64() -> None:
    g = torch.Generator().manual_seed(0)
    docs = [torch.randn(n, 16, generator=g) for n in (1, 7, 30)]
    pool = AttentionPool(16)
    head = nn.Linear(16, 3)
    with torch.no_grad():
        pool.score.weight.normal_(generator=g)
        pool.score.bias.fill_(0.3)
    x = torch.cat(docs)
    seg = torch.repeat_interleave(torch.arange(3), torch.tensor([len(d) for d in docs]))
    with torch.no_grad():
        flat = pooled_logits(pool.score.weight[0], pool.score.bias[0], head, x, seg, 3)
        padded = torch.zeros(3, 30, 16)
        mask = torch.zeros(3, 30, dtype=torch.long)
        for i, d in enumerate(docs):
            padded[i, : len(d)], mask[i, : len(d)] = d, 1
        served = head(pool(padded, mask))
        ref = []
        for d in docs:  # float64 loop: softmax of the scores, weighted mean, unit length, head
            w = torch.softmax(d.double() @ pool.score.weight[0].double() + 0.3, 0)
            v = (w[:, None] * d.double()).sum(0)
            ref.append(head.weight.double() @ (v / v.norm()) + head.bias.double())
    # float32 against float64: sums of at most 30 rows of unit-scale values, so ~1e-6 relative
    torch.testing.assert_close(flat.double(), torch.stack(ref), atol=1e-5, rtol=0)
    torch.testing.assert_close(served.double(), torch.stack(ref), atol=1e-5, rtol=0)


def test_zero_score_is_the_mean_pool() -> None:
    x = torch.randn(2, 9, 8)
    mask = torch.tensor([[1] * 9, [1] * 4 + [0] * 5])
    got = AttentionPool(8)(x, mask)
    want = torch.stack([x[0].mean(0), x[1, :4].mean(0)])
    torch.testing.assert_close(got, nn.functional.normalize(want, dim=-1))


def synthetic(n: int, seed: int) -> tuple[TokenSet, torch.Tensor, TokenSet]:
    """Articles whose tokens carry their class (directions 0-2) among neutral tokens, and filler whose tokens
    lean to class 0 and carry a mark of their own (direction 3): a mean-pool head reads long filler as 0."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    docs = []
    for c in y.tolist():
        t = 0.3 * torch.randn(20, 8, generator=g)
        t[:6, c] += 2.0
        docs.append(t)
    fillers = []
    for _ in range(20):
        f = 0.3 * torch.randn(200, 8, generator=g)
        f[:, 0] += 1.0
        f[:, 3] += 2.0
        fillers.append(f)
    return token_set(docs), y, token_set(fillers)


def accuracy_with_filler(pool_w: torch.Tensor, pool_b: torch.Tensor, head: nn.Linear, texts: TokenSet,
                         y: torch.Tensor, fillers: TokenSet) -> float:  # fmt: skip
    recipe = CompositeRecipe(prob=1.0, min_ratio=4.0, max_ratio=8.0)
    x, seg = composite_batch(texts, range(len(texts)), fillers, recipe, random.Random(5))
    with torch.no_grad():
        z = pooled_logits(pool_w, pool_b, head, x, seg, len(texts))
    return float((z.argmax(1) == y).double().mean())


def test_fit_learns_to_outweigh_filler_a_mean_head_follows() -> None:
    fit_set, y_fit, fill_fit = synthetic(90, 0)
    val_set, y_val, fill_val = synthetic(60, 1)
    means = fit_set.means()
    mean_head = nn.Linear(8, 3)
    opt = torch.optim.LBFGS(mean_head.parameters(), max_iter=200)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(mean_head(means), y_fit)
        loss.backward()
        return loss

    opt.step(closure)
    zero = torch.zeros(8), torch.zeros(())
    before = accuracy_with_filler(*zero, mean_head, val_set, y_val, fill_val)
    init = (mean_head.weight.detach().clone(), mean_head.bias.detach().clone())
    fitted = fit_pool((fit_set, y_fit), (val_set, y_val), (fill_fit, fill_val), init, steps=500, lr=1e-2)
    head = nn.Linear(8, 3)
    with torch.no_grad():
        head.weight.copy_(fitted.head_weight)
        head.bias.copy_(fitted.head_bias)
    after = accuracy_with_filler(fitted.pool_weight[0], fitted.pool_bias[0], head, val_set, y_val, fill_val)
    assert before < 0.6  # the mean head follows the filler to class 0
    assert after >= 0.95, (before, after)
    assert fitted.notes["best_step"] > 0
    clean = pool_logits(fitted, val_set).argmax(1)
    assert float((clean == y_val).double().mean()) >= 0.95  # and the articles alone stay right


def test_composites_add_filler_of_the_recipe_ratio() -> None:
    texts = token_set([torch.ones(10, 4), torch.ones(40, 4)])
    fillers = token_set([torch.zeros(7, 4), torch.zeros(3, 4)])
    recipe = CompositeRecipe(prob=1.0, min_ratio=2.0, max_ratio=2.0)
    x, seg = composite_batch(texts, [0, 1], fillers, recipe, random.Random(0))
    assert torch.bincount(seg).tolist() == [30, 120]  # own rows + twice as many filler rows, from several passages
    assert float(x[seg == 0].sum()) == 10 * 4 and float(x[seg == 1].sum()) == 40 * 4
    x, seg = composite_batch(texts, [1], fillers, CompositeRecipe(prob=0.0), random.Random(0))
    assert len(x) == 40


def test_cache_keeps_token_sets_by_their_texts(tmp_path: Path) -> None:
    calls = []

    def make() -> TokenSet:
        calls.append(1)
        return token_set([torch.randn(3, 4), torch.randn(5, 4)])

    a = cached(tmp_path, "fit", ["x", "y"], make)
    b = cached(tmp_path, "fit", ["x", "y"], make)
    cached(tmp_path, "fit", ["x", "z"], make)
    assert len(calls) == 2 and torch.equal(a.states, b.states) and torch.equal(a.offsets, b.offsets)
