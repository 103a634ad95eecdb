"""Run the server in a subprocess on a free loopback port (tests, benchmarks, the load tester's demo)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log: IO[bytes] | None = None) -> None:
    """Poll `url`/v2/health/ready until it answers 200; RuntimeError (with the log's tail) if `proc` exits or
    `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = ""
            if log is not None:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"server did not become ready: {tail}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


@contextmanager
def server_process(
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    new_session: bool = False,
    python: str = sys.executable,
    cwd: str | None = None,
    command: Sequence[str] | None = None,
) -> Iterator[str]:
    """`python -m lara_serve.server ARGS` on 127.0.0.1:<free port>; yields its base URL once /v2/health/ready is 200.

    `new_session`: the server leads its own session (its pid is the session id). Where the kernel groups
    processes by session for CPU shares (Linux autogroup), a server in the caller's session competes with
    the caller (a load generator, other jobs) for ONE share; benchmarks that set a peer apart must do the same.
    `python`, `cwd`: another environment's interpreter (an install under test), run from another folder.
    `command`: the program to start instead of `python -m lara_serve.server` (e.g. an install's `lara-serve`).
    """
    port = free_port()
    program = list(command) if command is not None else [python, "-m", "lara_serve.server"]
    cmd = [*program, "--host", "127.0.0.1", "--port", str(port), *args]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
            cwd=cwd,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, timeout_s, log)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
