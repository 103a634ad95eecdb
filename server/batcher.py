"""Dynamic batching with a token budget and length bucketing. Knows nothing of HTTP or of models.

One `Batcher` per model. `submit` queues items (payload + length) and returns one future per item. A
worker task forms a batch when `max_batch_size` items are ready, when the token budget (padded length x
items) would be exceeded by one more item, or when the oldest item has waited `max_queue_delay_s`. The
batch starts from the oldest item and prefers items of a similar length (same bucket), so little compute
goes to padding. `run_batch` runs in a worker thread, so the event loop stays free. Every item of a batch
gets an answer: its result or the batch's error.

Work for nobody is never started: an item whose future is done (its client left, its request timed out)
is dropped from the queue, and an item with a deadline that it could not meet even running alone (by the
recent batches measured in lara_serve.server.batch_cost) is answered with a timeout error before it is computed.

Stopping (unload, reload, shutdown) answers every item: the batch being computed finishes and is answered
(or, past a grace period, gets a 503), queued items get a 503, and the worker thread is shut down off the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from lara_serve.server.batch_cost import BatchCostModel
from lara_serve.server.errors import ErrorKind, ServeError

P = TypeVar("P")
R = TypeVar("R")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int = 32
    max_batch_tokens: int = 65536
    max_queue_delay_s: float = 0.002
    max_queue_size: int = 1024
    bucket_ratio: float = 2.0  # lengths within this ratio share a bucket
    # Tokens (item lengths) waiting, over all queued items: what the queue holds in memory grows with its
    # tokens, not its item count (100 queued 1 MB texts are 100M ids). An empty queue takes any request.
    max_queue_tokens: int = 1 << 24

    def __post_init__(self) -> None:
        limits = (self.max_batch_size, self.max_batch_tokens, self.max_queue_size, self.max_queue_tokens)
        if min(limits) < 1:
            raise ValueError(f"batch limits must be >= 1: {self}")
        if self.max_queue_delay_s < 0 or self.bucket_ratio <= 1.0:
            raise ValueError(f"need max_queue_delay_s >= 0 and bucket_ratio > 1: {self}")

    def bucket(self, length: int) -> int:
        return int(math.log(max(length, 1)) / math.log(self.bucket_ratio))


@dataclass(frozen=True)
class BatchResult(Generic[R]):
    value: R
    queue_s: float  # enqueue -> batch start
    inference_s: float  # run_batch wall time
    batch_size: int


class BatchObserver(Protocol):
    """Metrics hook; implemented by lara_serve.server.metrics."""

    def batch_done(self, size: int, padded_tokens: int, inference_s: float) -> None: ...

    def queue_depth(self, depth: int) -> None: ...

    def items_dropped(self, reason: str, count: int) -> None:
        """Items removed without compute: reason "cancelled" (client gone) or "deadline"."""
        ...

    def items_orphaned(self, count: int) -> None:
        """Items computed although their request was gone by the time the batch finished."""
        ...


@dataclass(eq=False)
class _Entry(Generic[P, R]):
    payload: P
    length: int
    future: asyncio.Future[BatchResult[R]]
    deadline: float | None = None  # time.perf_counter() by which the answer is useless
    enqueued: float = field(default_factory=time.perf_counter)


class Batcher(Generic[P, R]):
    def __init__(
        self,
        name: str,
        run_batch: Callable[[list[P]], Sequence[R]],
        policy: BatchPolicy,
        observer: BatchObserver | None = None,
    ) -> None:
        self.name = name
        self.policy = policy
        self._run_batch = run_batch
        self._observer = observer
        self._queue: list[_Entry[P, R]] = []
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        # One thread per model: batches of a model run one at a time, off the event loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"batch-{name}")
        self._batch_s = 0.0  # moving average of batch time, for Retry-After
        self.cost = BatchCostModel()  # fixed + per-token batch time, for deadlines (lara_serve.server.batch_cost)
        self._stopping = False
        self._running: set[int] = set()  # ids of the futures whose items are being computed now
        self._job: Future[Sequence[R]] | None = None  # the batch in the worker thread, if any

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self, grace_s: float = 30.0) -> None:
        """Stop serving, answering every item: new submits and queued items get 503; the batch being
        computed finishes and is answered, or after `grace_s` its items get 503 too. Never blocks the loop."""
        self._stopping = True
        worker, self._worker = self._worker, None  # submit refuses from now on
        finished = True
        if worker is not None:
            self._wakeup.set()
            try:
                await asyncio.wait_for(asyncio.shield(worker), timeout=grace_s)
            except TimeoutError:
                finished = False
                worker.cancel()  # its running batch's items are answered 503 (_execute)
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
        self.fail_queued(ServeError(ErrorKind.NOT_READY, f"model {self.name!r} was stopped; retry", retry_after_s=1))
        if finished:  # idle thread: returns at once, but off the loop all the same
            await asyncio.to_thread(self._executor.shutdown, True)
        else:  # a batch still computes past the grace period: do not wait for it
            log.warning("batcher %s: stopped with a batch still running after %.1f s", self.name, grace_s)
            self._executor.shutdown(wait=False)

    def fail_queued(self, error: ServeError) -> int:
        """Answer every queued (not yet running) item with `error`; returns how many there were."""
        failed = 0
        for entry in self._queue:
            if not entry.future.done():
                entry.future.set_exception(ServeError(error.kind, error.message, retry_after_s=error.retry_after_s))
                failed += 1
        self._queue.clear()
        self._report_depth()
        return failed

    @property
    def depth(self) -> int:
        return len(self._queue)

    def running(self, future: asyncio.Future[BatchResult[R]]) -> bool:
        """Is this item being computed now (no longer cancellable without wasting the work)?"""
        return id(future) in self._running

    @property
    def busy(self) -> bool:
        """Is a batch still running in the worker thread (e.g. after `stop` gave up waiting for it)?"""
        return self._job is not None and not self._job.done()

    # -- producer side -------------------------------------------------------------------------------

    def submit(
        self, items: Sequence[tuple[P, int]], deadline: float | None = None
    ) -> list[asyncio.Future[BatchResult[R]]]:
        """Queue (payload, length) items together; all or none (429 kind if they do not fit).

        `deadline` (time.perf_counter() seconds): items that could not finish by then are answered with
        a TIMEOUT error instead of being computed.
        """
        if self._worker is None:
            what = "was stopped (unloaded or shutting down)" if self._stopping else "is not serving yet"
            raise ServeError(ErrorKind.NOT_READY, f"model {self.name!r} {what}; retry", retry_after_s=1)
        self._drop_done()  # places held by gone clients are free now, not when the worker is next idle
        if len(self._queue) + len(items) > self.policy.max_queue_size:
            raise ServeError(
                ErrorKind.QUEUE_FULL,
                f"queue of model {self.name!r} is full ({len(self._queue)} of "
                f"{self.policy.max_queue_size} items waiting, request has {len(items)}); retry later",
                retry_after_s=self.retry_after_s(),
            )
        queued, asked = sum(e.length for e in self._queue), sum(length for _, length in items)
        if self._queue and queued + asked > self.policy.max_queue_tokens:
            raise ServeError(
                ErrorKind.QUEUE_FULL,
                f"queue of model {self.name!r} is full ({queued} of {self.policy.max_queue_tokens} tokens "
                f"waiting (max_queue_tokens), request has {asked}); retry later",
                retry_after_s=self.retry_after_s(),
            )
        loop = asyncio.get_running_loop()
        futures = []
        for payload, length in items:
            entry: _Entry[P, R] = _Entry(payload, length, loop.create_future(), deadline)
            self._queue.append(entry)
            futures.append(entry.future)
        self._report_depth()
        self._wakeup.set()
        return futures

    def retry_after_s(self) -> int:
        """Time to work off the queue, spread over [t, 2t] so refused clients do not return in step."""
        batches_ahead = len(self._queue) / self.policy.max_batch_size
        base = max(1, math.ceil(batches_ahead * self._batch_s + self.policy.max_queue_delay_s))
        return random.randint(base, 2 * base)

    # -- batch formation -----------------------------------------------------------------------------

    def _plan(self) -> tuple[list[_Entry[P, R]], bool]:
        """Batch seeded by the oldest entry, filled by closeness of bucket. Returns (batch, budget_hit)."""
        policy = self.policy
        seed = self._queue[0]
        seed_bucket = policy.bucket(seed.length)
        rest = sorted(self._queue[1:], key=lambda e: abs(policy.bucket(e.length) - seed_bucket))
        batch, longest, budget_hit = [seed], seed.length, False
        for entry in rest:
            if len(batch) >= policy.max_batch_size:
                break
            padded = max(longest, entry.length)
            if padded * (len(batch) + 1) > policy.max_batch_tokens:
                budget_hit = True  # this entry waits for a later batch; a shorter one may still fit
                continue
            batch.append(entry)
            longest = padded
        return batch, budget_hit

    def _drop_done(self) -> None:
        kept = [e for e in self._queue if not e.future.done()]
        if len(kept) != len(self._queue):
            dropped = len(self._queue) - len(kept)
            self._queue = kept
            self._report_depth()
            if self._observer is not None:
                self._observer.items_dropped("cancelled", dropped)

    def _late_reason(self, entry: _Entry[P, R], now: float, in_batch: bool) -> str | None:
        """Why `entry` cannot be answered in time, or None. Only a deadline already passed, or a
        measured lower bound of the entry's time ALONE beyond its deadline, refuses it: a batch that
        would be too slow together is no reason (the item may still finish), nor is an extrapolation."""
        if entry.deadline is None:
            return None
        waited = f"waited {now - entry.enqueued:.3f} s"
        if entry.deadline <= now:
            return f"request timed out in the queue before request_timeout_s ({waited})"
        if not in_batch:
            return None
        alone = self.cost.lower_bound_s(entry.length, now)
        if alone is None or now + alone <= entry.deadline:
            return None
        return (
            f"request timed out: it could not have been answered before request_timeout_s ({waited}; "
            f"{entry.length} tokens take at least ~{alone:.3f} s here even alone, by the batches measured "
            f"recently, and {entry.deadline - now:.3f} s were left)"
        )

    def _expire(self, batch: Sequence[_Entry[P, R]]) -> bool:
        """Answer TIMEOUT, uncomputed, to the entries (of the queue, or of `batch` if it ran now) that
        cannot be answered before their deadline. Returns whether any was expired."""
        now = time.perf_counter()
        in_batch = set(map(id, batch))
        reasons = {id(e): self._late_reason(e, now, id(e) in in_batch) for e in self._queue}
        late = [e for e in self._queue if reasons[id(e)] is not None]
        if not late:
            return False
        for entry in late:
            if not entry.future.done():
                entry.future.set_exception(ServeError(ErrorKind.TIMEOUT, reasons[id(entry)] or ""))
        gone = set(map(id, late))
        self._queue = [e for e in self._queue if id(e) not in gone]
        self._report_depth()
        if self._observer is not None:
            self._observer.items_dropped("deadline", len(late))
        return True

    async def _next_batch(self) -> list[_Entry[P, R]] | None:
        """The next batch to run, or None once the batcher is stopping."""
        while not self._stopping:
            self._drop_done()
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch, budget_hit = self._plan()
            waited = time.perf_counter() - self._queue[0].enqueued
            remaining = self.policy.max_queue_delay_s - waited
            if len(batch) >= self.policy.max_batch_size or budget_hit or remaining <= 0:
                if self._expire(batch):
                    continue  # re-plan without the expired entries
                taken = set(map(id, batch))
                self._queue = [e for e in self._queue if id(e) not in taken]
                self._report_depth()
                return batch
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=remaining)
        return None

    # -- execution -----------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            batch = await self._next_batch()
            if batch is None:
                return
            try:
                await self._execute(batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the worker die: the next batch must still run
                log.exception("batcher %s: unexpected error", self.name)

    async def _execute(self, batch: list[_Entry[P, R]]) -> None:
        live = [e for e in batch if not e.future.done()]  # cancelled while waiting: skip, not computed
        if len(live) != len(batch) and self._observer is not None:
            self._observer.items_dropped("cancelled", len(batch) - len(live))
        if not live:
            return
        start = time.perf_counter()
        self._running = {id(e.future) for e in live}
        try:
            self._job = self._executor.submit(self._run_batch, [e.payload for e in live])
            results = await asyncio.wrap_future(self._job)
            if len(results) != len(live):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(live)} items")
        except asyncio.CancelledError:  # stopped past its grace period: the thread's result goes nowhere
            self._running = set()
            message = f"model {self.name!r} was stopped while computing this item; retry"
            for entry in live:
                if not entry.future.done():
                    entry.future.set_exception(ServeError(ErrorKind.NOT_READY, message, retry_after_s=1))
            raise
        except Exception as exc:
            self._running = set()
            log.warning("batcher %s: batch of %d failed: %r", self.name, len(live), exc)
            for entry in live:
                if not entry.future.done():
                    entry.future.set_exception(_fan_out_error(exc))
            return
        self._running = set()
        inference_s = time.perf_counter() - start
        padded = max(e.length for e in live) * len(live)
        self._batch_s = _ema(self._batch_s, inference_s)
        self.cost.observe(padded, inference_s)
        orphaned = sum(e.future.done() for e in live)  # their request went away while the batch ran
        if self._observer is not None:
            self._observer.batch_done(len(live), padded, inference_s)
            if orphaned:
                self._observer.items_orphaned(orphaned)
        for entry, value in zip(live, results, strict=True):
            if not entry.future.done():
                entry.future.set_result(BatchResult(value, start - entry.enqueued, inference_s, len(live)))

    def _report_depth(self) -> None:
        if self._observer is not None:
            self._observer.queue_depth(len(self._queue))


def _ema(average: float, sample: float) -> float:
    return sample if average == 0 else 0.8 * average + 0.2 * sample


def _fan_out_error(exc: Exception) -> ServeError:
    """A fresh error per item (a shared instance would pile up tracebacks across awaiting tasks)."""
    if isinstance(exc, ServeError):
        return ServeError(exc.kind, exc.message, retry_after_s=exc.retry_after_s)
    return ServeError(ErrorKind.BACKEND_FAILURE, f"inference failed: {type(exc).__name__}: {exc}")
