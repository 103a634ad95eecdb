"""The load tester's statistics on hand-made samples: every figure of a cell computed here by hand, so a
slip in a percentile, a rate or the error accounting cannot hide behind a live server's noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lara_serve.clients.loadtest.inputs import InputGroup, Payload
from lara_serve.clients.loadtest.report import Report, Target, percentile, skipped_cell, summarize
from lara_serve.clients.loadtest.runner import CellRun, Sample
from lara_serve.clients.loadtest.schedule import LoadPoint

TARGET = Target(url="http://127.0.0.1:1", model="m", task="text", label="m", backend="lara_onnxruntime")
GROUP = InputGroup("3 B", "text", (Payload("text", b"abc", "text/plain"), Payload("text", b"abcde", "text/plain")))


def sample(scheduled: float, latency_ms: float, status: str = "200", lag_ms: float = 0.0, **server: float) -> Sample:
    return Sample(scheduled, scheduled + lag_ms / 1000, scheduled + latency_ms / 1000, status, dict(server))


@given(values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), q=st.sampled_from([0, 1, 50, 90, 95, 99, 100]))
@settings(max_examples=100, deadline=None)
def test_percentile_is_numpys_linear_interpolation(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_percentile_by_hand() -> None:
    values = [40.0, 10.0, 30.0, 20.0]  # sorted: 10 20 30 40
    assert percentile(values, 50) == 25.0  # halfway between the 2nd and 3rd
    assert percentile(values, 90) == pytest.approx(37.0)  # position 2.7: 30 + 0.7 * 10
    assert percentile(values, 100) == 40.0 and percentile(values, 0) == 10.0
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None
    assert values == [40.0, 10.0, 30.0, 20.0]  # the caller's list is not sorted in place


def test_closed_cell_summary_by_hand() -> None:
    samples = [
        sample(0.0, 10.0, queue_ms=1.0, inference_ms=5.0, total_ms=8.0, batch_size=1),
        sample(0.1, 20.0, queue_ms=3.0, inference_ms=6.0, total_ms=12.0, batch_size=3),
        sample(0.2, 30.0, queue_ms=2.0, inference_ms=7.0, total_ms=10.0, batch_size=2),
        sample(0.3, 40.0, queue_ms=4.0, inference_ms=8.0, total_ms=20.0, batch_size=2),
        sample(0.4, 5.0, status="413"),  # errors: counted by status, never in the latency figures
        sample(0.5, 900.0, status="timeout"),
    ]
    cell = summarize(TARGET, "predict", GROUP, LoadPoint.closed(2), CellRun(samples, 2.0, "requests"))
    assert (cell.requests, cell.ok, cell.errors) == (6, 4, 2)
    assert cell.error_rate == pytest.approx(2 / 6, abs=1e-4) and cell.statuses == {"200": 4, "413": 1, "timeout": 1}
    assert cell.throughput_rps == 2.0 and cell.achieved_rps == 3.0  # 4 answered and 6 sent in 2 s
    assert cell.offered_rps is None  # a closed loop offers no rate
    assert (cell.p50_ms, cell.p90_ms, cell.p95_ms, cell.p99_ms) == pytest.approx((25.0, 37.0, 38.5, 39.7))
    assert cell.max_ms == pytest.approx(40.0) and cell.mean_ms == pytest.approx(25.0)
    assert cell.server_queue_ms_p50 == 2.5 and cell.server_queue_ms_mean == 2.5
    assert cell.server_inference_ms_p50 == 6.5 and cell.server_total_ms_p50 == 11.0
    assert cell.server_total_ms_mean == 12.5
    assert cell.batch_size_mean == 2.0 and cell.batch_size_max == 3
    assert cell.send_lag_p50_ms is None  # closed loop: no schedule to lag behind
    assert cell.latencies_ms == pytest.approx([10.0, 20.0, 30.0, 40.0])
    assert (cell.input_bytes, cell.load, cell.stopped_by, cell.duration_s) == (4.0, "c=2", "requests", 2.0)
    assert "latencies_ms" not in cell.to_dict()


def test_open_cell_send_lag_and_no_successes() -> None:
    samples = [sample(0.0, 50.0, "503", lag_ms=0.0), sample(0.1, 60.0, "503", lag_ms=10.0),
               sample(0.2, 70.0, "503", lag_ms=30.0)]  # fmt: skip
    cell = summarize(TARGET, "classify", GROUP, LoadPoint.open(10.0, "constant"), CellRun(samples, 1.5, "seconds"))
    assert cell.error_rate == 1.0 and cell.throughput_rps == 0.0 and cell.offered_rps == 10.0
    assert cell.achieved_rps == 2.0  # 3 answers in 1.5 s against 10/s offered
    assert cell.p50_ms is None and cell.max_ms is None and cell.mean_ms is None and cell.batch_size_max is None
    assert cell.send_lag_p50_ms == pytest.approx(10.0) and cell.send_lag_p99_ms == pytest.approx(29.6)
    assert cell.send_lag_max_ms == pytest.approx(30.0)
    assert cell.load == "10/s constant" and cell.arrival == "constant"


def test_empty_run_has_no_figures_never_nan() -> None:
    cell = summarize(TARGET, "predict", GROUP, LoadPoint.closed(1), CellRun([], 0.0, "seconds"))
    assert cell.requests == 0 and cell.error_rate is None and cell.throughput_rps is None
    assert all(v is None or not (isinstance(v, float) and math.isnan(v)) for v in cell.to_dict().values())


def test_error_rate_threshold_is_exceeded_only_above_it() -> None:
    samples = [sample(0.0, 10.0), sample(0.1, 10.0, "500")]  # error rate 0.5
    run = CellRun(samples, 1.0, "requests")
    cells = [summarize(TARGET, "predict", GROUP, LoadPoint.closed(1), run),
             skipped_cell(TARGET, "predict", GROUP, LoadPoint.closed(2), "too slow")]  # fmt: skip
    assert Report({}, [TARGET], cells, fail_on_error_rate=0.5).failures == []
    (failure,) = Report({}, [TARGET], cells, fail_on_error_rate=0.49).failures
    assert failure == "m predict 3 B c=1: 1/2 errors {'200': 1, '500': 1}"
    assert Report({}, [TARGET], cells, fail_on_error_rate=0.49).to_dict()["passed"] is False


def test_rounding_and_short_runs() -> None:
    samples = [sample(0.0, 12.34567, batch_size=1), sample(0.1, 20.0, batch_size=2), sample(0.2, 30.0, batch_size=2)]
    cell = summarize(TARGET, "predict", GROUP, LoadPoint.closed(1), CellRun(samples, 0.5, "requests"))
    assert cell.throughput_rps == 6.0  # a run shorter than a second still has a rate
    assert cell.p50_ms == 20.0 and cell.max_ms == 30.0 and min(cell.latencies_ms) == pytest.approx(12.34567)
    assert cell.mean_ms == round((12.34567 + 50.0) / 3, 3)  # figures keep three decimals (microseconds)
    assert cell.batch_size_mean == 1.67  # batch sizes two


def test_skipped_cells_and_the_default_threshold() -> None:
    skipped = skipped_cell(TARGET, "v2-json", GROUP, LoadPoint.open(5.0), "exceeded the limit")
    assert skipped.skipped == "exceeded the limit" and skipped.route == "v2-json"
    assert (skipped.requests, skipped.ok, skipped.errors, skipped.error_rate, skipped.p50_ms) == (0, 0, 0, None, None)
    one_error = summarize(TARGET, "predict", GROUP, LoadPoint.closed(1),
                          CellRun([sample(0.0, 1.0)] * 99 + [sample(0.1, 1.0, "500")], 1.0, "requests"))  # fmt: skip
    assert one_error.error_rate == 0.01
    assert len(Report({}, [TARGET], [one_error, skipped]).failures) == 1  # by default any error fails the run
