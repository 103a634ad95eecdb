"""Connection-level limits on a real `python -m lara_serve.server` on 127.0.0.1 (issue 36, items 2 and 6): the body
timeout holds after an early answer (a trickling client cannot keep a connection slot), and over the
connection cap a client reads a 503 with Retry-After instead of a reset. Bounded: a few sockets, seconds."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from lara_serve.server.testing import free_port, server_process, wait_ready

BODY_TIMEOUT_S = 1.5


@pytest.fixture(scope="module")
def url(repo: Path) -> Iterator[str]:
    args = ["--model-repository", str(repo), "--no-warmup", "--body-timeout-s", str(BODY_TIMEOUT_S),
            "--header-timeout-s", "2", "--max-connections", "4", "--max-body-bytes", "65536"]  # fmt: skip
    with server_process(args) as base:
        yield base


def connect(url: str) -> socket.socket:
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=5)
    return sock


def trickle_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Send a byte every 0.1 s and read what comes; returns (everything read, seconds until the server
    closed the connection), or raises if it is still open after `limit_s`."""
    start, answer = time.monotonic(), b""
    sock.settimeout(0.1)
    while time.monotonic() - start < limit_s:
        try:
            sock.sendall(b"x")
        except OSError:  # reset or closed by the server
            return answer, time.monotonic() - start
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return answer, time.monotonic() - start
        if not chunk:
            return answer, time.monotonic() - start
        answer += chunk
    raise AssertionError(f"connection still open after {limit_s} s; read {answer[:200]!r}")


@pytest.mark.parametrize(
    "head",
    [
        b"POST /no/such/route HTTP/1.1\r\nHost: t\r\nContent-Length: 60000\r\n\r\n",  # 404 before the body
        b"POST /v1/models/tiny-text:classify HTTP/1.1\r\nHost: t\r\nContent-Length: 9999999\r\n\r\n",  # 413
    ],
)
def test_trickling_body_after_an_early_answer_is_cut_at_the_body_timeout(url: str, head: bytes) -> None:
    with connect(url) as sock:
        sock.sendall(head)
        answer, closed_after = trickle_until_closed(sock, limit_s=BODY_TIMEOUT_S + 4)
    assert answer.startswith((b"HTTP/1.1 404", b"HTTP/1.1 413")), answer[:100]
    assert closed_after < BODY_TIMEOUT_S + 1.5  # was: never (25 s of 50 tricklers held the cap)


def test_next_request_headers_after_an_early_answer_get_the_header_timeout(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(b"POST /no/such/route HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 404")  # answered before its body was sent
        sock.sendall(b"abcde" + b"GET /v2/health/live HTTP/1.1\r\nHo")  # the body, then a trickled next head
        _, closed_after = trickle_until_closed(sock, limit_s=6)
    assert closed_after < 2 + 1.5  # header_timeout_s=2


@pytest.mark.parametrize("pause_s", [0.0, 0.2])  # a request sent at once, or a moment after connecting
def test_over_the_connection_cap_the_client_reads_a_503_with_retry_after(url: str, pause_s: float) -> None:
    held = [connect(url) for _ in range(4)]  # the cap: 4 open connections
    try:
        time.sleep(0.2)
        with connect(url) as extra:
            time.sleep(pause_s)
            body = b"x" * 32768
            extra.sendall(b"POST /v1/models/tiny-text:classify HTTP/1.1\r\nHost: t\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
            extra.settimeout(5)
            answer = b""
            while chunk := extra.recv(65536):  # a reset would raise here
                answer += chunk
    finally:
        for sock in held:
            sock.close()
    head, _, message = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower()
    assert b"max_connections=4" in message
    time.sleep(0.3)
    metrics = httpx.get(f"{url}/metrics", timeout=5).text
    refused = next(line for line in metrics.splitlines() if line.startswith("lara_connections_refused_total"))
    assert float(refused.split()[-1]) >= 1


def test_upload_in_progress_at_shutdown_gets_a_json_503_and_the_server_exits_soon(repo: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "lara_serve.server", "--host", "127.0.0.1", "--port", str(port), "--model-repository",
           str(repo), "--no-warmup", "--graceful-timeout-s", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, 60)
        warm = httpx.post(f"http://127.0.0.1:{port}/v1/models/tiny-text:classify", content=b"warm", timeout=30)
        assert warm.status_code == 200  # the first request imports what it needs: not part of the case
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /v1/models/tiny-text:classify HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
            sock.sendall(b"x" * 10)  # ... and the rest never comes
            time.sleep(0.5)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            sock.settimeout(10)
            answer = sock.recv(65536)
            answered_after = time.monotonic() - start
            while b"}" not in answer and (chunk := sock.recv(65536)):  # the JSON body may come apart
                answer += chunk
        proc.wait(timeout=20)
        exited_after = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"application/json" in head, answer[:300]
    assert b"shut down before the request body arrived" in body
    assert answered_after < 1 + 1.5  # graceful_timeout_s=1, then at once (was: uvicorn's plain-text 500)
    assert exited_after < 1 + 5  # was graceful + ~11 s
