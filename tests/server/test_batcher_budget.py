"""The batcher's contract pinned down: the token budget, fill-in, cancelled work, policy validation, the
reported batch size and the errors items get. A fake backend records each batch; payloads are the items'
indices, so a test can read the batches' lengths off its own list."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import types
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lara_serve.server import batcher as batcher_module
from lara_serve.server.batcher import Batcher, BatchPolicy, BatchResult
from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.settings import Settings

pytestmark = pytest.mark.anyio


class Recorder:
    """Backend: records each batch of indices and answers index * 10; optionally raises or holds."""

    def __init__(self, error: Exception | None = None) -> None:
        self.batches: list[list[int]] = []
        self.error = error
        self.gate, self.started = threading.Event(), threading.Event()
        self.gate.set()

    def __call__(self, payloads: list[int]) -> list[int]:
        self.started.set()
        self.gate.wait(timeout=10)
        self.batches.append(list(payloads))
        if self.error is not None:
            raise self.error
        return [p * 10 for p in payloads]


class Observer:
    """BatchObserver that records what the batcher reports; `on_depth` runs on every depth report."""

    def __init__(self) -> None:
        self.done: list[tuple[int, int]] = []  # (size, padded tokens)
        self.dropped: list[tuple[str, int]] = []
        self.depths: list[int] = []
        self.on_depth: Callable[[int], None] = lambda depth: None

    def batch_done(self, size: int, padded_tokens: int, inference_s: float) -> None:
        self.done.append((size, padded_tokens))

    def queue_depth(self, depth: int) -> None:
        self.depths.append(depth)
        self.on_depth(depth)

    def items_dropped(self, reason: str, count: int) -> None:
        self.dropped.append((reason, count))

    def items_orphaned(self, count: int) -> None:
        pass


def make(backend: Recorder, observer: Observer | None = None, **kw: float) -> Batcher[int, int]:
    defaults = {"max_batch_size": 64, "max_batch_tokens": 10_000, "max_queue_delay_s": 0.0, "max_queue_size": 64}
    batcher: Batcher[int, int] = Batcher("m", backend, BatchPolicy(**(defaults | kw)), observer)  # type: ignore[arg-type]
    batcher.start()
    return batcher


async def make_busy(
    backend: Recorder, observer: Observer | None = None, **kw: float
) -> tuple[Batcher[int, int], asyncio.Future[BatchResult[int]]]:
    """A batcher whose worker holds item 0 (length 1) until `backend.gate` is set: nothing else drains the
    queue meanwhile. Returns the batcher and item 0's future."""
    backend.gate.clear()
    batcher = make(backend, observer, **kw)
    running = batcher.submit([(0, 1)])[0]
    await asyncio.to_thread(backend.started.wait, 5)
    return batcher, running


async def run_lengths(lengths: list[int], **kw: float) -> tuple[list[list[int]], list[BatchResult[int]], Observer]:
    """Queue all `lengths` at once (payload = index) and return the batches, the results, the observer."""
    backend, observer = Recorder(), Observer()
    batcher = make(backend, observer, **kw)
    results = await asyncio.gather(*batcher.submit([(i, n) for i, n in enumerate(lengths)]))
    await batcher.stop()
    assert [r.value for r in results] == [10 * i for i in range(len(lengths))]
    return backend.batches, list(results), observer


def padded(batch: list[int], lengths: list[int]) -> int:
    return max(lengths[i] for i in batch) * len(batch)


# -- token budget --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        # The running maximum must grow with each member: 8 + 15 fit (2 x 15 = 30), a 9 would make 3 x 15.
        ([8, 15, 9, 9], 30, [[0, 1], [2, 3]]),
        # Exactly at the budget is allowed: 3 x 10 = 30.
        ([10, 10, 10], 30, [[0, 1, 2]]),
        ([10, 10, 10, 10], 30, [[0, 1, 2], [3]]),
        # Fill-in: 30 does not fit beside 10 (2 x 30 > 40), the shorter 5 after it still does.
        ([10, 30, 5], 40, [[0, 2], [1]]),
        # A seed longer than the budget runs alone; what follows it is batched normally.
        ([50, 3, 3], 10, [[0], [1, 2]]),
    ],
)
async def test_budget_examples(lengths: list[int], budget: int, expected: list[list[int]]) -> None:
    batches, results, observer = await run_lengths(lengths, max_batch_tokens=budget)
    assert batches == expected
    # What the observer and every result report is the batch that really ran.
    assert observer.done == [(len(b), padded(b, lengths)) for b in batches]
    for batch in batches:
        assert all(results[i].batch_size == len(batch) for i in batch)
        assert len(batch) == 1 or padded(batch, lengths) <= budget


