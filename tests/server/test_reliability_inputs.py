"""Client input never gives a 5xx (issue 36, item 5 and the lower items): charsets that are no character
set, impossible v2 shapes, image bombs and truncated JPEGs; non-finite outputs are a counted 500, never a
200 with NaN; every 5xx says `Connection: close`; no absolute paths in error bodies; the API key can stay
off the command line."""

from __future__ import annotations

import io
import json
import random
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from server_helpers import IMAGE, TEXT, serve

from lara_serve.server import Settings
from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
from lara_serve.server.batcher import BatchPolicy
from lara_serve.server.errors import clean_message, hide_paths_under
from lara_serve.server.models import ServedModel
from lara_serve.server.repository import read_config

pytestmark = pytest.mark.anyio
CLASSIFY = f"/v1/models/{TEXT}:classify"
NOT_CHARSETS = ["rot13", "base64", "hex", "zlib", "uu", "bz2", "quopri", "undefined", "unicode_escape", "idna"]


@pytest.mark.parametrize("charset", NOT_CHARSETS)
async def test_charsets_that_are_no_character_set_are_415_naming_the_allowed(
    client: httpx.AsyncClient, charset: str
) -> None:
    response = await client.post(CLASSIFY, content=b"uryyb", headers={"content-type": f"text/plain; charset={charset}"})
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert charset in error and "iso-8859-1" in error and "utf-16" in error
    assert response.headers.get("connection") != "close"  # a client error keeps the connection usable


async def test_charset_in_a_multipart_part_and_undecodable_text(client: httpx.AsyncClient) -> None:
    part = await client.post(CLASSIFY, files={"file": ("a.txt", b"hello", "text/plain; charset=base64")})
    assert part.status_code == 415 and "base64" in part.json()["error"]
    bad_sjis = await client.post(
        CLASSIFY, content=b"\x81\x00", headers={"content-type": "text/plain; charset=shift_jis"}
    )
    assert bad_sjis.status_code == 422 and "shift_jis" in bad_sjis.json()["error"]
    fine = await client.post(
        CLASSIFY, content="café".encode("cp1252"), headers={"content-type": "text/plain; charset=cp1252"}
    )
    assert fine.status_code == 200


