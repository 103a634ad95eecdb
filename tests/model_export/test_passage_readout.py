"""The passage readout of the text encoder (pooling "passages"): the math against a float64 loop, padding
and batch independence, the batched (traced / GPU) form against the eager one, filler that supports no
class leaves the probabilities alone, ONNX round trip, and the sliced forward for very long documents."""

from __future__ import annotations

import math

import pytest
import torch

from lara_serve.model_export import create_model
from lara_serve.model_export.models import long_forward
from lara_serve.model_export.models import text as text_mod
from lara_serve.model_export.models.text import PassageReadout
from tests.model_export.conftest import export_round_trip, padded_batch


def tiny(size: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    model = create_model("tiny-text", pooling="passages", passage_bytes=size, attention={"eval_noise": "fixed"})
    with torch.no_grad():
        model.head.weight.mul_(30.0)  # confident passages: a wrong grid or mask would show, not average out
    return model.eval()


def reference_logits(model: torch.nn.Module, x: torch.Tensor, size: int) -> torch.Tensor:
    """Float64 loops over one document's final token vectors x [n, D]: passages of `size` rows from the
    first, each one's mean through the head, log of the mean over passages of exp(logit) per class."""
    w, b = model.head.weight.double(), model.head.bias.double()
    n = x.shape[0]
    starts = list(range(0, n, size)) or [0]
    out = []
    for c in range(w.shape[0]):
        terms = []
        for s in starts:
            rows = x[s : s + size].double()
            mean = rows.sum(0) / max(rows.shape[0], 1)
            terms.append(float(mean @ w[c] + b[c]))
        top = max(terms)
        out.append(top + math.log(sum(math.exp(t - top) for t in terms) / len(terms)))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 40, 53])
def test_logits_match_a_float64_reference(n: int) -> None:
    model = tiny(8)
    ids = torch.randint(1, 257, (1, n))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        x = model.forward_features(ids, mask)[0]  # [n, D]
        got = model.forward_head(x[None], mask)[0]
    # float32 means of <= 8 rows of order-1 values and a head of weights x30: about 1e-5 absolute
    torch.testing.assert_close(got.double(), reference_logits(model, x, 8), rtol=1e-5, atol=5e-5)


def reference_pooled(model: torch.nn.Module, x: torch.Tensor, size: int) -> torch.Tensor:
    """Float64 loops: the out-of-distribution feature of one document x [n, D], its passages' means weighted
    by the softmax over passages of each passage's log-sum-exp over classes."""
    w, b = model.head.weight.double(), model.head.bias.double()
    means = [x[s : s + size].double().mean(0) for s in (range(0, x.shape[0], size) or [0])]
    scores = [torch.logsumexp(m @ w.T + b, 0) for m in means]
    top = max(float(v) for v in scores)
    e = [math.exp(float(v) - top) for v in scores]
    return sum(ei / sum(e) * m for ei, m in zip(e, means, strict=True))


@pytest.mark.parametrize("n", [1, 9, 53])
def test_the_readout_gives_logits_and_pooled_feature_in_one_pass(n: int) -> None:
    """forward_readout (what the serving head runs) against the float64 loops, and equal to forward_head and
    forward_pooled called apart."""
    model = tiny(8)
    ids = torch.randint(1, 257, (1, n))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        x = model.forward_features(ids, mask)
        logits, pooled = model.forward_readout(x, mask)
        apart = model.forward_head(x, mask), model.forward_pooled(x, mask)
    torch.testing.assert_close(logits[0].double(), reference_logits(model, x[0], 8), rtol=1e-5, atol=5e-5)
    # weights from x30 head scores: a 1e-6 change of a score moves a weight by ~1e-6; means are order 1
    torch.testing.assert_close(pooled[0].double(), reference_pooled(model, x[0], 8), rtol=1e-5, atol=2e-5)
    torch.testing.assert_close((logits, pooled), apart, rtol=0, atol=0)


