"""benchmarks.sampling.peak_of: the largest reading while the block ran, the ones at entry and exit included."""

from __future__ import annotations

import time

from benchmarks.sampling import peak_of


def test_peak_is_the_largest_reading_while_the_block_runs() -> None:
    level = {"now": 100.0}
    with peak_of(lambda: level["now"], interval=0.001) as peak:
        level["now"] = 900.0  # a transient the sampler must see
        time.sleep(0.05)
        level["now"] = 150.0
        time.sleep(0.02)
    assert peak["peak"] == 900.0 and peak["last"] == 150.0


def test_a_block_shorter_than_the_interval_still_counts_entry_and_exit() -> None:
    readings = iter([5.0, 7.0])
    start = time.perf_counter()
    with peak_of(lambda: next(readings, 7.0), interval=60.0) as peak:
        pass  # no sample fits in: the entry (5) and exit (7) readings are what there is
    assert peak == {"peak": 7.0, "last": 7.0}
    assert time.perf_counter() - start < 5  # the sampler stops at once, not after its 60 s interval
