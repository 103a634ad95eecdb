"""One peak sampler for the memory benchmarks: a reading (resident memory, usually) taken every `interval`
seconds on a thread while the block runs, its largest value kept."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def peak_of(read: Callable[[], float], interval: float = 0.02) -> Iterator[dict[str, float]]:
    """`with peak_of(read) as peak:` ... ; then peak["peak"] is the largest reading, the one at entry included
    (a block shorter than `interval` is still measured), and peak["last"] the reading at exit."""
    out = {"peak": read()}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval):
            out["peak"] = max(out["peak"], read())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()
        out["last"] = read()
        out["peak"] = max(out["peak"], out["last"])
