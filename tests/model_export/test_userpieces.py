"""`lara train` computes a text batch past its token budget in pieces (issue 54: the speeches' peak memory): the
pieces, and the gradient they give, equal to the whole batch's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lara_serve.model_export.models.registry import build_model, get_config
from lara_serve.model_export.training.data import pad_batch
from lara_serve.model_export.training.long_docs import to_ids
from lara_serve.model_export.your_data import pieces


def _batch(lengths: list[int]) -> dict[str, torch.Tensor]:
    ids, mask = pad_batch([to_ids(bytes([97 + i % 26 for i in range(n)]) + b" goal") for n in lengths])
    return {"input_ids": ids, "attention_mask": mask}


def test_a_batch_past_the_budget_is_cut_into_runs_each_as_long_as_its_longest() -> None:
    inputs = _batch([295, 195, 95, 245])  # real lengths 300, 200, 100, 250 (5 bytes of " goal" each)
    got = pieces.split(inputs, 400)
    assert [rows for rows, _ in got] == [slice(0, 1), slice(1, 3), slice(3, 4)]  # 200 x 2 fits, 250 x 2 does not
    assert [tuple(p["input_ids"].shape) for _, p in got] == [(1, 300), (2, 200), (1, 250)]
    for rows, piece in got:
        assert torch.equal(piece["attention_mask"], inputs["attention_mask"][rows, : piece["attention_mask"].shape[1]])
        assert bool(piece["attention_mask"][:, -1].any())  # no all-padding column left
    whole = [(slice(None), inputs)]
    assert pieces.split(inputs, 1200) == whole and pieces.split(inputs, None) == whole  # within the budget
    image = {"pixel_values": torch.zeros(4, 1, 8, 8)}
    assert pieces.split(image, 1) == [(slice(None), image)]
    one = _batch([2000])
    assert pieces.split(one, 400) == [(slice(None), one)]  # one example: nothing to cut


def test_the_pieces_give_the_whole_batchs_gradient_loss_and_count() -> None:
    model = build_model(get_config("tiny-text", num_classes=3, max_length=1024), seed=0).eval()  # no dropout
    inputs, labels = _batch([295, 195, 95, 245]), torch.tensor([0, 2, 1, 2])
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)

    def grads(max_tokens: int | None) -> tuple[list[torch.Tensor], tuple[int, float]]:
        model.zero_grad(set_to_none=True)
        out = pieces.train_step(model, inputs, labels, loss_fn, 0.5, max_tokens)
        return [p.grad.clone() for p in model.parameters() if p.grad is not None], out

    whole, (correct, loss_sum) = grads(None)
    cut, (correct_cut, loss_sum_cut) = grads(400)
    assert len(whole) == len(cut) > 0 and correct == correct_cut
    assert loss_sum_cut == pytest.approx(loss_sum, rel=1e-5)
    scale = max(float(g.abs().max()) for g in whole)
    for a, b in zip(whole, cut, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5 * scale)


def test_outputs_after_training_in_chunks_equal_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The serving head's text outputs, computed in length-sorted chunks with memory handed back between them,
    come back in input order and equal one call's."""
    from lara_serve.model_export.head.finalize import text_outputs
    from lara_serve.model_export.your_data import prepare

    model = build_model(get_config("tiny-text", num_classes=3, max_length=1024), seed=0).eval()
    raws = [bytes([97 + (i * 7 + j) % 26 for j in range(40 + (i * 37) % 300)]) for i in range(11)]
    monkeypatch.setattr(prepare, "OUTPUT_CHUNK", 3)
    z, f = prepare.chunked_outputs(model, raws)
    z1, f1 = text_outputs(model, raws)
    assert z.shape == z1.shape and f.shape == f1.shape
    torch.testing.assert_close(z, z1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(f, f1, rtol=1e-4, atol=1e-5)
