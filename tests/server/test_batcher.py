"""The batcher with a fake backend: composition, budget, delay, bucketing, cancellation, errors."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lara_serve.server.batcher import Batcher, BatchPolicy
from lara_serve.server.errors import ErrorKind, ServeError

pytestmark = pytest.mark.anyio


class FakeBackend:
    """Records each batch's payloads; answers payload * 10; can block or fail on demand."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.fail = fail
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def __call__(self, payloads: list[int]) -> list[int]:
        self.started.set()
        self.gate.wait(timeout=10)
        self.batches.append(list(payloads))
        if self.fail:
            raise RuntimeError("backend exploded")
        return [p * 10 for p in payloads]


def policy(**kw: float) -> BatchPolicy:
    defaults = {"max_batch_size": 4, "max_batch_tokens": 10_000, "max_queue_delay_s": 0.01, "max_queue_size": 64}
    return BatchPolicy(**(defaults | kw))  # type: ignore[arg-type]


async def started(backend: FakeBackend, p: BatchPolicy) -> Batcher[int, int]:
    batcher: Batcher[int, int] = Batcher("m", backend, p)
    batcher.start()
    return batcher


async def test_every_item_gets_its_own_result_in_size_capped_batches() -> None:
    backend = FakeBackend()
    batcher = await started(backend, policy(max_batch_size=2))
    futures = batcher.submit([(i, 5) for i in range(5)])
    results = await asyncio.gather(*futures)
    assert [r.value for r in results] == [0, 10, 20, 30, 40]
    assert [len(b) for b in backend.batches] == [2, 2, 1]
    assert sorted(sum(backend.batches, [])) == list(range(5))
    assert results[0].batch_size == 2 and results[4].batch_size == 1
    await batcher.stop()


async def test_full_batch_does_not_wait_for_the_delay() -> None:
    batcher = await started(FakeBackend(), policy(max_batch_size=4, max_queue_delay_s=5.0))
    t0 = time.perf_counter()
    await asyncio.gather(*batcher.submit([(i, 1) for i in range(4)]))
    assert time.perf_counter() - t0 < 2.0
    await batcher.stop()


async def test_lone_item_waits_for_the_delay_then_runs() -> None:
    batcher = await started(FakeBackend(), policy(max_batch_size=8, max_queue_delay_s=0.1))
    t0 = time.perf_counter()
    (result,) = await asyncio.gather(*batcher.submit([(1, 1)]))
    elapsed = time.perf_counter() - t0
    assert 0.09 <= elapsed < 3.0
    assert result.queue_s >= 0.09
    await batcher.stop()


async def test_token_budget_caps_padded_length_times_count() -> None:
    backend = FakeBackend()
    batcher = await started(backend, policy(max_batch_size=16, max_batch_tokens=100, max_queue_delay_s=0.5))
    # 3 x 40 = 120 > 100: two fit and go at once (the budget is the trigger), the third waits.
    results = await asyncio.gather(*batcher.submit([(i, 40) for i in range(3)]))
    assert backend.batches == [[0, 1], [2]]
    assert results[0].queue_s < 0.4 <= results[2].queue_s
    await batcher.stop()


async def test_item_longer_than_budget_runs_alone() -> None:
    backend = FakeBackend()
    batcher = await started(backend, policy(max_batch_tokens=10))
    results = await asyncio.gather(*batcher.submit([(1, 50), (2, 3)]))
    assert [r.value for r in results] == [10, 20]
    assert backend.batches[0] == [1]
    await batcher.stop()


async def test_similar_lengths_are_batched_together() -> None:
    backend = FakeBackend()
    batcher = await started(backend, policy(max_batch_size=3, max_queue_delay_s=0.05, bucket_ratio=2.0))
    # payload = length; seed 10 is oldest: 11 and 12 share its bucket, 200 and 220 go together later.
    await asyncio.gather(*batcher.submit([(n, n) for n in (10, 200, 12, 220, 11)]))
    assert backend.batches == [[10, 12, 11], [200, 220]]
    await batcher.stop()


async def test_cancelled_items_are_skipped_not_computed() -> None:
    backend = FakeBackend()
    backend.gate.clear()  # hold the first batch in the backend
    batcher = await started(backend, policy(max_batch_size=1, max_queue_delay_s=0.0))
    first = batcher.submit([(1, 1)])[0]
    await asyncio.to_thread(backend.started.wait, 5)
    second, third = batcher.submit([(2, 1), (3, 1)])
    second.cancel()  # the client went away while queued
    backend.gate.set()
    assert (await first).value == 10 and (await third).value == 30
    assert backend.batches == [[1], [3]]
    await batcher.stop()


async def test_backend_failure_reaches_every_item_of_the_batch() -> None:
    backend = FakeBackend(fail=True)
    batcher = await started(backend, policy(max_batch_size=3, max_queue_delay_s=0.05))
    results = await asyncio.gather(*batcher.submit([(i, 1) for i in range(3)]), return_exceptions=True)
    assert all(isinstance(r, ServeError) and r.kind is ErrorKind.BACKEND_FAILURE for r in results)
    assert "backend exploded" in str(results[0])
    backend.fail = False  # the worker survived: the next batch works
    assert (await batcher.submit([(4, 1)])[0]).value == 40
    await batcher.stop()


