"""benchmarks.train_throughput at a tiny setting: one worker in this process, and (slow) the whole run with
one and two processes, its JSON and chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import train_throughput as tt

TINY = ["--arch", "tiny-text", "--steps", "2", "--warmup", "1", "--docs", "8"]


def test_documents_have_the_size_and_labels_asked_for() -> None:
    docs, labels = tt.documents(6, 4)
    assert [len(d) for d in docs] == [4096] * 6 and labels == [0, 1, 2, 3, 0, 1]
    assert tt.documents(6, 4) == (docs, labels)  # seeded


def test_one_worker_times_its_steps_after_the_warmup(tmp_path: Path) -> None:
    record = tmp_path / "r.json"
    assert tt.main(["--worker", "--kb", "4", "--threads", "1", *TINY, "--record", str(record)]) == 0
    r = json.loads(record.read_text())
    assert (r["processes"], r["cores"], r["steps"], r["warmup_steps"], r["doc_kb"]) == (1, 1, 2, 1, 4)
    assert len(r["step_s"]) == 2 and all(s > 0 for s in r["step_s"])
    assert r["docs"] > 0 and r["tokens"] >= r["docs"] * 256 // 2  # windows of 256 B or more, less head cuts
    assert r["docs_per_s"] == pytest.approx(r["docs"] / sum(r["step_s"]), rel=1e-2)
    assert r["peak_rss_mib_total"] > 50  # a process with torch loaded


@pytest.mark.slow
def test_one_and_two_processes_give_a_ratio_and_a_chart(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert tt.main(["--sizes", "4", "--cores", "2", *TINY, "--out", str(out), "--timeout", "400"]) == 0
    result = json.loads(out.read_text())
    one, two = result["rows"]
    assert (one["processes"], one["threads_per_process"], two["processes"], two["threads_per_process"]) == (1, 2, 2, 1)
    assert one["docs"] == two["docs"]  # the same batches, split over two processes
    assert len(two["peak_rss_mib_per_process"]) == 2
    assert result["two_over_one_process_throughput"]["4"] == pytest.approx(
        two["docs_per_s"] / one["docs_per_s"], rel=1e-2
    )
    assert out.with_suffix(".png").stat().st_size > 1000
