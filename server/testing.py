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

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server_process(
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    new_session: bool = False,
    python: str = sys.executable,
    cwd: str | None = None,
) -> Iterator[str]:
    """`python -m lara_serve.server ARGS` on 127.0.0.1:<free port>; yields its base URL once /v2/health/ready is 200.

    `new_session`: the server leads its own session (its pid is the session id). Where the kernel groups
    processes by session for CPU shares (Linux autogroup), a server in the caller's session competes with
    the caller (a load generator, other jobs) for ONE share; benchmarks that set a peer apart must do the same.
    `python`, `cwd`: another environment's interpreter (an install under test), run from another folder.
    """
    port = free_port()
    cmd = [python, "-m", "lara_serve.server", "--host", "127.0.0.1", "--port", str(port), *args]
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
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"server did not become ready: {log.read().decode()[-3000:]}")
                try:
                    if httpx.get(f"{url}/v2/health/ready", timeout=1.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
