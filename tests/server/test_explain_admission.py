""":explain admitted like any request: occluded variants built a token budget at a time (memory does not grow
with the number of passages), other clients' requests run between the chunks, a request that cannot finish is
refused before its passes run, and contributions in log-odds that a confident answer does not saturate."""

from __future__ import annotations

import asyncio
import math
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import serve

from lara_serve.server import Settings
from lara_serve.server.backends import ModelOutputs
from lara_serve.server.batcher import BatchResult
from lara_serve.server.explain import Passage, Plan, _chunks, _rows, explain, log_odds
from lara_serve.server.models import Scored, ServedModel, policy_from
from lara_serve.server.preprocess import IDS, MASK, Item
from lara_serve.server.repository import read_config
from lara_serve.server.synthetic import make_text_model

pytestmark = pytest.mark.anyio
MODEL = "admission-text"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explain_admission")
    make_text_model(root, MODEL, max_length=1 << 20)
    return root


class _Stub:
    """A backend that answers at once (or after `delay_s`) with fixed logits: the server's own costs alone."""

    def __init__(self, model_dir: Path, delay_s: float = 0.0) -> None:
        self.config = read_config(model_dir)
        self.name, self.device, self.delay_s = "stub", "cpu", delay_s
        self.batches: list[int] = []  # items per batch, in order

    def run(self, inputs: dict[str, Any]) -> Any:
        return self.run_outputs(inputs).logits

    def run_outputs(self, inputs: dict[str, Any]) -> ModelOutputs:
        time.sleep(self.delay_s)
        batch = inputs[IDS].shape[0]
        self.batches.append(batch)
        logits = np.zeros((batch, len(self.config.labels)), np.float32)
        logits[:, 0] = 1.0
        ood = np.zeros(batch, np.float32) if self.config.has_ood_output else None
        return ModelOutputs(logits, ood)

    def close(self) -> None:
        pass


def _text_item(n: int) -> Item:
    ids = np.full(n, 98, np.int64)
    ids[::97] = 33  # "." bytes + 1 ... sentence ends are not needed: passages are forced at whitespace or bytes
    return Item({IDS: ids, MASK: np.ones(n, np.int64)}, length=n)


def test_chunks_hold_the_token_budget_and_cover_every_passage() -> None:
    plans = [
        Plan(_text_item(100), b"", [Passage(0, 50), Passage(50, 100)]),
        Plan(_text_item(10), b"", [Passage(0, 10)]),  # one passage: no runs
        Plan(_text_item(300), b"", [Passage(0, 100), Passage(100, 200), Passage(200, 300)]),
    ]
    chunks = _chunks(plans, budget=250)
    flat = [run for _, chunk in chunks for run in chunk]
    assert flat == [(0, 0), (0, 1), (2, 0), (2, 1), (2, 2)]
    assert [start for start, _ in chunks] == [0, 2, 3, 4]
    for _, chunk in chunks:  # within the budget, or a single variant longer than it
        assert len(chunk) == 1 or sum(plans[i].item.length for i, _ in chunk) <= 250


def test_log_odds_are_not_saturated_by_a_confident_answer() -> None:
    whole = BatchResult(Scored(np.array([0.999, 0.001]), 0.0, True), 0.0, 0.0, 1)
    plan = Plan(_text_item(4), b"abcd", [Passage(0, 2), Passage(2, 4)])
    rows = _rows(plan, whole, [np.array([0.99, 0.01]), np.array([0.999, 0.001])])
    # by hand: logit(0.999) = ln 999 = 6.9068, logit(0.99) = ln 99 = 4.5951
    assert rows[0]["contribution"] == pytest.approx(0.009)
    assert rows[0]["log_odds"] == pytest.approx(math.log(999) - math.log(99))
    assert rows[1]["log_odds"] == pytest.approx(0.0, abs=1e-9)
    assert log_odds(1.0) == pytest.approx(math.log((1 - 1e-7) / 1e-7))  # certain: finite


