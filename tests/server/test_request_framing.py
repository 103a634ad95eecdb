"""Request framing on a real `python -m lara_serve.server` on 127.0.0.1 (issue 50, items 8 and 14): a request
with both Content-Length and Transfer-Encoding is a 400 and its connection is closed (RFC 9112 6.1, no
smuggling), and uvicorn's protocol-level 400s come in the project's JSON error shape. One server, a few
sockets, seconds."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from server_helpers import TEXT

from lara_serve.server.testing import server_process


@pytest.fixture(scope="module")
def address(repo: Path) -> Iterator[tuple[str, int]]:
    with server_process(["--model-repository", str(repo), "--no-warmup"]) as base:
        parsed = urlparse(base)
        assert parsed.hostname and parsed.port
        yield parsed.hostname, parsed.port


def exchange(address: tuple[str, int], raw: bytes) -> tuple[bytes, bool]:
    """Send `raw`, read until the server closes or 3 s pass: (everything read, whether it closed)."""
    with socket.create_connection(address, timeout=3) as sock:
        sock.sendall(raw)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            return answer, False
        return answer, True


def split(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


def test_content_length_with_transfer_encoding_is_400_and_closed(address: tuple[str, int]) -> None:
    # The shape a CL-framing proxy forwards: its Content-Length covers the chunked body AND a second request.
    smuggled = b"GET /v2/models HTTP/1.1\r\nHost: x\r\n\r\n"
    chunked = b"0\r\n\r\n" + smuggled
    raw = (
        f"POST /v1/models/{TEXT}:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(chunked)}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode() + chunked
    answer, closed = exchange(address, raw)
    status, headers, body = split(answer)
    assert status.startswith("HTTP/1.1 400"), answer[:300]
    assert closed, "the connection must be closed after a CL+TE request"
    assert answer.count(b"HTTP/1.1 ") == 1, "the smuggled request must not be answered"
    assert headers["content-type"] == "application/json"
    assert "Content-Length and Transfer-Encoding" in json.loads(body)["error"]


def test_plain_chunked_and_plain_content_length_still_work(address: tuple[str, int]) -> None:
    payload = json.dumps({"instances": ["hello world"]}).encode()
    head = (
        f"POST /v1/models/{TEXT}:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    )
    chunked = f"{len(payload):x}\r\n".encode() + payload + b"\r\n0\r\n\r\n"
    for raw in (
        (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked,
        (head + f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload,
    ):
        status, _, _ = split(exchange(address, raw)[0])
        assert status.startswith("HTTP/1.1 200"), status


def test_unparseable_request_is_a_json_400(address: tuple[str, int]) -> None:
    answer, closed = exchange(address, b"GET / HTTP/1.1\r\nHost x-no-colon\r\n\r\n")
    status, headers, body = split(answer)
    assert status.startswith("HTTP/1.1 400"), answer[:300]
    assert closed
    assert headers["content-type"] == "application/json"
    assert "malformed request line or headers" in json.loads(body)["error"]


def test_cl_te_after_a_keep_alive_request_is_still_refused(address: tuple[str, int]) -> None:
    first = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    second = b"POST /v2/models HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    answer, closed = exchange(address, first + second)
    assert answer.startswith(b"HTTP/1.1 200") and closed
    _, headers, body = split(answer[answer.index(b"HTTP/1.1 400") :])
    assert headers["content-type"] == "application/json" and "Transfer-Encoding" in json.loads(body)["error"]
