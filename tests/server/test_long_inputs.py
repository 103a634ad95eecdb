"""Documents up to 1 MiB: an item over the token budget runs alone in its batch, the body limit lets a 1 MiB
text through (even JSON-escaped), a synthetic model with max_length 1,048,576 classifies one in bounded time,
and one byte more is a 413 that names the limit."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest
from server_helpers import serve

from lara_serve.server import Settings
from lara_serve.server.backends import ModelOutputs, create_backend
from lara_serve.server.batcher import Batcher, BatchPolicy
from lara_serve.server.models import ServedModel, policy_from
from lara_serve.server.repository import read_config
from lara_serve.server.synthetic import make_text_model

pytestmark = pytest.mark.anyio
MIB = 1 << 20
MODEL = "mib-text"


async def test_an_item_over_the_token_budget_runs_alone() -> None:
    batches: list[list[int]] = []

    def run(lengths: list[int]) -> list[int]:
        batches.append(lengths)
        return lengths

    policy = BatchPolicy(max_batch_size=8, max_batch_tokens=1000, max_queue_delay_s=0.05, max_queue_size=64)
    batcher: Batcher[int, int] = Batcher("m", run, policy)
    batcher.start()
    # 5000 > the budget; 600 is within it but two of them (or 600 + a short one padded to 600) are not.
    lengths = [10, 5000, 10, 600, 10, 10, 5000]
    results = await asyncio.gather(*batcher.submit([(n, n) for n in lengths]))
    await batcher.stop()
    assert [r.value for r in results] == lengths
    for batch in batches:
        assert max(batch) * len(batch) <= 1000 or len(batch) == 1, batches
    assert sorted(b for b in batches if max(b) >= 600) == [[600], [5000], [5000]]
    assert all(r.batch_size == 1 for r, n in zip(results, lengths, strict=True) if n >= 600)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mib_repository")
    make_text_model(root, MODEL, max_length=MIB)
    return root


class Recording:
    """The real onnxruntime backend, recording the [batch, length] of every batch it runs."""

    def __init__(self, model_dir: Path) -> None:
        self.config = read_config(model_dir)
        self.inner = create_backend("onnxruntime", model_dir, self.config, "cpu")
        self.name, self.device = self.inner.name, self.inner.device
        self.shapes: list[tuple[int, int]] = []

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.run_outputs(inputs).logits

    def run_outputs(self, inputs: dict[str, np.ndarray]) -> ModelOutputs:
        self.shapes.append(inputs["input_ids"].shape)
        return self.inner.run_outputs(inputs)

    def close(self) -> None:
        self.inner.close()


def document(n: int) -> str:
    words = b"markets rallied as the central bank held rates and investors bought shares "
    return (words * (n // len(words) + 1))[:n].decode()


async def test_a_mib_document_is_classified_whole_and_alone(repo: Path) -> None:
    settings = Settings(model_repository=repo, max_queue_delay_ms=20.0)
    assert settings.max_batch_tokens < MIB  # so the 1 MiB document must run alone
    backend = Recording(repo / MODEL)
    model = ServedModel(backend.config, backend, policy_from(settings))  # type: ignore[arg-type]
    doc = document(MIB)
    async with serve(settings, [model]) as client:
        t0 = time.perf_counter()
        raw = await client.post(f"/v1/models/{MODEL}:classify", content=doc.encode(),
                                headers={"content-type": "text/plain"}, timeout=120)  # fmt: skip
        assert time.perf_counter() - t0 < 60, "a 1 MiB document took over a minute on the synthetic model"
        assert raw.status_code == 200 and raw.json()["truncated"] is False, raw.text
        together = await client.post(f"/v1/models/{MODEL}:predict", json={"instances": [doc, "short one", "another"]},
                                     timeout=120)  # fmt: skip
        assert together.status_code == 200, together.text
        assert [p["truncated"] for p in together.json()["predictions"]] == [False, False, False]
        assert together.json()["predictions"][0]["label"] == raw.json()["label"]
        over = await client.post(f"/v1/models/{MODEL}:classify", content=doc.encode() + b"x",
                                 headers={"content-type": "text/plain"})  # fmt: skip
        assert over.status_code == 413 and str(MIB) in over.json()["error"]
    long_batches = [s for s in backend.shapes if s[1] == MIB]
    assert long_batches == [(1, MIB), (1, MIB)], backend.shapes  # whole, and alone both times


async def test_the_body_limit_lets_an_escaped_mib_through(repo: Path) -> None:
    """1 MiB of 'é' as JSON with \\u escapes is a 3 MiB body: within the default max_body_bytes."""
    doc = "é" * (MIB // 2)
    body = json.dumps({"instances": [doc]}).encode()  # ensure_ascii: "\\u00e9" per character
    assert len(body) > 3 * MIB - 100 and len(body) <= Settings(model_repository=repo).max_body_bytes
    async with serve(Settings(model_repository=repo)) as client:
        r = await client.post(f"/v1/models/{MODEL}:predict", content=body,
                              headers={"content-type": "application/json"}, timeout=120)  # fmt: skip
    assert r.status_code == 200 and r.json()["predictions"][0]["truncated"] is False, r.text


async def test_explaining_a_256k_document(repo: Path) -> None:
    doc = document(256 * 1024)
    async with serve(Settings(model_repository=repo)) as client:
        r = await client.post(f"/v1/models/{MODEL}:explain", json={"instances": [doc]}, timeout=120)
    assert r.status_code == 200, r.text
    passages = r.json()["explanations"][0]["passages"]
    assert 8 <= len(passages) <= 16 and passages[-1]["end"] == len(doc.encode())
    assert "".join(p["text"] for p in passages) == doc
