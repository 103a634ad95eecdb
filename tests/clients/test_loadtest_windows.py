"""The load tester's statistics at their boundaries, by hand: a window's throughput and median, the stability
test (the last three windows, a bound that is inclusive), merged windows, the samples each percentile needs,
the achieved-vs-offered rule, load points and their arrival schedules. No network, no server."""

from __future__ import annotations

import pytest

from lara_serve.clients.loadtest.rigour import (
    MIN_SAMPLES,
    Stability,
    WindowStats,
    is_stable,
    merge,
    percentile_warnings,
    rate_warning,
    window_stats,
)
from lara_serve.clients.loadtest.runner import CellRun, Sample
from lara_serve.clients.loadtest.schedule import LoadPoint, arrival_offsets


def _sample(latency_s: float, status: str = "200", scheduled: float = 1.0) -> Sample:
    return Sample(scheduled, scheduled, scheduled + latency_s, status, {})


def test_window_stats_count_answered_requests_only() -> None:
    run = CellRun([_sample(0.010), _sample(0.030), _sample(0.020), _sample(0.5, "503"), _sample(0.9, "timeout")],
                  duration_s=2.0, stopped_by="requests")  # fmt: skip
    stats = window_stats(run)
    assert stats.throughput_rps == pytest.approx(1.5)  # 3 answered in 2 s; refusals are not throughput
    assert stats.p50_ms == pytest.approx(20.0)  # median of 10, 30, 20 ms; the 503 and timeout are not latency
    even = window_stats(CellRun([_sample(0.010), _sample(0.040)], 0.5, "seconds"))
    assert even.throughput_rps == pytest.approx(4.0) and even.p50_ms == pytest.approx(25.0)  # midpoint
    assert window_stats(CellRun([_sample(0.1, "500")], 1.0, "requests")) == WindowStats(None, None)
    assert window_stats(CellRun([_sample(0.1)], 0.0, "requests")) == WindowStats(None, None)


def test_the_stability_bound_is_inclusive_and_relative_to_the_mean() -> None:
    steady = WindowStats(10.0, 4.0)
    # Throughput 9, 10, 11: mean 10, every window within 1 = 10% of it; 9.9% is too tight.
    tp = [WindowStats(9.0, 4.0), WindowStats(10.0, 4.0), WindowStats(11.0, 4.0)]
    assert is_stable(tp, 10.0) is True and is_stable(tp, 9.9) is False
    p50 = [WindowStats(10.0, 18.0), WindowStats(10.0, 20.0), WindowStats(10.0, 22.0)]
    assert is_stable(p50, 10.0) is True and is_stable(p50, 9.9) is False
    assert is_stable([WindowStats(0.0, 0.0)] * 3, 100.0) is False  # nothing answered: no rate to agree on
    assert is_stable([WindowStats(None, 4.0)] + [steady] * 2, 100.0) is False  # a cell report's stable: false, not null


def test_only_the_last_three_windows_count() -> None:
    steady, off = WindowStats(10.0, 4.0), WindowStats(30.0, 12.0)
    assert is_stable([off, off, steady, steady, steady], 5.0) is True  # settled after a slow start
    assert is_stable([steady, steady, steady, off], 5.0) is False  # drifted at the end
    assert is_stable([steady, steady], 5.0) is False and is_stable([], 5.0) is False


def test_stability_settings_are_checked() -> None:
    assert Stability(100.0).percentage == 100.0 and Stability(0.5, max_windows=3).max_windows == 3
    for bad in (0.0, -1.0, 100.5):
        with pytest.raises(ValueError, match=r"--stability-percentage must be in \(0, 100\]"):
            Stability(bad)
    with pytest.raises(ValueError, match="--max-windows must be at least 3, got 2"):
        Stability(5.0, max_windows=2)


