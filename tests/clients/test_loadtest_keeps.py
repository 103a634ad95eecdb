"""The load tester keeps what it measured and says when it should not be trusted: Ctrl-C writes the finished
cells, open loops short of their rate and unstable cells fail the run, the grpc route (KServe v2 gRPC,
checked against the server's own statistics through tritonclient.grpc), byte lengths with K and M, the
start time, and examples shipped inside the package.

One live loopback server (tiny synthetic models, HTTP and gRPC) for the module; a few requests per cell."""

from __future__ import annotations

import asyncio
import calendar
import io
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from lara_serve.clients.loadtest import inputs, main
from lara_serve.clients.loadtest import sweep as sweep_module
from lara_serve.clients.loadtest.cli import _sizes
from lara_serve.clients.loadtest.inputs import InputError, synthetic_text
from lara_serve.clients.loadtest.report import Target
from lara_serve.clients.loadtest.runner import CellRun, Sample
from lara_serve.clients.loadtest.schedule import LoadPoint
from lara_serve.clients.loadtest.sweep import Interrupted, SweepPlan, check_plan
from lara_serve.server.synthetic import make_image_model, make_text_model
from lara_serve.server.testing import free_port, server_process

grpcclient = pytest.importorskip("tritonclient.grpc")
KEY = "keeps-test-key"  # the grpc route sends it as metadata, the HTTP routes as a header


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(HTTP base URL, gRPC host:port) of one server with a text model (128 bytes at most) and an image model."""
    repo = tmp_path_factory.mktemp("keeps_repo")
    make_text_model(repo, "tiny-text", max_length=128)
    make_image_model(repo, "tiny-image")
    port = free_port()
    env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_NUM_THREADS": "1", "LARA_API_KEY": KEY}
    with server_process(["--log-level", "warning", "--grpc-port", str(port)], env=env) as url:
        yield url, f"127.0.0.1:{port}"


def run(url: str, *args: str) -> int:
    return main(["--url", url, "--api-key", KEY, "--requests", "6", "--seconds", "5", "--warmup", "1", "--no-progress",
                 *args])  # fmt: skip


def report(out: Path) -> dict[str, Any]:
    return json.loads((out / "report.json").read_text())


def utc(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


# -- lengths and examples: no server ---------------------------------------------------------------------------


def test_lengths_take_k_and_m_and_refuse_anything_else(capsys: pytest.CaptureFixture[str]) -> None:
    assert _sizes("512,512B,4K,4KB,4KiB,1.5k,1M,1MB,1MiB,2m") == [512, 512, 4096, 4096, 4096, 1536, *[1 << 20] * 3,
                                                                  2 << 20]  # fmt: skip
    for bad in ("1G", "1T", "abc", "0", "1.5", "0.1K", "-4K", "4 KB extra"):
        with pytest.raises(SystemExit) as exit_:
            main(["--model", "m", "--lengths", f"32,{bad}"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"not a byte length: {bad!r}" in err and "KiB" in err and "MiB" in err


def test_examples_ship_inside_the_client_package() -> None:
    assert Path(inputs.__file__).resolve().parent / "examples" == inputs.EXAMPLES
    text = inputs.builtin("examples-text")
    assert text.kind == "text" and all(p.data.decode("utf-8").isascii() for p in text.payloads)
    assert min(len(p.data) for p in text.payloads) > 500
    images = inputs.builtin("examples-image")
    assert images.kind == "image" and images.payloads
    for payload in images.payloads:
        with Image.open(io.BytesIO(payload.data)) as image:
            assert image.format == "PNG" and image.size == (28, 28) and payload.content_type == "image/png"


def test_grpc_route_needs_a_grpc_port() -> None:
    target = Target("http://127.0.0.1:9", "m", "text", "m")  # a server that reported no gRPC
    plan = SweepPlan([target], [synthetic_text(16, count=1)], [LoadPoint.closed(1)], routes=["grpc"])
    with pytest.raises(InputError, match="--grpc-port"):
        check_plan(plan)


def test_a_cancelled_sweep_keeps_its_finished_cells_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    async def first_then_cancelled(*args: Any, **kwargs: Any) -> CellRun:
        calls.append(1)
        if len(calls) == 2:
            raise asyncio.CancelledError  # what Ctrl-C under asyncio.run delivers inside the running cell
        return CellRun([Sample(0.0, 0.0, 0.01, "200", {})], 1.0, "requests")

    async def no_warm_up(*args: Any) -> None:
        return None

    monkeypatch.setattr(sweep_module, "run_cell", first_then_cancelled)
    monkeypatch.setattr(sweep_module, "_warm_up", no_warm_up)
    target = Target("http://127.0.0.1:9", "m", "text", "m")
    plan = SweepPlan([target], [synthetic_text(16, count=1)], [LoadPoint.closed(1), LoadPoint.closed(2)], warmup=0)
    with pytest.raises(Interrupted) as info:
        asyncio.run(sweep_module.run_sweep(plan, log=lambda line: None, keep_on_cancel=True))
    assert [c.load for c in info.value.cells] == ["c=1"] and info.value.total == 2
    calls.clear()
    with pytest.raises(asyncio.CancelledError):  # other callers (benchmarks) keep plain cancellation
        asyncio.run(sweep_module.run_sweep(plan, log=lambda line: None))


# -- a live server -----------------------------------------------------------------------------------------------


def test_grpc_route_is_measured_like_http(server: tuple[str, str], tmp_path: Path) -> None:
    url, grpc_url = server
    client = grpcclient.InferenceServerClient(url=grpc_url)

    def served() -> int:
        (stats,) = client.get_inference_statistics("tiny-image", headers={"x-api-key": KEY}, as_json=True)[
            "model_stats"
        ]
        return int(stats["inference_stats"]["success"].get("count", 0))  # JSON of a proto omits zeros

    before = served()
    # No --grpc-url: the port comes from the server's /info.
    assert run(url, "--model", "tiny-image", "--set", "examples-image", "--route", "grpc", "--concurrency", "2",
               "--out", str(tmp_path)) == 0  # fmt: skip
    assert served() - before == 1 + 6  # the warm-up and the cell, as the server counted them
    data = report(tmp_path)
    (cell,) = data["cells"]
    assert data["targets"][0]["grpc_url"] == grpc_url and data["passed"]
    assert cell["route"] == "grpc" and cell["statuses"] == {"OK": 6} and cell["ok"] == 6
    assert 0 < cell["p50_ms"] <= cell["p99_ms"] and cell["throughput_rps"] > 0
    # The server's timing came back as trailing metadata, as the HTTP routes get it in headers.
    assert cell["server_inference_ms_p50"] > 0 and cell["server_queue_ms_p50"] >= 0 and cell["batch_size_mean"] >= 1

    both = ["--model", "tiny-text", "--lengths", "32,200", "--concurrency", "1", "--route", "v2-binary",
            "--route", "grpc", "--grpc-url", grpc_url, "--out", str(tmp_path)]  # fmt: skip
    assert run(url, *both) == 1  # 200 bytes to a 128-byte model: refused on both routes
    cells = {(c["route"], c["input"]): c for c in report(tmp_path)["cells"]}
    assert cells["grpc", "32 B"]["statuses"] == {"OK": 6} and cells["v2-binary", "32 B"]["statuses"] == {"200": 6}
    assert "RESOURCE_EXHAUSTED" in cells["grpc", "200 B"]["skipped"] and cells["grpc", "200 B"]["refused"]
    assert run(url, *both, "--allow-failed-cells") == 0


def test_grpc_errors_are_counted_and_usage_is_checked(server: tuple[str, str], capsys: pytest.CaptureFixture) -> None:
    url, _ = server
    dead = f"127.0.0.1:{free_port()}"
    args = ["--model", "tiny-text", "--lengths", "16", "--concurrency", "1", "--route", "grpc", "--warmup", "0"]
    assert run(url, *args, "--requests", "3", "--grpc-url", dead) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err
    for bad, message in ((["--grpc-url", "127.0.0.1"], "host:port"), (["--grpc-url", "10.1.2.3:8001"], "loopback")):
        assert run(url, *args, *bad) == 2
        assert message in capsys.readouterr().err
    assert run(url, "--model", "tiny-text", "--grpc-url", dead) == 2  # without --route grpc
    assert "--route grpc" in capsys.readouterr().err


def test_an_open_loop_short_of_its_rate_fails_unless_allowed(
    server: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2000/s offered with one request in flight: a request takes over a millisecond, so at most about half
    # the rate comes back.
    args = ["--model", "tiny-text", "--lengths", "16", "--rate", "2000", "--arrival", "constant",
            "--max-in-flight", "1", "--requests", "20", "--out", str(tmp_path)]  # fmt: skip
    assert run(server[0], *args) == 1
    err = capsys.readouterr().err
    assert "of the 2000 offered" in err and "--allow-rate-shortfall" in err
    data = report(tmp_path)
    (cell,) = data["cells"]
    assert cell["rate_short"] is True and cell["achieved_rps"] < 1800 and data["passed"] is False
    assert run(server[0], *args, "--allow-rate-shortfall") == 0
    assert report(tmp_path)["passed"] is True and report(tmp_path)["allow_rate_shortfall"] is True


def test_unstable_cells_fail_on_request(
    server: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Three windows never agree within 0.001% on both throughput and p50.
    args = ["--model", "tiny-text", "--lengths", "16", "--concurrency", "1", "--requests", "4",
            "--stability-percentage", "0.001", "--max-windows", "3", "--out", str(tmp_path)]  # fmt: skip
    assert run(server[0], *args) == 0  # as before: unstable is a warning unless asked
    (cell,) = report(tmp_path)["cells"]
    assert cell["stable"] is False and cell["windows"] == 3
    assert run(server[0], *args, "--fail-on-unstable") == 1
    assert "unstable over 3 windows" in capsys.readouterr().err
    assert run(server[0], "--model", "tiny-text", "--fail-on-unstable") == 2  # no stability test asked for
    assert "--stability-percentage" in capsys.readouterr().err


def test_ctrl_c_writes_the_finished_cells(server: tuple[str, str], tmp_path: Path) -> None:
    """Two cells of two seconds each; Ctrl-C while the second runs."""
    cmd = [sys.executable, "-m", "lara_serve.clients.loadtest", "--url", server[0], "--api-key", KEY, "--model", "tiny-text",
           "--lengths", "16", "--concurrency", "1,2", "--requests", "100000", "--seconds", "2", "--warmup", "0",
           "--no-progress", "--out", str(tmp_path)]  # fmt: skip
    launched = time.time()
    # SIGINT as a terminal delivers it, also when this test runs where SIGINT is ignored (a background job).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert proc.stderr is not None
    try:
        deadline = time.monotonic() + 60
        line = ""
        while not line.startswith("[1/2]") and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the load tester ended before its first cell"
        time.sleep(0.3)  # well inside the second cell
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    after = [e for e in err.splitlines() if e.strip()]
    assert proc.returncode == 130 and len(after) == 1, err
    assert after[0].startswith("interrupted after 1 of 2 cells (Ctrl-C)") and "Traceback" not in err
    assert "c=1" in out and "c=2" not in out  # the table of the finished cell
    data = report(tmp_path)
    assert data["interrupted"].startswith("after 1 of 2 cells (Ctrl-C)") and data["passed"] is False
    (cell,) = data["cells"]
    assert cell["load"] == "c=1" and cell["ok"] > 0 and cell["stopped_by"] == "seconds"
    assert len((tmp_path / "report.csv").read_text().splitlines()) == 2  # header and the cell
    assert (tmp_path / "latency_cdf.png").is_file() and "interrupted" in (tmp_path / "report.html").read_text()
    # started_utc is the start: the first cell alone took two seconds after it.
    started, finished = utc(data["settings"]["started_utc"]), utc(data["settings"]["finished_utc"])
    assert int(launched) <= started <= launched + 5 and finished - started >= 2