async def test_size_cap_and_budget_together() -> None:
    batches, _, _ = await run_lengths([4] * 7, max_batch_size=3, max_batch_tokens=100)
    assert batches == [[0, 1, 2], [3, 4, 5], [6]]


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    budget=st.integers(1, 120),
    max_batch_size=st.integers(1, 10),
)
def test_any_queue_respects_the_budget_and_answers_everyone(
    data: st.DataObject, budget: int, max_batch_size: int
) -> None:
    # Lengths near the budget's divisors make "exactly at the budget" and "one token over" common.
    near = [max(1, budget // k + d) for k in range(1, 6) for d in (-1, 0, 1)]
    lengths = data.draw(st.lists(st.sampled_from(near) | st.integers(1, 2 * budget), min_size=1, max_size=24))
    batches, results, _ = asyncio.run(run_lengths(lengths, max_batch_tokens=budget, max_batch_size=max_batch_size))
    assert sorted(sum(batches, [])) == list(range(len(lengths)))  # everyone computed once
    assert batches[0][0] == 0  # the oldest item seeds the first batch
    for batch in batches:
        assert len(batch) <= max_batch_size
        assert len(batch) == 1 or padded(batch, lengths) <= budget
        assert all(results[i].batch_size == len(batch) for i in batch)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 50), per_batch=st.integers(1, 6), count=st.integers(1, 15))
def test_equal_lengths_fill_the_budget_exactly(length: int, per_batch: int, count: int) -> None:
    batches, _, _ = asyncio.run(run_lengths([length] * count, max_batch_tokens=length * per_batch))
    assert [len(b) for b in batches] == [per_batch] * (count // per_batch) + (
        [count % per_batch] if count % per_batch else []
    )


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        ([100, 3, 110], [[0, 2], [1]]),  # 110 shares the seed's bucket; 3 is five buckets away
        ([10, 80, 2], [[0, 2], [1]]),  # below the seed counts by distance too: 2 is closer than 80
    ],
)
async def test_batch_prefers_the_seeds_bucket(lengths: list[int], expected: list[list[int]]) -> None:
    batches, _, _ = await run_lengths(lengths, max_batch_size=2, bucket_ratio=2.0)
    assert batches == expected


async def test_items_arriving_during_the_delay_join_the_batch() -> None:
    backend = Recorder()
    batcher = make(backend, max_batch_size=8, max_queue_delay_s=0.3)
    first = batcher.submit([(0, 1)])
    await asyncio.sleep(0.05)  # the worker is waiting for the delay: the event loop must stay free
    second = batcher.submit([(1, 1)])
    await asyncio.gather(*first, *second)
    assert backend.batches == [[0, 1]]
    await batcher.stop()


# -- cancelled work costs nothing ----------------------------------------------------------------------


async def test_cancelled_items_free_their_queue_capacity_at_once() -> None:
    backend = Recorder()
    batcher, running = await make_busy(backend, max_batch_size=1, max_queue_size=2)
    for future in batcher.submit([(1, 1), (2, 1)]):
        future.cancel()
    later = batcher.submit([(3, 1), (4, 1)])  # the gone clients' places are free again
    assert batcher.depth == 2
    backend.gate.set()
    assert [(await f).value for f in (running, *later)] == [0, 30, 40]
    assert backend.batches == [[0], [3], [4]]
    await batcher.stop()


async def test_cancelled_items_take_no_batch_slot() -> None:
    backend, observer = Recorder(), Observer()
    batcher, first = await make_busy(backend, observer, max_batch_size=2)
    gone, a, b = batcher.submit([(1, 1), (2, 1), (3, 1)])
    gone.cancel()
    backend.gate.set()
    assert [(await f).value for f in (first, a, b)] == [0, 20, 30]
    assert backend.batches == [[0], [2, 3]]  # the cancelled item did not push 3 into a batch of its own
    assert ("cancelled", 1) in observer.dropped
    await batcher.stop()


