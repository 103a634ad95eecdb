"""Shared fixtures for model_export tests: tiny models, data availability skips."""

from __future__ import annotations

import os

import pytest
import torch

from lara_serve.model_export.training import brown
from lara_serve.model_export.training.data import DataUnavailable, load_fashion, load_news


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # the test machine is shared; tiny models gain nothing from threads


def _load_or_skip(loader, split: str):
    """Missing data skips a developer's run, but fails under CI, where `make test` installs it."""
    try:
        return loader(split)
    except DataUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the data packages installed by `make test`: {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def fashion_test():
    return _load_or_skip(load_fashion, "test")


@pytest.fixture(scope="session")
def news_test():
    return _load_or_skip(load_news, "test")


@pytest.fixture(scope="session")
def brown_all() -> list[brown.BrownDoc]:
    try:
        return brown.load_brown("all")
    except brown.BrownUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the Brown corpus unpacked by `make test`: {e}")
        pytest.skip(str(e))


def export_round_trip(model: torch.nn.Module, model_dir) -> torch.nn.Module:
    """Save a tiny-text model, export its ONNX graph, load it back: the loaded torch model must equal the
    saved one bitwise and the graph must pass the export's parity check. Returns the loaded model."""
    from lara_serve.model_export import load_pretrained
    from lara_serve.model_export.export import exporter as ex
    from lara_serve.model_export.models.registry import LABELS

    conf = ex.make_config_dict("tiny-text", model.cfg, LABELS["tiny-text"], seed=0, metrics={})
    ex.save_pretrained(model, conf, model_dir)
    ex.export_model_dir(model_dir)
    loaded = load_pretrained(model_dir)
    ids = torch.randint(1, 257, (3, 120))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask), model(ids, mask), rtol=0, atol=0)
    rows = ex.measure_parity(loaded, loaded.cfg, ex.make_session(model_dir / "1" / ex.ONNX_FILE))
    assert rows and all(r["max_abs_diff"] <= ex.PARITY_ATOL and r["argmax_equal"] for r in rows), rows
    return loaded


def padded_batch(docs: list[torch.Tensor], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask) [len(docs), width] of 1-D id tensors, with content (id 99)
    under the first row's mask past position 40: a model that reads padding would show it."""
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, d in enumerate(docs):
        ids[i, : len(d)], mask[i, : len(d)] = d, 1
    ids[0, 40:] = torch.where(mask[0, 40:] > 0, ids[0, 40:], 99)
    return ids, mask


def assert_padding_invariant(model: torch.nn.Module, seqs: list[list[int]], atol: float) -> None:
    """A text model's logits for each sequence are the same in a padded batch as alone (up to `atol`)."""
    from lara_serve.model_export.training.data import pad_batch

    ids, mask = pad_batch(seqs)
    with torch.no_grad():
        batched = model(ids, mask)
        for i, s in enumerate(seqs):
            alone = model(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.int64))
            torch.testing.assert_close(batched[i : i + 1], alone, atol=atol, rtol=0)
