"""The load tester against a live loopback server: sweeps, outputs, error accounting, CLI wiring."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from lara_serve.clients.loadtest import check_loopback, main, make_doc
from lara_serve.clients.loadtest.writers import CSV_COLUMNS
from lara_serve.server.synthetic import make_image_model, make_text_model
from lara_serve.server.testing import free_port, server_process

KEY = "loadtest-test-key"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two text models (for a comparison on one chart) and an image model, behind an API key."""
    repo = tmp_path_factory.mktemp("loadtest_repo")
    make_text_model(repo, "tiny-text", max_length=128)
    make_text_model(repo, "tiny-text-b", max_length=128, seed=1)
    make_image_model(repo, "tiny-image")
    env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_API_KEY": KEY, "LARA_NUM_THREADS": "1"}
    with server_process(["--log-level", "warning"], env=env) as base:
        yield base


def strict_json(path: Path) -> dict[str, Any]:
    def refuse(token: str) -> None:
        raise ValueError(f"{token} in {path}: not valid JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def run(url: str, *args: str) -> int:
    return main(["--url", url, "--api-key", KEY, "--requests", "6", "--seconds", "5", "--warmup", "1", *args])


def test_mixed_sweep_writes_json_csv_and_charts(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    routes = ["--route", "predict", "--route", "classify", "--route", "v2-json", "--route", "v2-binary"]
    assert run(url, "--model", "tiny-text", "--lengths", "32,100", "--concurrency", "1,3", *routes,
               "--out", str(tmp_path)) == 0  # fmt: skip
    table = capsys.readouterr().out
    assert "p99" in table and "v2-binary" in table and "100 B" in table

    report = strict_json(tmp_path / "report.json")
    cells = report["cells"]
    assert report["passed"] and len(cells) == 4 * 2 * 2
    assert {(c["route"], c["input_bytes"], c["concurrency"]) for c in cells} == {
        (r, b, c) for r in ("predict", "classify", "v2-json", "v2-binary") for b in (32.0, 100.0) for c in (1, 3)
    }
    for c in cells:
        assert c["requests"] == 6 and c["errors"] == 0 and c["statuses"] == {"200": 6}
        assert 0 < c["p50_ms"] <= c["p90_ms"] <= c["p95_ms"] <= c["p99_ms"] <= c["max_ms"]
        assert c["throughput_rps"] > 0 and c["batch_size_mean"] >= 1 and c["server_inference_ms_p50"] > 0
        assert 0 <= c["server_queue_ms_p50"] <= c["server_total_ms_p50"] <= c["max_ms"]
        assert c["ok"] == 6 and c["error_rate"] == 0.0 and c["backend"] == "onnxruntime_onnx"
        # throughput is completed requests over the cell's wall time; duration_s is rounded to the
        # millisecond, which alone moves 6 / duration_s by up to 0.0005 / duration_s on a fast cell
        assert c["throughput_rps"] == pytest.approx(6 / c["duration_s"], rel=0.02 + 0.0006 / c["duration_s"])
    assert "***" in report["settings"]["argv"] and KEY not in json.dumps(report)

    with (tmp_path / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == CSV_COLUMNS and len(rows) == len(cells)
    assert {"p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms", "throughput_rps", "batch_size_mean"} <= set(CSV_COLUMNS)
    assert rows[0]["statuses"] == "200:6"

    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["latency_cdf.png", "latency_vs_length.png", "latency_vs_load.png", "throughput_vs_length.png",
                    "throughput_vs_load.png"]  # fmt: skip
    for name in pngs:
        with Image.open(tmp_path / name) as image:
            image.verify()
            assert image.format == "PNG" and image.size[0] > 300


def test_open_loop_and_images_and_files(url: str, tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        buffer = io.BytesIO()
        Image.new("L", (28, 28), color=40 * i).save(buffer, format="PNG")
        (folder / f"{i}.png").write_bytes(buffer.getvalue())
    out = tmp_path / "out"
    # A busy machine can slow six requests below 90% of 40/s: that exit status is tested in test_loadtest_keeps.py.
    assert run(url, "--model", "tiny-image", "--files", str(folder), "--rate", "20,40", "--arrival", "constant",
               "--max-in-flight", "4", "--route", "classify", "--route", "v2-binary", "--out", str(out),
               "--allow-rate-shortfall") == 0  # fmt: skip
    cells = strict_json(out / "report.json")["cells"]
    assert len(cells) == 4 and {c["input"] for c in cells} == {"files"}
    for c in cells:
        assert c["mode"] == "open" and c["arrival"] == "constant" and c["max_in_flight"] == 4
        assert c["ok"] == 6 and 0 <= c["send_lag_p50_ms"] <= c["send_lag_p99_ms"] <= c["send_lag_max_ms"]
        # Six requests at a constant rate take about 5/rate seconds to send.
        assert c["duration_s"] >= 5 / c["rate"] * 0.9
    assert (out / "latency_vs_load.png").is_file() and not (out / "latency_vs_length.png").exists()


def colour_pixels(png: Path, colour: Any) -> int:
    """How many pixels of the chart have (within a few levels) this matplotlib colour."""
    from matplotlib.colors import to_rgb

    rgb = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)  # [H, W, 3]
    target = np.round(np.array(to_rgb(colour)) * 255).astype(np.int16)
    return int((np.abs(rgb - target).max(axis=-1) <= 8).sum())


def test_two_models_on_one_chart(url: str, tmp_path: Path) -> None:
    from lara_serve.clients.loadtest import charts

    assert run(url, "--model", "tiny-text", "--model", "tiny-text-b", "--lengths", "16,64", "--concurrency", "2",
               "--out", str(tmp_path)) == 0  # fmt: skip
    report = strict_json(tmp_path / "report.json")
    assert [t["label"] for t in report["targets"]] == ["tiny-text", "tiny-text-b"]
    assert all(t["task"] == "text" and t["backend"] == "onnxruntime_onnx" for t in report["targets"])
    assert sorted((c["target"], c["input"]) for c in report["cells"]) == [
        ("tiny-text", "16 B"), ("tiny-text", "64 B"), ("tiny-text-b", "16 B"), ("tiny-text-b", "64 B")]  # fmt: skip
    # Colour = the load (one here), line style = the model: the chart the run wrote holds two lines of the
    # load's colour, so about twice the coloured pixels of the same run with one model.
    first = charts.plt.get_cmap("tab10").colors[0]
    assert run(url, "--model", "tiny-text", "--lengths", "16,64", "--concurrency", "2",
               "--out", str(tmp_path / "one")) == 0  # fmt: skip
    two = colour_pixels(tmp_path / "latency_vs_length.png", first)
    one = colour_pixels(tmp_path / "one" / "latency_vs_length.png", first)
    assert one > 100 and two > 1.3 * one


def test_stopped_server_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["--url", dead, "--model", "tiny-text", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the server" in err and dead in err
    assert not (tmp_path / "report.json").exists()


def _requests_counted(url: str, model: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    pattern = rf'^lara_requests_total\{{[^}}]*model="{model}"[^}}]*\}} ([0-9.e+]+)$'
    return sum(float(m) for m in re.findall(pattern, text, flags=re.M))


def test_wrong_input_kind_is_a_usage_error_before_any_request(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = _requests_counted(url, "tiny-image")
    assert run(url, "--model", "tiny-image", "--lengths", "64") == 2
    err = capsys.readouterr().err
    assert "image model" in err and "text" in err
    assert run(url, "--model", "tiny-text", "--set", "fashion") == 2  # images to a text model
    assert "text model" in capsys.readouterr().err
    assert _requests_counted(url, "tiny-image") == before


def test_errors_are_counted_not_averaged(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 200 bytes to a model that takes 128: every request is a 413. No warm-up, so the cell runs.
    args = ["--model", "tiny-text", "--lengths", "200", "--concurrency", "2", "--warmup", "0", "--out", str(tmp_path)]
    assert run(url, *args) == 1
    assert "FAILED" in capsys.readouterr().err
    (cell,) = strict_json(tmp_path / "report.json")["cells"]
    assert cell["statuses"] == {"413": 6} and cell["errors"] == 6 and cell["error_rate"] == 1.0
    assert cell["p50_ms"] is None and cell["throughput_rps"] == 0.0
    # A threshold the run may pass, once failed cells (no successful answer) are allowed too.
    assert run(url, *args, "--fail-on-error-rate", "1.0", "--allow-failed-cells") == 0
    # With warm-up the 413 is seen first and the input is skipped with the server's reason.
    mixed = ["--model", "tiny-text", "--lengths", "64,200", "--concurrency", "1", "--out", str(tmp_path)]
    assert run(url, *mixed, "--allow-failed-cells") == 0
    skipped = [c for c in strict_json(tmp_path / "report.json")["cells"] if c["skipped"]]
    assert [c["input"] for c in skipped] == ["200 B"] and "413" in skipped[0]["skipped"]


def test_builtin_sets(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(url, "--model", "tiny-image", "--set", "fashion", "--concurrency", "2") == 0
    assert run(url, "--model", "tiny-text", "--set", "bbc", "--truncate", "--concurrency", "2") == 0
    # A corpus that is not there skips that set, says so, and keeps the rest of the run.
    monkeypatch.setenv("LARA_BROWN_DIR", str(tmp_path / "no-brown-here"))
    out = tmp_path / "out"
    assert run(url, "--model", "tiny-text", "--lengths", "32", "--set", "brown", "--concurrency", "1",
               "--out", str(out)) == 0  # fmt: skip
    report = strict_json(out / "report.json")
    assert any("skipped set 'brown'" in note for note in report["notes"])
    assert [c["input"] for c in report["cells"]] == ["32 B"]


def test_cli_subcommand_honours_environment(url: str, tmp_path: Path) -> None:
    env = {**os.environ, "LARA_URL": url, "LARA_API_KEY": KEY}
    cmd = [sys.executable, "-m", "lara_serve.clients", "loadtest", "--model", "tiny-text", "--lengths", "48", "--concurrency",
           "1", "--requests", "3", "--warmup", "0", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "48 B" in done.stdout and strict_json(tmp_path / "report.json")["cells"][0]["ok"] == 3
    no_key = subprocess.run(cmd, env={**env, "LARA_API_KEY": ""}, capture_output=True, text=True, timeout=60)
    assert no_key.returncode == 1 and "401" in no_key.stderr


def test_loopback_only_unless_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    for ok in ("http://127.0.0.1:8000", "http://localhost:1", "http://127.3.2.1"):
        check_loopback(ok)
    for remote in ("http://10.0.0.1:8000", "http://example.com", "http://[2001:db8::1]/"):
        with pytest.raises(ValueError, match="loopback"):
            check_loopback(remote)
    assert main(["--url", "http://10.0.0.1:8000", "--model", "m"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert len(make_doc(2048, 0).encode()) == 2048 and make_doc(100, 1) == make_doc(100, 1)
    docs = {make_doc(100, seed) for seed in range(8)}
    assert len(docs) == 8 and all(len(d) == 100 and d.isascii() for d in docs)  # seeds give different texts
    assert len(set(make_doc(300, 3).split())) > 5  # words, not one repeated token


def test_time_limit_skips_longer_inputs_and_heavier_loads(url: str, tmp_path: Path) -> None:
    # A limit no request can meet: only the first (shortest, lightest) cell runs; the rest say why.
    assert run(url, "--model", "tiny-text", "--lengths", "16,64", "--concurrency", "1,2", "--max-p50-ms", "0.001",
               "--out", str(tmp_path)) == 0  # fmt: skip
    cells = strict_json(tmp_path / "report.json")["cells"]
    assert [(c["input"], c["load"], c["skipped"] is None) for c in cells] == [
        ("16 B", "c=1", True), ("16 B", "c=2", False), ("64 B", "c=1", False), ("64 B", "c=2", False)]  # fmt: skip
    assert all("exceeded the limit" in c["skipped"] for c in cells[1:])
    assert run(url, "--model", "tiny-text", "--lengths", "16", "--budget-s", "0", "--out", str(tmp_path)) == 0
    cells = strict_json(tmp_path / "report.json")["cells"]
    assert len(cells) == 2 and all("time budget" in c["skipped"] for c in cells)