async def _explain_peak(model: ServedModel, n: int, max_passages: int) -> int:
    item = _text_item(n)
    tracemalloc.start()
    try:
        await explain(model, [item], max_passages, timeout_s=60.0, max_items=1024)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def test_memory_does_not_grow_with_the_passages(repo: Path) -> None:
    """A 512 KB text: 64 passages cost about what 4 cost (one variant at a time under a 512K-token budget);
    building all 64 variants up front, as before, held 64 copies (16 bytes a token each: 512 MB here)."""
    settings = Settings(model_repository=repo, max_batch_tokens=1 << 19, warmup=False)
    backend = _Stub(repo / MODEL)
    model = ServedModel(backend.config, backend, policy_from(settings))  # type: ignore[arg-type]
    async with serve(settings, [model]):
        few = await _explain_peak(model, 1 << 19, 4)
        many = await _explain_peak(model, 1 << 19, 64)
    assert backend.batches.count(1) >= 64  # every variant ran, one per batch
    one_copy = (1 << 19) * 16
    assert many < few + one_copy, (few, many)


async def test_other_requests_run_between_the_occluded_passes(repo: Path) -> None:
    """0.1 s per batch, 16 runs (the text and 15 passages): a short prediction sent while the explanation runs is answered after at most
    the pass in progress and its own, not after every pass queued ahead of it."""
    settings = Settings(model_repository=repo, max_batch_size=1, max_batch_tokens=4096, warmup=False)
    backend = _Stub(repo / MODEL, delay_s=0.1)
    model = ServedModel(backend.config, backend, policy_from(settings))  # type: ignore[arg-type]
    text = " ".join(f"Sentence number {i} says little." for i in range(120))  # ~3.7 KB, 15 passages
    async with serve(settings, [model]) as client:
        long = asyncio.create_task(
            client.post(f"/v1/models/{MODEL}:explain", json={"instances": [text], "parameters": {"max_passages": 16}})
        )
        await asyncio.sleep(0.35)
        t0 = time.perf_counter()
        short = await client.post(f"/v1/models/{MODEL}:predict", json={"instances": ["one short text"]})
        waited = time.perf_counter() - t0
        assert not long.done()  # the explanation is still running: the prediction did not wait for it
        explained = await long
    assert short.status_code == 200 and explained.status_code == 200, explained.text
    assert waited < 0.5, waited  # before: behind ~13 queued passes, 1.3 s
    assert len(explained.json()["explanations"][0]["passages"]) >= 12


async def _explain_after_evidence(repo: Path, delay_s: float) -> tuple[Any, _Stub]:
    """One prediction (the batcher's evidence: delay_s a run), then :explain of the same text with 16 passages
    under request_timeout_s = 1 s. Returns the explain response and the backend (its batches since the
    prediction)."""
    settings = Settings(model_repository=repo, max_batch_size=1, request_timeout_s=1.0, warmup=False)
    backend = _Stub(repo / MODEL, delay_s=delay_s)
    model = ServedModel(backend.config, backend, policy_from(settings))  # type: ignore[arg-type]
    text = " ".join(f"Sentence number {i} says little." for i in range(120))
    async with serve(settings, [model]) as client:
        await client.post(f"/v1/models/{MODEL}:predict", json={"instances": [text]})
        backend.batches.clear()
        r = await client.post(
            f"/v1/models/{MODEL}:explain", json={"instances": [text], "parameters": {"max_passages": 16}}
        )
    return r, backend


async def test_a_request_that_cannot_finish_is_refused_before_its_passes_run(repo: Path) -> None:
    r, backend = await _explain_after_evidence(repo, delay_s=0.2)
    assert r.status_code == 504
    error = r.json()["error"]
    assert "request_timeout_s=1 s" in error and "max_passages <=" in error
    assert len(backend.batches) == 1  # the whole text only: no pass was computed for nobody


async def test_a_text_too_long_for_two_passages_is_told_to_be_shorter(repo: Path) -> None:
    """0.7 s a run and 1 s in all: after the whole text no passage fits, so max_passages cannot help (before, the
    504 still suggested max_passages <= 2)."""
    r, _ = await _explain_after_evidence(repo, delay_s=0.7)
    assert r.status_code == 504
    error = r.json()["error"]
    assert "send a shorter text, or raise request_timeout_s" in error and "max_passages <=" not in error