async def test_item_cancelled_after_planning_is_not_computed() -> None:
    backend, observer = Recorder(), Observer()
    batcher = make(backend, observer, max_batch_size=4)
    futures: list[asyncio.Future[BatchResult[int]]] = []

    def cancel_second_once(depth: int) -> None:
        # The depth report after the batch left the queue: planned, not yet computed.
        if depth == 0 and futures and not futures[1].done():
            futures[1].cancel()

    observer.on_depth = cancel_second_once
    futures.extend(batcher.submit([(0, 1), (1, 1), (2, 1)]))
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert isinstance(results[1], asyncio.CancelledError)
    assert backend.batches == [[0, 2]]
    assert [r.batch_size for r in (results[0], results[2])] == [2, 2]  # type: ignore[union-attr]
    assert observer.done == [(2, 2)] and ("cancelled", 1) in observer.dropped
    await batcher.stop()


async def test_queue_depth_reports_follow_cancellations() -> None:
    backend, observer = Recorder(), Observer()
    batcher, running = await make_busy(backend, observer, max_batch_size=1)
    queued = batcher.submit([(1, 1), (2, 1)])
    assert observer.depths[-1] == 2  # reported on submit
    for future in queued:
        future.cancel()
    backend.gate.set()
    await running
    for _ in range(100):  # the worker drops the cancelled items once it is back
        if batcher.depth == 0 and observer.depths[-1] == 0:
            break
        await asyncio.sleep(0.01)
    assert batcher.depth == 0 and observer.depths[-1] == 0  # a gauge left at 2 would lie forever
    await batcher.stop()


async def test_stop_waits_for_the_running_batch() -> None:
    backend = Recorder()
    batcher, _ = await make_busy(backend)
    threading.Timer(0.2, backend.gate.set).start()
    await batcher.stop()
    assert backend.batches == [[0]]  # the backend was not torn down under a running batch


