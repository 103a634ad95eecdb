"""A real `python -m lara_serve.server` (uvicorn) on 127.0.0.1: raw HTTP, tritonclient (binary and JSON), kserve."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import IMAGE, TEXT, live_server, png_bytes, tritonclient_http

from lara_serve.server.synthetic import TEXT_LABELS


@pytest.fixture(scope="module")
def live_url(repo: Path) -> Iterator[str]:
    yield from live_server(repo)


def test_uvicorn_serves_v1_and_v2(live_url: str) -> None:
    assert httpx.get(f"{live_url}/v2/health/ready").json() == {"ready": True}
    response = httpx.post(f"{live_url}/v1/models/{TEXT}:predict", json={"instances": ["over a real socket"]})
    assert response.status_code == 200 and response.json()["predictions"][0]["label"] in TEXT_LABELS
    assert float(response.headers["x-total-time-ms"]) > 0
    assert httpx.post(f"{live_url}/v1/models/{TEXT}:predict", content=b"{").status_code == 400


def test_tritonclient_binary_and_json(live_url: str) -> None:
    http, client = tritonclient_http(live_url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(TEXT)
    assert client.get_model_metadata(TEXT)["name"] == TEXT
    texts = np.array([b"first document", b"second, longer document about sports"], dtype=object)

    binary_in = http.InferInput("raw", [2], "BYTES")
    binary_in.set_data_from_numpy(texts, binary_data=True)
    binary = client.infer(TEXT, [binary_in])  # no outputs named: tritonclient asks for binary outputs
    probs = binary.as_numpy("probabilities")
    assert probs.shape == (2, len(TEXT_LABELS)) and probs.dtype == np.float32
    assert [v.decode() for v in binary.as_numpy("label")] == [TEXT_LABELS[i] for i in probs.argmax(1)]

    json_in = http.InferInput("raw", [2], "BYTES")
    json_in.set_data_from_numpy(texts, binary_data=False)
    outputs = [http.InferRequestedOutput(n, binary_data=False) for n in ("probabilities", "label")]
    as_json = client.infer(TEXT, [json_in], outputs=outputs, request_id="42")
    assert as_json.get_response()["id"] == "42"
    np.testing.assert_array_equal(as_json.as_numpy("probabilities"), probs)

    image_in = http.InferInput("raw", [1], "BYTES")
    image_in.set_data_from_numpy(np.array([png_bytes()], dtype=object))
    assert client.infer(IMAGE, [image_in]).as_numpy("probabilities").shape == (1, 10)

    with pytest.raises(http.InferenceServerException, match="unknown model"):
        client.infer("nope", [binary_in])
    client.close()


def test_kserve_rest_client(live_url: str) -> None:
    kserve = pytest.importorskip("kserve", reason="kserve is not installed (optional: large dependency tree)")
    import asyncio

    async def run() -> None:
        client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2"))
        assert await client.is_server_ready(live_url)
        request = kserve.InferRequest(
            model_name=TEXT, infer_inputs=[kserve.InferInput("raw", [1], "BYTES", ["via kserve"])]
        )
        response = await client.infer(live_url, request, model_name=TEXT)
        assert response.outputs[0].name == "probabilities"
        await client.close()

    asyncio.run(run())


def test_impossible_settings_refuse_to_start(repo: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lara_serve.server", "--model-repository", str(repo), "--max-batch-size", "64",
         "--max-queue-size", "8"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "max_queue_size" in result.stderr
