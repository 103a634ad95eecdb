"""The load tester's rigour: measurement windows and their stability test, thin percentiles, achieved vs
offered rate, failed cells and the exit status, built-in inputs of the lean install, charts and report.html.

Window logic runs on scripted runs (deterministic); the exit status, outputs and inputs on a live loopback
server with tiny synthetic models (bounded: a few requests per cell)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lara_serve.clients.loadtest import main
from lara_serve.clients.loadtest import sweep as sweep_module
from lara_serve.clients.loadtest.inputs import EXAMPLES, InputError, builtin, synthetic_text
from lara_serve.clients.loadtest.report import Target
from lara_serve.clients.loadtest.rigour import Stability, WindowStats, is_stable, percentile_warnings, rate_warning
from lara_serve.clients.loadtest.runner import CellRun, Sample
from lara_serve.clients.loadtest.schedule import LoadPoint
from lara_serve.clients.loadtest.sweep import SweepPlan, run_sweep
from lara_serve.server.synthetic import make_image_model, make_text_model
from lara_serve.server.testing import server_process

# -- windows and stability, on scripted runs --------------------------------------------------------------


def scripted_run(n_ok: int, latency_s: float, duration_s: float) -> CellRun:
    samples = [Sample(0.0, 0.0, latency_s, "200", {}) for _ in range(n_ok)]
    return CellRun(samples, duration_s, "requests")


def sweep_with(monkeypatch: pytest.MonkeyPatch, runs: list[CellRun], stability: Stability | None) -> Any:
    """One cell through run_sweep, its windows answered by `runs` in order; returns (cell, windows used)."""
    used: list[int] = []

    async def fake_run_cell(*args: Any, **kwargs: Any) -> CellRun:
        used.append(len(used))
        return runs[len(used) - 1]

    async def no_warm_up(*args: Any) -> None:
        return None

    monkeypatch.setattr(sweep_module, "run_cell", fake_run_cell)
    monkeypatch.setattr(sweep_module, "_warm_up", no_warm_up)
    target = Target("http://127.0.0.1:9", "m", "text", "m")
    plan = SweepPlan([target], [synthetic_text(16, count=1)], [LoadPoint.closed(1)], stability=stability, warmup=0)
    (cell,) = asyncio.run(run_sweep(plan, log=lambda line: None))
    return cell, len(used)


def test_a_stable_cell_stops_after_three_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [scripted_run(100, 0.010, 1.0), scripted_run(102, 0.0102, 1.0), scripted_run(99, 0.0099, 1.0)]
    runs += [scripted_run(1, 1.0, 1.0)] * 5  # would break the agreement if they were run
    cell, used = sweep_with(monkeypatch, runs, Stability(5.0, max_windows=8))
    assert used == 3 and cell.windows == 3 and cell.stable is True
    assert cell.requests == 301 and not any("unstable" in w for w in cell.warnings)
    assert cell.window_p50_ms == [10.0, 10.2, 9.9]


def test_an_unstable_cell_runs_to_the_maximum_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [scripted_run(100, 0.010 * (1 + i % 2), 1.0) for i in range(5)]  # p50 alternates 10 ms / 20 ms
    cell, used = sweep_with(monkeypatch, runs, Stability(5.0, max_windows=5))
    assert used == 5 and cell.windows == 5 and cell.stable is False
    assert any(w.startswith("unstable") and "5%" in w for w in cell.warnings)
    assert cell.requests == 300  # the figures are over the last three windows


def test_windows_settle_once_the_last_three_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [scripted_run(50, 0.050, 1.0)] + [scripted_run(100, 0.010, 1.0)] * 4  # a slow first window (warming)
    cell, used = sweep_with(monkeypatch, runs, Stability(10.0, max_windows=6))
    assert used == 4 and cell.stable is True and cell.p50_ms == 10.0


def test_without_stability_a_cell_is_one_run(monkeypatch: pytest.MonkeyPatch) -> None:
    cell, used = sweep_with(monkeypatch, [scripted_run(10, 0.01, 1.0)], None)
    assert used == 1 and cell.windows is None and cell.stable is None


def test_stability_rules() -> None:
    assert is_stable([WindowStats(10, 5), WindowStats(10.4, 5.2), WindowStats(9.8, 4.9)], 5.0)
    assert not is_stable([WindowStats(10, 5), WindowStats(10, 5)], 5.0)  # fewer than three windows
    assert not is_stable([WindowStats(10, 5), WindowStats(10, None), WindowStats(10, 5)], 50.0)  # no p50
    assert not is_stable([WindowStats(10, 5), WindowStats(13, 5), WindowStats(10, 5)], 5.0)  # throughput moved
    with pytest.raises(ValueError, match="at least 3"):
        Stability(5.0, max_windows=2)
    with pytest.raises(ValueError, match="stability-percentage"):
        Stability(0.0)


def test_thin_percentiles_and_short_rates_are_named() -> None:
    thin = percentile_warnings(12)
    assert any(w.startswith("p99 rests on 12 samples (needs >= 100)") for w in thin)
    assert any(w.startswith("p95 ") for w in thin) and not any(w.startswith("p90 ") for w in thin)
    assert percentile_warnings(100) == [] and percentile_warnings(0) == []
    assert "11.9 req/s of the 20 offered" in (rate_warning(20.0, 11.9) or "")
    assert rate_warning(20.0, 19.5) is None and rate_warning(None, 3.0) is None


# -- a live server ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("rigour_repo")
    make_text_model(repo, "tiny-text", max_length=128)
    make_image_model(repo, "tiny-image")
    with server_process(["--log-level", "warning"], env={"LARA_MODEL_REPOSITORY": str(repo)}) as base:
        yield base


def run(url: str, *args: str) -> int:
    return main(["--url", url, "--requests", "6", "--seconds", "5", "--warmup", "1", "--no-progress", *args])


def report(out: Path) -> dict[str, Any]:
    return json.loads((out / "report.json").read_text())


def test_an_always_refused_cell_fails_the_run(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 200 bytes to a model that takes 128: warm-up sees the 413 and skips the cell; the run fails anyway.
    args = ["--model", "tiny-text", "--lengths", "64,200", "--concurrency", "1", "--out", str(tmp_path)]
    assert run(url, *args) == 1
    err = capsys.readouterr().err
    assert "no successful response" in err and "413" in err and "--allow-failed-cells" in err
    assert report(tmp_path)["passed"] is False
    assert run(url, *args, "--allow-failed-cells") == 0
    # Without warm-up the cell runs, every request a 413: a lenient error rate does not hide it.
    no_warmup = ["--model", "tiny-text", "--lengths", "200", "--concurrency", "1", "--warmup", "0"]
    assert run(url, *no_warmup, "--fail-on-error-rate", "1.0") == 1
    assert run(url, *no_warmup, "--fail-on-error-rate", "1.0", "--allow-failed-cells") == 0


def test_offered_rate_is_the_configured_rate(url: str, tmp_path: Path) -> None:
    # Six Poisson arrivals may fall short of 40/s by chance alone: that fails a run (exit 1), not this check.
    args = ["--model", "tiny-text", "--lengths", "32", "--rate", "40", "--allow-rate-shortfall", "--out", str(tmp_path)]
    assert run(url, *args) == 0
    (cell,) = report(tmp_path)["cells"]
    assert cell["offered_rps"] == 40.0 and cell["achieved_rps"] > 0 and isinstance(cell["rate_short"], bool)
    assert any("p99 rests on 6 samples" in w for w in cell["warnings"])  # 6 requests: p99 is the max
    assert run(url, "--model", "tiny-text", "--lengths", "32", "--concurrency", "2", "--out", str(tmp_path)) == 0
    (closed,) = report(tmp_path)["cells"]
    assert closed["offered_rps"] is None and closed["rate_short"] is None and closed["achieved_rps"] > 0


def test_windows_live_and_html_report(url: str, tmp_path: Path) -> None:
    args = ["--model", "tiny-text", "--lengths", "16,64", "--concurrency", "1,2", "--requests", "8"]
    assert run(url, *args, "--stability-percentage", "90", "--max-windows", "4", "--out", str(tmp_path)) == 0
    data = report(tmp_path)
    assert data["settings"]["stability_percentage"] == 90.0
    for cell in data["cells"]:
        assert 3 <= cell["windows"] <= 4 and isinstance(cell["stable"], bool)
        assert len(cell["window_p50_ms"]) == cell["windows"]
    page = (tmp_path / "report.html").read_text()
    assert "<table>" in page and "16 B" in page and "passed" in page
    for png in ("latency_vs_length.png", "throughput_vs_load.png", "latency_cdf.png"):
        assert (tmp_path / png).stat().st_size > 5000
        assert f'src="{png}"' in page


def test_without_matplotlib_the_run_says_how_to_get_charts(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "lara_serve.clients.loadtest.charts", None)  # import fails as without matplotlib
    assert run(url, "--model", "tiny-text", "--lengths", "32", "--concurrency", "1", "--out", str(tmp_path)) == 0
    assert "pip install -e '.[loadtest]'" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.png")) and "No charts" in (tmp_path / "report.html").read_text()


def test_examples_sets_need_no_data_package(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # as in the lean install: no torch, no model_export (submodules an earlier test imported included)
    lean = "lara_serve.model_export"
    for name in [m for m in sys.modules if m == lean or m.startswith(f"{lean}.")] + [lean]:
        monkeypatch.setitem(sys.modules, name, None)
    assert run(url, "--model", "tiny-text", "--set", "examples-text", "--truncate", "--concurrency", "1") == 0
    assert run(url, "--model", "tiny-image", "--set", "examples-image", "--concurrency", "1") == 0
    with pytest.raises(InputError, match="examples-text"):
        builtin("bbc")  # the message names what works without the full install
    assert any(EXAMPLES.glob("*.txt")) and any(EXAMPLES.glob("*.png"))


def test_chart_panels_have_ticks_and_the_legend_is_outside(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    charts = pytest.importorskip("lara_serve.clients.loadtest.charts")
    from lara_serve.clients.loadtest.report import summarize

    target = Target("http://127.0.0.1:9", "m", "text", "m")
    cells = []
    for n_bytes, base in ((1024, 0.100), (4096, 0.2)):  # 1 KB: latencies within 10% (no log decade)
        for c in (1, 8):
            run_ = CellRun([Sample(0, 0, base * c * (1 + i / 100), "200", {}) for i in range(10)], 1.0, "requests")
            cells.append(summarize(target, "predict", synthetic_text(n_bytes, 1), LoadPoint.closed(c), run_))
    figures: list[Any] = []

    def keep(fig: Any, path: Path) -> Path:
        fig.canvas.draw()
        figures.append(fig)
        return path

    monkeypatch.setattr(charts, "_save", keep)
    charts.latency_cdf(cells, tmp_path)
    (fig,) = figures
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2
    for ax in panels:
        assert [t.get_text() for t in ax.get_xticklabels() if t.get_text()], ax.get_title()
        assert [t.get_text() for t in ax.get_yticklabels() if t.get_text()], ax.get_title()
    legend = fig.legends[0].get_window_extent()
    assert legend.x0 >= max(ax.get_window_extent().x1 for ax in panels)  # right of every panel
    colours = {line.get_color() for line in panels[0].get_lines()}
    assert len(colours) == 2  # one colour per concurrency
