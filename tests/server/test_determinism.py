"""A result must not depend on batching; the same request twice gives the same bytes; backends agree."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from server_helpers import TEXT, serve

from lara_serve.server import Settings
from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
from lara_serve.server.backends.pytorch import TorchBackend
from lara_serve.server.batcher import BatchPolicy
from lara_serve.server.models import ServedModel
from lara_serve.server.preprocess import collate, text_item
from lara_serve.server.repository import read_config
from lara_serve.server.synthetic import load_synthetic

pytestmark = pytest.mark.anyio
DOC = "the quarterly results beat the market's expectations " * 2
OTHERS = ["a", "goal!" * 40, "x" * 250, "orbit launch " * 7, "bank"]


def v2_raw(texts: list[str]) -> dict[str, object]:
    return {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}


async def test_alone_vs_batched_with_other_lengths(make_settings: Callable[..., Settings]) -> None:
    # A long delay and a big batch make the concurrent requests share one batch, padded to 250 tokens.
    async with serve(make_settings(max_batch_size=16, max_queue_delay_ms=200.0)) as c:
        first = await c.post(f"/v2/models/{TEXT}/infer", json=v2_raw([DOC]))
        assert first.status_code == 200, first.text
        alone = first.json()["outputs"][0]["data"]
        responses = await asyncio.gather(
            *(c.post(f"/v2/models/{TEXT}/infer", json=v2_raw([t])) for t in [DOC, *OTHERS])
        )
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    assert int(responses[0].headers["x-batch-size"]) > 1  # it really was batched
    batched = responses[0].json()["outputs"][0]["data"]
    # Bitwise, not just close: the synthetic model pools exact zeros on padding, and softmax runs per row in
    # float64, so a padded neighbour cannot change a single bit.
    assert batched == alone


async def test_same_request_twice_is_bitwise_identical(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings()) as c:
        body = {"instances": [DOC, *OTHERS]}
        first = await c.post(f"/v1/models/{TEXT}:predict", json=body)
        second = await c.post(f"/v1/models/{TEXT}:predict", json=body)
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert len(first.json()["predictions"]) == 1 + len(OTHERS)
    assert first.content == second.content


def test_padding_does_not_change_logits(repo: Path) -> None:
    """Backend level: a row padded to 250 tokens vs unpadded, both backends."""
    config = read_config(repo / TEXT)
    prep = config.preprocessing
    doc, long = text_item(DOC.encode(), prep, False), text_item(b"y" * 250, prep, False)  # type: ignore[arg-type]
    for backend in (OnnxRuntimeBackend(repo / TEXT, config, "cpu"),
                    TorchBackend(repo / TEXT, config, "cpu", loader=load_synthetic)):  # fmt: skip
        alone = backend.run(collate([doc], config))[0]
        padded = backend.run(collate([long, doc], config))[1]
        np.testing.assert_allclose(padded, alone, rtol=0, atol=1e-6)


async def test_backends_agree(repo: Path, make_settings: Callable[..., Settings]) -> None:
    config = read_config(repo / TEXT)
    torch_model = ServedModel(config, TorchBackend(repo / TEXT, config, "cpu", loader=load_synthetic), BatchPolicy())
    body = {"instances": [DOC, *OTHERS], "parameters": {"top_k": 4}}
    async with serve(make_settings(), [torch_model]) as c:
        torch_response = await c.post(f"/v1/models/{TEXT}:predict", json=body)
    async with serve(make_settings()) as c:
        onnx_response = await c.post(f"/v1/models/{TEXT}:predict", json=body)
    assert torch_response.status_code == onnx_response.status_code == 200
    from_torch, from_onnx = torch_response.json()["predictions"], onnx_response.json()["predictions"]
    assert len(from_torch) == len(from_onnx) == 1 + len(OTHERS)
    for t, o in zip(from_torch, from_onnx, strict=True):
        assert t["label"] == o["label"]
        np.testing.assert_allclose([s["score"] for s in t["top_k"]], [s["score"] for s in o["top_k"]], atol=1e-5)


SHIPPED_TEXT = Path(__file__).resolve().parents[2] / "model_repository" / "lara-text-news-bytes"


def test_shipped_text_model_on_torch_is_bitwise_batch_invariant() -> None:
    """The guarantee on the torch backend: a document's logits have the same bits alone and in a batch
    padded to a longer neighbour (onnxruntime: README states the measured difference instead)."""
    config = read_config(SHIPPED_TEXT)
    prep = config.preprocessing
    backend = TorchBackend(SHIPPED_TEXT, config, "cpu")
    items = [text_item(t.encode(), prep, False) for t in [DOC, *OTHERS, "y" * 3_000]]  # type: ignore[arg-type]
    batched = backend.run(collate(items, config))
    for i, item in enumerate(items):
        alone = backend.run(collate([item], config))[0]
        assert np.array_equal(alone, batched[i]), f"item {i}: max diff {np.abs(alone - batched[i]).max():.2e}"