@pytest.mark.parametrize("shape", [[0, 4611686018427387904], [0, 2**70], [2**40, 0], [0] * 40])
async def test_impossible_v2_shapes_with_empty_data_are_400(client: httpx.AsyncClient, shape: list[int]) -> None:
    for name, datatype in (("input_ids", "INT64"), ("raw", "BYTES")):
        body = {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": []}]}
        response = await client.post(f"/v2/models/{TEXT}/infer", json=body)
        assert response.status_code == 400, response.text
        assert "impossible" in response.json()["error"]


def png_header(width: int, height: int) -> bytes:
    """A PNG declaring width x height with one tiny IDAT: Pillow reads the size without decoding."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("side", [10_000, 20_000])  # past Pillow's bomb warning, and past its bomb error
async def test_decompression_bombs_are_413(client: httpx.AsyncClient, side: int) -> None:
    response = await client.post(
        f"/v1/models/{IMAGE}:classify", content=png_header(side, side), headers={"content-type": "image/png"}
    )
    assert response.status_code == 413, response.text


async def test_png_metadata_zlib_bomb_is_413(client: httpx.AsyncClient) -> None:
    image = Image.new("L", (28, 28))
    buffer = io.BytesIO()
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("bomb", "a" * (80 << 20), zip=True)  # 80 MiB of text, ~80 KB compressed
    image.save(buffer, format="PNG", pnginfo=info)
    response = await client.post(f"/v1/models/{IMAGE}:classify", content=buffer.getvalue())
    assert response.status_code == 413, response.text


async def test_truncated_jpeg_declaring_4000x4000_is_refused(client: httpx.AsyncClient) -> None:
    buffer = io.BytesIO()
    Image.new("L", (4000, 4000), 128).save(buffer, format="JPEG")
    cut = buffer.getvalue()[:335] + b"\xff\xd9"  # headers, a few bytes of scan, then an end marker
    response = await client.post(f"/v1/models/{IMAGE}:classify", content=cut, headers={"content-type": "image/jpeg"})
    assert response.status_code == 422 and "truncated" in response.json()["error"]
    whole = io.BytesIO()
    Image.new("L", (400, 400), 0).save(whole, format="JPEG", progressive=True)  # the most compressible real one
    ok = await client.post(f"/v1/models/{IMAGE}:classify", content=whole.getvalue())
    assert ok.status_code == 200


async def test_non_finite_output_is_a_counted_500_never_a_200_with_nan(client: httpx.AsyncClient) -> None:
    body = {"inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [3e38] * 784}]}
    response = await client.post(f"/v2/models/{IMAGE}/infer", json=body)
    assert response.status_code == 500
    assert "non-finite" in json.loads(response.content)["error"]  # valid JSON, no NaN token
    assert response.headers["connection"] == "close"
    metrics = (await client.get("/metrics")).text
    assert f'lara_nonfinite_outputs_total{{model="{IMAGE}"}} 1.0' in metrics
    fine = {"inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0.5] * 784}]}
    assert (await client.post(f"/v2/models/{IMAGE}/infer", json=fine)).status_code == 200


class FailingBackend:
    name, device = "onnxruntime", "cpu"

    def __init__(self, inner: OnnxRuntimeBackend) -> None:
        self.inner, self.fail = inner, False

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        if self.fail:
            raise RuntimeError("device on fire")
        return self.inner.run(inputs)

    def close(self) -> None:
        self.inner.close()


async def test_every_5xx_says_connection_close(repo: Path, make_settings: Callable[..., Settings]) -> None:
    config = read_config(repo / TEXT)
    backend = FailingBackend(OnnxRuntimeBackend(repo / TEXT, config, "cpu"))
    model = ServedModel(config, backend, BatchPolicy(max_queue_delay_s=0.0))  # type: ignore[arg-type]
    async with serve(make_settings(), [model]) as c:
        backend.fail = True
        failed = await c.post(CLASSIFY, content=b"hello")
        assert failed.status_code == 500 and failed.headers["connection"] == "close"
        unknown = await c.get(f"/v2/models/{TEXT}x/ready")
        assert unknown.status_code == 404 and unknown.headers.get("connection") != "close"


def test_error_messages_do_not_expose_absolute_paths() -> None:
    hide_paths_under("/srv/lara/model_repository")
    message = clean_message(
        "Load model from /srv/lara/model_repository/news/1/model.onnx failed; see /home/ci/.venv/lib/x/y.py; "
        "no route GET /v2/models/x/foo"
    )
    assert "<model_repository>/news/1/model.onnx" in message
    assert "/home/ci" not in message and ".../x/y.py" in message
    assert "/v2/models/x/foo" in message  # route paths are no file paths


def test_api_key_file_keeps_the_key_off_the_command_line(repo: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("a-long-enough-key\n")
    settings = Settings(model_repository=repo, api_key_file=key_file)
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "a-long-enough-key"
    with pytest.raises(ValueError, match="not both"):
        Settings(model_repository=repo, api_key_file=key_file, api_key="another-long-key")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        Settings(model_repository=repo, api_key_file=tmp_path / "empty")
    help_text = subprocess.run(
        [sys.executable, "-m", "lara_serve.server", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "--api-key-file" in help_text and "LARA_API_KEY" in help_text and "ps" in help_text


async def test_api_key_file_protects_the_routes(repo: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("a-long-enough-key")
    async with serve(Settings(model_repository=repo, api_key_file=key_file)) as c:
        assert (await c.post(CLASSIFY, content=b"hi")).status_code == 401
        ok = await c.post(CLASSIFY, content=b"hi", headers={"x-api-key": "a-long-enough-key"})
        assert ok.status_code == 200


def _random_v2(rng: random.Random) -> bytes:
    """A v2 body of random tensors: odd shapes (huge, zero, negative), dtypes, values, parameters."""

    def value() -> Any:
        return rng.choice([rng.randint(-(2**70), 2**70), rng.random() * 10 ** rng.randint(0, 40), "s" * rng.randint(0, 5),
                           None, True, [], {}, float("inf"), float("nan"), 1.5])  # fmt: skip

    tensors = []
    for _ in range(rng.randint(0, 3)):
        tensor: dict[str, Any] = {
            "name": rng.choice(["raw", "input_ids", "attention_mask", "pixel_values", "x"]),
            "datatype": rng.choice(["BYTES", "INT64", "INT32", "FP32", "FP16", "BOOL", "UINT8", "nope"]),
            "shape": [rng.choice([0, 1, 2, 28, -1, 2**31, 2**62, 2**64]) for _ in range(rng.randint(0, 4))],
            "data": [value() for _ in range(rng.randint(0, 6))],
        }
        if rng.random() < 0.2:
            tensor["parameters"] = {"binary_data_size": rng.choice([-1, 0, 4, 2**40, "x"]), "content_type": "base64"}
        tensors.append(tensor)
    body: dict[str, Any] = {"inputs": tensors}
    if rng.random() < 0.3:
        body["parameters"] = {"truncate": rng.choice([True, "tail", "x", 3])}
    if rng.random() < 0.2:
        body["outputs"] = [{"name": "probabilities", "parameters": {"classification": rng.choice([0, 3, -1, 2**70])}}]
    return json.dumps(body).encode()  # NaN and Infinity tokens included, as a careless client writes them


async def test_random_v2_bodies_never_get_a_5xx(client: httpx.AsyncClient) -> None:
    rng = random.Random(36)
    failures = []
    for _ in range(300):
        path = rng.choice([f"/v2/models/{TEXT}/infer", f"/v2/models/{IMAGE}/infer"])
        body = _random_v2(rng)
        response = await client.post(path, content=body, headers={"content-type": "application/json"})
        if response.status_code >= 500:
            failures.append((body[:200], response.status_code, response.text[:200]))
    assert not failures, failures[:3]