def test_a_documents_logits_do_not_depend_on_padding_or_batch() -> None:
    """Eager CPU cuts each document's own rows, so alone, padded or batched it is bitwise the same."""
    model = tiny(8)
    docs = [torch.randint(1, 257, (n,)) for n in (30, 7, 55, 16)]
    ids, mask = padded_batch(docs, 64)  # content under the first row's mask
    with torch.no_grad():
        batched = model(ids, mask)
        pooled = model.forward_pooled(model.forward_features(ids, mask), mask)
        for i, d in enumerate(docs):
            one = torch.ones(1, len(d), dtype=torch.long)
            torch.testing.assert_close(batched[i : i + 1], model(d[None], one), rtol=0, atol=0)
            alone = model.forward_pooled(model.forward_features(d[None], one), one)
            torch.testing.assert_close(pooled[i : i + 1], alone, rtol=0, atol=0)


def test_the_batched_form_agrees_with_the_eager_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The form traced graphs and GPUs run (one padded tensor, right padding) gives the eager logits and
    pooled features, empty documents included (the head's bias, as the mean path gives)."""
    model = tiny(8)
    lengths = (30, 7, 55, 16, 0)
    ids = torch.zeros(len(lengths), 64, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n], mask[i, :n] = torch.randint(1, 257, (n,)), 1
    with torch.no_grad():
        x = model.forward_features(ids, mask)
        eager = model.forward_head(x, mask), model.forward_pooled(x, mask)
        monkeypatch.setattr(text_mod, "tracing", lambda: True)
        batched = model.forward_head(x, mask), model.forward_pooled(x, mask)
    for a, b in zip(eager, batched, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # float32 sums in another order
    torch.testing.assert_close(eager[0][4], model.head.bias, rtol=0, atol=0)


def test_passages_that_support_no_class_leave_the_probabilities_alone() -> None:
    """Appending passages whose logits are far below the article's changes every class's logit by the same
    -log(J'/J) and so not the probabilities; a mean of token vectors would be diluted by them."""
    article = torch.tensor([[[4.0, 1.0, 0.0]], [[3.0, 0.5, 0.2]]]).reshape(1, 2, 3)
    filler = torch.full((1, 10, 3), -30.0)
    real = torch.ones(1, 2, dtype=torch.bool)
    alone = PassageReadout.combine(article, real)
    diluted = PassageReadout.combine(torch.cat([article, filler], 1), torch.ones(1, 12, dtype=torch.bool))
    torch.testing.assert_close(diluted.softmax(-1), alone.softmax(-1), rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(alone - diluted, torch.full((1, 3), math.log(6.0)), rtol=1e-5, atol=1e-5)
    # masked passages count for nothing, whatever they hold
    masked = PassageReadout.combine(torch.cat([article, -filler], 1), torch.tensor([[True] * 2 + [False] * 10]))
    torch.testing.assert_close(masked, alone, rtol=0, atol=0)
    w = PassageReadout.weights(torch.cat([article, filler], 1), torch.ones(1, 12, dtype=torch.bool))
    assert float(w[0, :2].sum()) > 0.999 and float(w.sum()) == pytest.approx(1.0)


def test_passage_readout_round_trips_through_save_export_and_load(tmp_path) -> None:
    loaded = export_round_trip(tiny(16), tmp_path / "tiny-text")
    assert loaded.cfg.pooling == "passages" and loaded.cfg.passage_bytes == 16 and loaded.passages is not None


def test_the_sliced_long_forward_reads_passages_as_the_plain_one(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny(8)
    ids = torch.randint(1, 257, (1, 300))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        monkeypatch.setattr(long_forward, "LONG_FROM", 10**9)
        plain = model(ids, mask)
        monkeypatch.setattr(long_forward, "LONG_FROM", 100)
        monkeypatch.setattr(long_forward, "CHUNK", 64)
        assert long_forward.applies(model, ids)
        sliced = model(ids, mask)
    torch.testing.assert_close(sliced, plain, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("overrides", "message"), [({"passage_bytes": 0}, "passage_bytes must be at least 1")])
def test_bad_passage_settings_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_model("tiny-text", pooling="passages", **overrides)