def test_merged_windows_add_samples_and_durations() -> None:
    a = CellRun([_sample(0.01)], 1.5, "requests")
    b = CellRun([_sample(0.02), _sample(0.03, "429")], 2.0, "seconds")
    merged = merge([a, b])
    assert merged.samples == a.samples + b.samples and merged.duration_s == pytest.approx(3.5)
    assert merged.stopped_by == "seconds"  # the last window's reason


def test_each_percentile_warns_below_its_sample_count_only() -> None:
    assert MIN_SAMPLES == {50: 2, 90: 10, 95: 20, 99: 100}  # n >= 100 / (100 - q)

    def named(n: int) -> list[str]:
        return [w.split()[0] for w in percentile_warnings(n)]

    assert named(1) == ["p50", "p90", "p95", "p99"]
    assert named(2) == ["p90", "p95", "p99"]
    assert named(9) == ["p90", "p95", "p99"] and named(10) == ["p95", "p99"]
    assert named(19) == ["p95", "p99"] and named(20) == ["p99"]
    assert named(99) == ["p99"] and named(100) == [] and named(0) == []
    assert percentile_warnings(9)[0] == "p90 rests on 9 samples (needs >= 10); read it as a rough figure"


def test_rate_warning_at_ninety_percent() -> None:
    assert rate_warning(100.0, 90.0) is None  # exactly 90% of the offered rate: not short
    assert rate_warning(100.0, 89.9) == "achieved 89.9 req/s of the 100 offered (90%)"
    assert rate_warning(100.0, 50.0) == "achieved 50.0 req/s of the 100 offered (50%)"
    assert rate_warning(100.0, 150.0) is None
    assert rate_warning(0.0, 5.0) is None and rate_warning(100.0, None) is None and rate_warning(None, 1.0) is None


def test_load_points_are_checked_and_labelled() -> None:
    assert LoadPoint.closed(1).label == "c=1" and LoadPoint.closed(4).x == 4.0
    point = LoadPoint.open(2.5)
    assert (point.mode, point.rate, point.arrival, point.max_in_flight) == ("open", 2.5, "poisson", None)
    assert point.label == "2.5/s poisson" and point.x == 2.5
    capped = LoadPoint.open(20, "constant", max_in_flight=1)
    assert capped.label == "20/s constant, max 1 in flight"
    for bad, message in (
        (lambda: LoadPoint.closed(0), "closed loop needs concurrency >= 1, got 0"),
        (lambda: LoadPoint("closed"), "closed loop needs concurrency >= 1, got None"),
        (lambda: LoadPoint.open(0.0), "open loop needs a rate > 0 requests/s, got 0.0"),
        (lambda: LoadPoint("open"), "open loop needs a rate > 0 requests/s, got None"),
        (lambda: LoadPoint.open(5.0, max_in_flight=0), "max_in_flight must be >= 1, got 0"),
    ):
        with pytest.raises(ValueError) as err:
            bad()
        assert str(err.value) == message


def test_constant_arrivals_by_hand() -> None:
    # Rate 4/s: a request every 0.25 s from t = 0; one at exactly max_seconds still goes.
    assert arrival_offsets(4.0, "constant", 10, 1.0, seed=0) == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert arrival_offsets(4.0, "constant", 3, 60.0, seed=0) == pytest.approx([0.0, 0.25, 0.5])
    assert arrival_offsets(4.0, "constant", 1, 60.0, seed=0) == [0.0]
    assert arrival_offsets(4.0, "constant", 0, 60.0, seed=0) == []


def test_poisson_arrivals_start_at_zero_and_differ_by_seed() -> None:
    one = arrival_offsets(50.0, "poisson", 200, 1e9, seed=1)
    assert len(one) == 200 and one[0] == 0.0
    assert all(b > a for a, b in zip(one, one[1:], strict=False))
    assert one != arrival_offsets(50.0, "poisson", 200, 1e9, seed=2)
    assert one[-1] == pytest.approx(199 / 50.0, rel=0.25)  # 199 gaps of mean 1/50 s (sd of the sum ~7%)
