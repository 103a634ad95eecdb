"""Every route, in process (httpx ASGITransport with the lifespan running)."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from server_helpers import IMAGE, TEXT, png_bytes, serve

from lara_serve.server import Settings
from lara_serve.server.synthetic import IMAGE_LABELS, TEXT_LABELS

pytestmark = pytest.mark.anyio


async def test_health_and_server_metadata(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2/health/live")).json() == {"live": True}
    ready = await client.get("/v2/health/ready")
    assert ready.status_code == 200 and ready.json() == {"ready": True}
    meta = (await client.get("/v2")).json()
    assert meta["name"] == "lara-serve" and "binary_tensor_data" in meta["extensions"]


async def test_not_ready_before_lifespan(make_settings: Callable[..., Settings]) -> None:
    from lara_serve.server import create_app

    app = create_app(make_settings())  # lifespan never ran: nothing loaded
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        response = await c.get("/v2/health/ready")
        assert response.status_code == 503 and response.json() == {"ready": False}
        assert (await c.get("/v2/health/live")).status_code == 200
        infer = await c.post(f"/v1/models/{TEXT}:predict", json={"instances": ["x"]})
        assert infer.status_code == 503 and "loading" in infer.json()["error"]


async def test_model_metadata_and_readiness(client: httpx.AsyncClient) -> None:
    meta = (await client.get(f"/v2/models/{TEXT}")).json()
    assert meta["name"] == TEXT and meta["versions"] == ["1"]
    assert [i["name"] for i in meta["inputs"]] == ["raw", "input_ids", "attention_mask"]
    assert meta["outputs"][0] == {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(TEXT_LABELS)]}
    assert (await client.get(f"/v2/models/{TEXT}/versions/1")).json() == meta
    assert (await client.get(f"/v2/models/{IMAGE}/ready")).json()["ready"] is True
    assert (await client.get(f"/v2/models/{IMAGE}/versions/1/ready")).status_code == 200
    assert (await client.get("/v1/models")).json() == {"models": [IMAGE, TEXT]}
    v1 = (await client.get(f"/v1/models/{IMAGE}")).json()
    assert v1["ready"] is True and v1["task"] == "image" and v1["labels"] == IMAGE_LABELS


async def test_v2_infer_json_raw_text(client: httpx.AsyncClient) -> None:
    body = {"id": "r1", "inputs": [{"name": "raw", "datatype": "BYTES", "shape": [2], "data": ["hello", "world!"]}]}
    response = await client.post(f"/v2/models/{TEXT}/infer", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["id"] == "r1" and data["model_name"] == TEXT and data["model_version"] == "1"
    probs, labels = data["outputs"]
    assert probs["name"] == "probabilities" and probs["shape"] == [2, 4]
    p = np.array(probs["data"]).reshape(2, 4)
    assert np.allclose(p.sum(1), 1, atol=1e-6)
    assert labels["data"] == [TEXT_LABELS[i] for i in p.argmax(1)]
    for header in ("x-queue-time-ms", "x-inference-time-ms", "x-total-time-ms"):
        assert float(response.headers[header]) >= 0


async def test_v2_infer_tensors_match_raw_text(client: httpx.AsyncClient) -> None:
    text = b"tensors and raw bytes agree"
    ids = (np.frombuffer(text, np.uint8).astype(np.int64) + 1).tolist()
    padded = [ids + [0, 0, 0]]
    mask = [[1] * len(ids) + [0, 0, 0]]
    body = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, len(ids) + 3], "data": padded},
                       {"name": "attention_mask", "datatype": "INT64", "shape": [1, len(ids) + 3], "data": mask}],
            "outputs": [{"name": "probabilities"}]}  # fmt: skip
    from_tensors = (await client.post(f"/v2/models/{TEXT}/versions/1/infer", json=body)).json()
    assert [o["name"] for o in from_tensors["outputs"]] == ["probabilities"]
    raw = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": [text.decode()]}]}
    from_raw = (await client.post(f"/v2/models/{TEXT}/infer", json=raw)).json()
    assert from_tensors["outputs"][0]["data"] == from_raw["outputs"][0]["data"]


async def test_v2_infer_binary_extension(client: httpx.AsyncClient) -> None:
    images = [png_bytes(seed=1), png_bytes((40, 30), seed=2)]
    blob = b"".join(struct.pack("<I", len(i)) + i for i in images)
    head = json.dumps({"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [2],
                                   "parameters": {"binary_data_size": len(blob)}}],
                       "outputs": [{"name": "probabilities", "parameters": {"binary_data_output": True}},
                                   {"name": "label", "parameters": {"binary_data_output": True}}]}).encode()  # fmt: skip
    response = await client.post(
        f"/v2/models/{IMAGE}/infer", content=head + blob, headers={"Inference-Header-Content-Length": str(len(head))}
    )
    assert response.status_code == 200, response.text
    split = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:split])
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert sizes[0] == 2 * len(IMAGE_LABELS) * 4
    probs = np.frombuffer(response.content[split : split + sizes[0]], "<f4").reshape(2, -1)
    assert np.allclose(probs.sum(1), 1, atol=1e-6)
    labels_blob = response.content[split + sizes[0] :]
    n = struct.unpack_from("<I", labels_blob)[0]
    assert labels_blob[4 : 4 + n].decode() == IMAGE_LABELS[int(probs[0].argmax())]


async def test_v2_pixel_values_tensor(client: httpx.AsyncClient) -> None:
    pixels = np.random.default_rng(0).standard_normal((3, 1, 28, 28)).astype(np.float32)
    head = json.dumps({"inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [3, 1, 28, 28],
                                   "parameters": {"binary_data_size": pixels.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()  # fmt: skip
    response = await client.post(
        f"/v2/models/{IMAGE}/infer",
        content=head + pixels.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"


async def test_v1_predict_texts_and_images(client: httpx.AsyncClient) -> None:
    texts = ["a short one", "a somewhat longer document about the stock market " * 3]
    response = await client.post(f"/v1/models/{TEXT}:predict", json={"instances": texts, "parameters": {"top_k": 2}})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert len(predictions) == 2
    for p in predictions:
        assert p["label"] in TEXT_LABELS and p["top_k"][0] == {"label": p["label"], "score": p["score"]}
        assert len(p["top_k"]) == 2 and p["top_k"][0]["score"] >= p["top_k"][1]["score"]
    # request order: each alone gives the same answer as in the batch
    for text, p in zip(texts, predictions, strict=True):
        alone = (await client.post(f"/v1/models/{TEXT}:predict", json={"instances": [text]})).json()
        assert alone["predictions"][0]["label"] == p["label"]
    b64 = base64.b64encode(png_bytes()).decode()
    images = await client.post(f"/v1/models/{IMAGE}:predict", json={"instances": [{"b64": b64}]})
    assert images.status_code == 200 and images.json()["predictions"][0]["label"] in IMAGE_LABELS
    assert len(images.json()["predictions"][0]["top_k"]) == 5  # default_top_k


async def test_classify_raw_bodies(client: httpx.AsyncClient) -> None:
    text = await client.post(f"/v1/models/{TEXT}:classify", content=b"curl me", headers={"content-type": "text/plain"})
    assert text.status_code == 200 and text.json()["model_name"] == TEXT
    for fmt, media in (("PNG", "image/png"), ("JPEG", "image/jpeg")):
        r = await client.post(
            f"/v1/models/{IMAGE}:classify", content=png_bytes(fmt=fmt), headers={"content-type": media}
        )
        assert r.status_code == 200 and r.json()["label"] in IMAGE_LABELS
    long = await client.post(
        f"/v1/models/{TEXT}:classify?truncate=true&top_k=1", content=b"x" * 1000, headers={"content-type": "text/plain"}
    )
    assert long.status_code == 200 and len(long.json()["top_k"]) == 1


async def test_metrics_and_docs(client: httpx.AsyncClient) -> None:
    await client.post(f"/v1/models/{TEXT}:predict", json={"instances": ["count me"]})
    await client.post(f"/v1/models/{TEXT}:predict", json={"instances": [""]})
    text = (await client.get("/metrics")).text
    assert f'lara_requests_total{{model="{TEXT}",outcome="ok",protocol="v1"}}' in text
    assert f'lara_requests_total{{model="{TEXT}",outcome="invalid_input",protocol="v1"}}' in text
    for name in ("lara_queue_seconds", "lara_inference_seconds", "lara_batch_size", "lara_batch_tokens",
                 "lara_queue_depth"):  # fmt: skip
        assert name in text
    schema = (await client.get("/openapi.json")).json()
    assert "/v2/models/{name}/infer" in schema["paths"] and "V2InferRequest" in schema["components"]["schemas"]
    assert (await client.get("/docs")).status_code == 200


async def test_api_key(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(api_key="s3cret-key")) as c:
        assert (await c.get("/v2/health/ready")).status_code == 200  # probes need no key
        denied = await c.get("/v1/models")
        assert denied.status_code == 401 and "API key" in denied.json()["error"]
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer wrong-key!"})).status_code == 401
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer s3cret-key"})).status_code == 200
        assert (await c.get("/metrics", headers={"X-API-Key": "s3cret-key"})).status_code == 200
