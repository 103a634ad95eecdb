"""Start-up errors are one line and come before any model loads; metrics on their own port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from lara_serve.server.__main__ import main
from lara_serve.server.testing import free_port, server_process


def start(repo: Path, *args: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "lara_serve.server", "--model-repository", str(repo), "--log-level", "info", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr + done.stdout, time.monotonic() - t0


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output  # no traceback, no model-loading log before it
    assert lines[0].startswith("lara-serve: error: ")
    return lines[0]


def test_port_in_use_is_found_before_models_load(repo: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, output, _ = start(repo, "--port", str(port))
    assert code == 2
    line = one_error_line(output)
    assert f"127.0.0.1:{port} is already in use" in line and "--port" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-queue-size", "4", "--max-batch-size", "8"], "max_queue_size (4) must be >= max_batch_size (8)"),
        (["--port", "70000"], "port:"),
        (["--metrics-port", "{port}", "--port", "{port}"], "metrics_port"),
        (["--device", "cuda"], "device=cuda needs the GPU build of onnxruntime"),
        (["--host", "192.0.2.1"], "is not an address of this machine"),
    ],
)
def test_impossible_settings_are_one_line(
    repo: Path, args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    port = str(free_port())
    # In process (the same main() as the console script; a subprocess per case would mostly time imports).
    code = main(["--model-repository", str(repo), *[a.replace("{port}", port) for a in args]])
    captured = capsys.readouterr()
    assert code == 2 and expected in one_error_line(captured.err + captured.out)


def test_metrics_on_their_own_port_without_the_key(repo: Path) -> None:
    metrics_port = free_port()
    env = {"LARA_API_KEY": "startup-test-key", "LARA_MODEL_REPOSITORY": str(repo), "LARA_NUM_THREADS": "1"}
    with server_process(["--log-level", "warning", "--metrics-port", str(metrics_port)], env=env) as url:
        assert httpx.get(f"{url}/metrics").status_code == 401  # the API port keeps the key
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert (
            scraped.status_code == 200
            and "lara_model_info{" in scraped.text
            and "process_cpu_seconds_total" in scraped.text
        )