# -- policy validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"max_batch_size": 0},
        {"max_batch_tokens": 0},
        {"max_queue_size": 0},
        {"max_queue_delay_s": -0.001},
        {"bucket_ratio": 1.0},
        {"bucket_ratio": 0.5},
    ],
)
def test_policy_refuses_impossible_limits(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be >= 1|need max_queue_delay_s >= 0 and bucket_ratio > 1"):
        BatchPolicy(**bad)  # type: ignore[arg-type]


def test_policy_accepts_the_smallest_allowed_limits() -> None:
    p = BatchPolicy(max_batch_size=1, max_batch_tokens=1, max_queue_size=1, max_queue_delay_s=0.0, bucket_ratio=1.01)
    assert (p.max_batch_size, p.max_batch_tokens, p.max_queue_size) == (1, 1, 1)


def test_policy_defaults_are_the_servers_defaults_and_frozen() -> None:
    fields = Settings.model_fields
    assert BatchPolicy() == BatchPolicy(
        max_batch_size=fields["max_batch_size"].default,
        max_batch_tokens=fields["max_batch_tokens"].default,
        max_queue_delay_s=fields["max_queue_delay_ms"].default / 1000,
        max_queue_size=fields["max_queue_size"].default,
        bucket_ratio=fields["length_bucket_ratio"].default,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        BatchPolicy().max_batch_size = 0  # type: ignore[misc]  # shared by a model's batcher: never changed
    with pytest.raises(dataclasses.FrozenInstanceError):
        BatchResult(1, 0.0, 0.0, 1).value = 2  # type: ignore[misc]


def test_buckets_group_lengths_within_the_ratio() -> None:
    p = BatchPolicy(bucket_ratio=2.0)
    assert [p.bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 1000)] == [0, 0, 1, 1, 2, 2, 3, 9]
    assert [BatchPolicy(bucket_ratio=10.0).bucket(n) for n in (9, 10, 99, 100)] == [0, 1, 1, 2]


# -- errors items get ----------------------------------------------------------------------------------


async def test_backend_serve_error_keeps_its_kind_message_and_retry_after() -> None:
    backend = Recorder(error=ServeError(ErrorKind.NOT_READY, "weights are reloading", retry_after_s=7))
    batcher = make(backend, max_queue_delay_s=0.05)
    results = await asyncio.gather(*batcher.submit([(0, 1), (1, 1)]), return_exceptions=True)
    for r in results:
        assert isinstance(r, ServeError)
        assert (r.kind, r.message, r.retry_after_s) == (ErrorKind.NOT_READY, "weights are reloading", 7)
    assert results[0] is not results[1]  # one instance per item: tracebacks do not pile up across tasks
    await batcher.stop()


async def test_other_backend_errors_become_backend_failure_naming_the_cause() -> None:
    batcher = make(Recorder(error=KeyError("layer.7")), max_queue_delay_s=0.05)
    (error,) = await asyncio.gather(*batcher.submit([(0, 1)]), return_exceptions=True)
    assert isinstance(error, ServeError) and error.kind is ErrorKind.BACKEND_FAILURE
    assert error.message == "inference failed: KeyError: 'layer.7'" and error.retry_after_s is None
    await batcher.stop()


async def test_shutdown_answers_queued_items_with_retry_after() -> None:
    backend = Recorder()
    batcher = make(backend, max_queue_delay_s=10.0)
    pending = batcher.submit([(0, 1), (1, 1)])
    await batcher.stop()
    for future in pending:
        error = future.exception()
        assert isinstance(error, ServeError) and error.kind is ErrorKind.NOT_READY
        assert error.retry_after_s == 1 and "stopped" in error.message
    assert backend.batches == [] and batcher.depth == 0


async def test_fail_queued_counts_and_copies_the_error() -> None:
    backend = Recorder()
    batcher = make(backend, max_queue_delay_s=10.0)
    pending = batcher.submit([(0, 1), (1, 1), (2, 1)])
    pending[2].cancel()  # already answered: not counted, not overwritten
    assert batcher.fail_queued(ServeError(ErrorKind.QUEUE_FULL, "draining", retry_after_s=4)) == 2
    assert batcher.depth == 0
    errors = [f.exception() for f in pending[:2]]
    assert all(isinstance(e, ServeError) and (e.kind, e.retry_after_s) == (ErrorKind.QUEUE_FULL, 4) for e in errors)
    assert errors[0] is not errors[1]
    await batcher.stop()


async def test_retry_after_is_spread_over_one_to_two_base_periods() -> None:
    backend = Recorder()
    batcher = make(backend, max_queue_delay_s=0.0)
    seen = {batcher.retry_after_s() for _ in range(200)}
    assert seen == {1, 2}  # empty queue, no batch measured yet: base 1 s, spread over [1, 2]
    await batcher.stop()
    slow = make(Recorder(), max_queue_delay_s=2.5)  # base: ceil(2.5 s of delay) = 3
    assert {slow.retry_after_s() for _ in range(200)} == {3, 4, 5, 6}
    await slow.stop()


async def test_retry_after_follows_the_moving_average_of_batch_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock the backend moves on: batches 'take' 20 s and 52.5 s, so the average (0.8 old + 0.2 new)
    is 26.5 s, and one batch waiting ahead means Retry-After in [27, 54]."""
    skew = [0.0]
    monkeypatch.setattr(
        batcher_module, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + skew[0])
    )
    steps = iter([20.0, 52.5])
    backend = Recorder()

    def timed(payloads: list[int]) -> list[int]:
        skew[0] += next(steps, 0.0)
        return backend(payloads)

    batcher: Batcher[int, int] = Batcher("m", timed, BatchPolicy(max_batch_size=1, max_queue_delay_s=0.0))
    batcher.start()
    (first,) = await asyncio.gather(*batcher.submit([(0, 1)]))
    await asyncio.gather(*batcher.submit([(1, 1)]))
    assert 20.0 <= first.inference_s < 20.5 and first.batch_size == 1
    backend.gate.clear()
    backend.started.clear()
    held = batcher.submit([(2, 1)])
    assert await asyncio.to_thread(backend.started.wait, 5)
    waiting = batcher.submit([(3, 1)])  # one batch ahead of a newcomer
    hints = [batcher.retry_after_s() for _ in range(300)]
    assert min(hints) == 27 and max(hints) <= 54
    backend.gate.set()
    await asyncio.gather(*held, *waiting)
    await batcher.stop()