async def test_wrong_result_count_is_a_batch_error() -> None:
    batcher: Batcher[int, int] = Batcher("m", lambda p: [0], policy(max_queue_delay_s=0.05))
    batcher.start()
    results = await asyncio.gather(*batcher.submit([(1, 1), (2, 1)]), return_exceptions=True)
    for r in results:
        assert isinstance(r, ServeError) and r.kind is ErrorKind.BACKEND_FAILURE
        assert "run_batch returned 1 results for 2 items" in r.message
    await batcher.stop()


async def test_full_queue_refuses_with_retry_after() -> None:
    backend = FakeBackend()
    backend.gate.clear()
    batcher = await started(backend, policy(max_batch_size=1, max_queue_size=2, max_queue_delay_s=0.0))
    held = batcher.submit([(0, 1)])
    await asyncio.to_thread(backend.started.wait, 5)
    queued = batcher.submit([(1, 1), (2, 1)])
    with pytest.raises(ServeError) as info:
        batcher.submit([(3, 1)])
    assert info.value.kind is ErrorKind.QUEUE_FULL and info.value.retry_after_s >= 1
    assert "is full (2 of 2 items waiting, request has 1)" in info.value.message
    backend.gate.set()
    await asyncio.gather(*held, *queued)
    await batcher.stop()


async def test_stop_past_its_grace_has_answered_every_item_when_it_returns() -> None:
    backend = FakeBackend()
    backend.gate.clear()  # the batch computes until the end of the test
    batcher = await started(backend, policy(max_batch_size=2, max_queue_delay_s=0.0))
    running = batcher.submit([(1, 1), (2, 1)])
    await asyncio.to_thread(backend.started.wait, 5)
    queued = batcher.submit([(3, 1)])
    await batcher.stop(grace_s=0.1)
    # Answered by the time stop returns (a caller that closes the model next must find no item pending).
    assert all(f.done() for f in running + queued)
    for future, words in ((running[0], "while computing"), (running[1], "while computing"), (queued[0], "was stopped")):
        error = future.exception()
        assert isinstance(error, ServeError) and error.kind is ErrorKind.NOT_READY and words in error.message
        assert error.retry_after_s == 1
    assert batcher.busy  # the thread still computes: its owner must not close the backend under it
    backend.gate.set()


async def test_stop_fails_pending_items_and_submit_needs_start() -> None:
    batcher: Batcher[int, int] = Batcher("m", FakeBackend(), policy(max_queue_delay_s=10.0, max_batch_size=8))
    with pytest.raises(ServeError, match="model 'm' is not serving yet") as not_started:
        batcher.submit([(1, 1)])
    assert not_started.value.kind is ErrorKind.NOT_READY and not_started.value.retry_after_s == 1
    assert not batcher.busy  # no batch has run yet
    batcher.start()
    pending = batcher.submit([(1, 1)])[0]
    await batcher.stop()
    with pytest.raises(ServeError) as info:
        await pending
    assert info.value.kind is ErrorKind.NOT_READY and "stopped" in info.value.message
    with pytest.raises(ServeError, match="model 'm' was stopped") as late:
        batcher.submit([(2, 1)])
    assert late.value.kind is ErrorKind.NOT_READY and late.value.retry_after_s == 1


async def test_busy_and_running_only_while_a_batch_computes() -> None:
    backend = FakeBackend()
    backend.gate.clear()
    batcher = await started(backend, policy(max_batch_size=1, max_queue_delay_s=0.0))
    future = batcher.submit([(4, 1)])[0]
    await asyncio.to_thread(backend.started.wait, 5)
    assert batcher.busy and batcher.running(future)  # computing: cancelling it now would waste the work
    backend.gate.set()
    assert (await future).value == 40
    assert not batcher.running(future)  # answered: no longer counted as computing
    await batcher.stop()
    assert not batcher.busy  # the owner may close the backend now


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=40),
    max_batch_size=st.integers(1, 8),
    max_tokens=st.integers(1, 1000),
)
def test_any_load_respects_limits_and_answers_everyone(
    lengths: list[int], max_batch_size: int, max_tokens: int
) -> None:
    async def scenario() -> None:
        backend = FakeBackend()
        p = policy(max_batch_size=max_batch_size, max_batch_tokens=max_tokens, max_queue_delay_s=0.0)
        batcher: Batcher[int, int] = Batcher("m", backend, p)
        batcher.start()
        items = list(enumerate(lengths))
        results = await asyncio.gather(*batcher.submit([(i, n) for i, n in items]))
        await batcher.stop()
        assert [r.value for r in results] == [i * 10 for i, _ in items]
        for batch in backend.batches:
            assert len(batch) <= max_batch_size
            padded = max(lengths[i] for i in batch) * len(batch)
            assert len(batch) == 1 or padded <= max_tokens
        assert sorted(sum(backend.batches, [])) == [i for i, _ in items]

    asyncio.run(scenario())
