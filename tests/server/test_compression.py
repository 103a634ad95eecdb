"""Compressed HTTP bodies both ways: gzip/deflate requests on every route, bounded decoding (a bomb is a
413), gzip responses when asked; tritonclient's own compression options against a live server."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import TEXT, serve

from lara_serve.server import Settings
from lara_serve.server.synthetic import TEXT_LABELS
from lara_serve.server.testing import server_process

PREDICT = f"/v1/models/{TEXT}:predict"
BODY = json.dumps({"instances": ["a short document about the weather", "another one"]}).encode()


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def _gzip_zeros(member_bytes: int, members: int) -> bytes:
    """`members` gzip members of `member_bytes` zeros each, concatenated (one gzip body, RFC 1952 2.2)."""
    return gzip.compress(bytes(member_bytes), compresslevel=9) * members


@pytest.mark.anyio
async def test_gzip_and_deflate_bodies_answer_as_plain_ones(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings()) as client:
        plain = await client.post(PREDICT, content=BODY)
        assert plain.status_code == 200
        for encoding, body in [
            ("gzip", gzip.compress(BODY)),
            ("x-gzip", gzip.compress(BODY)),
            ("deflate", zlib.compress(BODY)),  # zlib-wrapped, as RFC 9110 and tritonclient send it
            ("deflate", _raw_deflate(BODY)),  # raw, as some clients send it
            ("GZIP", gzip.compress(BODY[:20]) + gzip.compress(BODY[20:])),  # two members
            ("identity", BODY),
        ]:
            r = await client.post(PREDICT, content=body, headers={"Content-Encoding": encoding})
            assert r.status_code == 200, (encoding, r.text)
            assert r.json() == plain.json(), encoding


@pytest.mark.anyio
async def test_bad_encodings_are_4xx_in_the_error_shape(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings()) as client:
        r = await client.post(PREDICT, content=BODY, headers={"Content-Encoding": "br"})
        assert r.status_code == 415 and "gzip, deflate or identity" in r.json()["error"]
        r = await client.post(PREDICT, content=b"not gzip at all", headers={"Content-Encoding": "gzip"})
        assert r.status_code == 400 and "not valid gzip" in r.json()["error"]
        r = await client.post(PREDICT, content=gzip.compress(BODY)[:-12], headers={"Content-Encoding": "gzip"})
        assert r.status_code == 400 and "truncated" in r.json()["error"]
        r = await client.post(PREDICT, content=zlib.compress(BODY) + b"x", headers={"Content-Encoding": "deflate"})
        assert r.status_code == 400 and "after the end" in r.json()["error"]
        # The decoded body is what the route checks: valid gzip of invalid JSON is the route's own 400.
        r = await client.post(PREDICT, content=gzip.compress(b"{nope"), headers={"Content-Encoding": "gzip"})
        assert r.status_code == 400 and "gzip" not in r.json()["error"]


@pytest.mark.anyio
async def test_a_decompression_bomb_is_413_fast_and_small(make_settings: Callable[..., Settings]) -> None:
    limit = 2 * 1024 * 1024
    bombs = {
        "1 GB of zeros, 64 gzip members": _gzip_zeros(16 * 1024 * 1024, 64),
        "64 MB of zeros, one member": _gzip_zeros(64 * 1024 * 1024, 1),
    }
    async with serve(make_settings(max_body_bytes=limit)) as client:
        for name, bomb in bombs.items():
            assert len(bomb) < limit  # passes the limit on the bytes as sent
            tracemalloc.start()
            start = time.perf_counter()
            r = await client.post(PREDICT, content=bomb, headers={"Content-Encoding": "gzip"})
            took = time.perf_counter() - start
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert r.status_code == 413, name
            assert f"max_body_bytes={limit}" in r.json()["error"] and "decompressed" in r.json()["error"]
            assert took < 2.0, (name, took)
            assert peak < limit + 3 * 1024 * 1024 + len(bomb) * 3, (name, peak)  # the limit, not the gigabyte


@pytest.mark.anyio
async def test_responses_are_gzipped_only_when_asked(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings()) as client:
        asked = await client.get("/openapi.json", headers={"Accept-Encoding": "gzip"})
        assert asked.headers["content-encoding"] == "gzip" and asked.json()["openapi"]
        plain = await client.get("/openapi.json", headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers
        assert int(asked.headers["content-length"]) < int(plain.headers["content-length"]) / 3
        small = await client.get("/v2/health/live", headers={"Accept-Encoding": "gzip"})
        assert "content-encoding" not in small.headers  # below the minimum size: not worth a gzip header
    async with serve(make_settings(compress_responses=False)) as client:
        r = await client.get("/openapi.json", headers={"Accept-Encoding": "gzip"})
        assert "content-encoding" not in r.headers


# -- tritonclient's own compression options against a live server --

tritonhttp = pytest.importorskip("tritonclient.http")


@pytest.fixture(scope="module")
def live(repo: Path) -> Iterator[tuple[str, object]]:
    env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_NUM_THREADS": "1"}
    with server_process(["--log-level", "warning"], env=env) as url:
        yield url, tritonhttp.InferenceServerClient(url=url.removeprefix("http://"))


def _texts(*texts: str) -> object:
    tensor = tritonhttp.InferInput("raw", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    return tensor


@pytest.mark.parametrize("request_algorithm", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_algorithm", [None, "gzip"])
def test_tritonclient_compression(
    live: tuple[str, object], request_algorithm: str | None, response_algorithm: str | None
) -> None:
    _, triton = live
    texts = ["compressed " * 20, "short"]  # binary tensor extension, Inference-Header-Content-Length
    plain = triton.infer(TEXT, [_texts(*texts)]).as_numpy("probabilities")
    result = triton.infer(
        TEXT,
        [_texts(*texts)],
        request_compression_algorithm=request_algorithm,
        response_compression_algorithm=response_algorithm,
    )
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (2, len(TEXT_LABELS))
    np.testing.assert_array_equal(probabilities, plain)


def _rss(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("process_resident_memory")))


def test_live_bomb_is_413_without_memory_growth(live: tuple[str, object]) -> None:
    url, _ = live
    bomb = _gzip_zeros(16 * 1024 * 1024, 64)  # 1 GiB decoded in ~1 MB, over the default 16 MiB max_body_bytes
    before = _rss(url)
    start = time.perf_counter()
    r = httpx.post(f"{url}{PREDICT}", content=bomb, headers={"Content-Encoding": "gzip"}, timeout=10)
    took = time.perf_counter() - start
    assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]
    assert took < 5.0
    assert _rss(url) - before < 64 * 1024 * 1024  # at most the 16 MiB limit and its pieces, never the GiB
