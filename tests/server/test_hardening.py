"""Hostile or broken inputs are client errors, never 5xx: one body parser, slow and vanishing uploads,
image formats, header details (Allow, WWW-Authenticate), secrets; and a broken model is isolated."""

from __future__ import annotations

import base64
import io
import json
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from PIL import Image
from server_helpers import IMAGE, TEXT, asgi_post, png_bytes, serve

from lara_serve.server import Settings, create_app
from lara_serve.server.__main__ import main
from lara_serve.server.models import ModelLoadError, load_repository
from lara_serve.server.preprocess import DecodeBudget
from lara_serve.server.synthetic import make_image_model, make_text_model

pytestmark = pytest.mark.anyio
V1, V2 = f"/v1/models/{TEXT}:predict", f"/v2/models/{TEXT}/infer"


def nested(depth: int) -> str:
    return "[" * depth + '"x"' + "]" * depth


@pytest.mark.parametrize("depth", [1_000, 100_000])
async def test_deep_nesting_is_400_on_every_parser(client: httpx.AsyncClient, depth: int) -> None:
    v1 = (f'{{"instances": {nested(depth)}}}').encode()
    v2_json = (
        f'{{"inputs": [{{"name": "raw", "datatype": "BYTES", "shape": [1], "data": {nested(depth)}}}]}}'
    ).encode()
    blob = struct.pack("<I", 1) + b"x"
    head = (f'{{"inputs": [{{"name": "raw", "datatype": "BYTES", "shape": [1], '
            f'"parameters": {{"binary_data_size": {len(blob)}, "deep": {nested(depth)}}}}}]}}').encode()  # fmt: skip
    cases = [(V1, v1, {}), (V2, v2_json, {}),
             (V2, head + blob, {"Inference-Header-Content-Length": str(len(head))})]  # fmt: skip
    for path, body, headers in cases:
        response = await client.post(path, content=body, headers=headers)
        assert response.status_code == 400, (path, response.text)
        assert "recursion limit" in response.json()["error"]
    metrics = (await client.get("/metrics")).text
    assert "backend_failure" not in metrics and 'outcome="malformed_request"' in metrics
    # Any other JSON route (here Triton's repository index, parsed with json.loads): still a 400.
    index = await client.post("/v2/repository/index", content=nested(depth).encode())
    assert index.status_code == 400 and "nested too deeply" in index.json()["error"]


async def test_allow_and_www_authenticate_headers(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(api_key="s3cret-key")) as c:
        denied = await c.get("/v1/models")
        assert denied.status_code == 401 and denied.headers["www-authenticate"].startswith("Bearer")
        wrong_method = await c.get(V2, headers={"X-API-Key": "s3cret-key"})
        assert wrong_method.status_code == 405 and "POST" in wrong_method.headers["allow"]
        assert "not allowed" in wrong_method.json()["error"]


def encoded(fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (28, 28), color=7).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["TIFF", "EPS", "PPM"])
async def test_one_image_format_allow_list_for_every_route(client: httpx.AsyncClient, fmt: str) -> None:
    data = encoded(fmt)
    b64 = await client.post(
        f"/v1/models/{IMAGE}:predict", json={"instances": [{"b64": base64.b64encode(data).decode()}]}
    )
    v2 = await client.post(
        f"/v2/models/{IMAGE}/infer",
        json={"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": [data.decode("latin-1")]}]},
    )  # JSON BYTES are UTF-8 strings: send the binary form too
    blob = struct.pack("<I", len(data)) + data
    head = json.dumps({"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": len(blob)}}]}).encode()  # fmt: skip
    binary = await client.post(
        f"/v2/models/{IMAGE}/infer", content=head + blob, headers={"Inference-Header-Content-Length": str(len(head))}
    )
    for response in (b64, v2, binary):
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert "PNG, JPEG, WEBP, BMP, GIF" in error and " at 0x" not in error
    ok = await client.post(f"/v1/models/{IMAGE}:classify", content=png_bytes(), headers={"content-type": "image/png"})
    assert ok.status_code == 200


def test_decode_budget_makes_large_decodes_wait() -> None:
    budget = DecodeBudget(100)
    first = budget.acquire(60)
    entered = threading.Event()

    def second() -> None:
        budget.release(budget.acquire(60))
        entered.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not entered.wait(0.2)  # 60 + 60 > 100: waits
    budget.release(first)
    assert entered.wait(5)
    thread.join()
    assert budget.acquire(1_000) == 100  # larger than the budget: runs alone, never deadlocks
    budget.release(100)


def test_rejected_api_key_is_not_echoed(capsys: pytest.CaptureFixture[str], repo: Path) -> None:
    assert main(["--model-repository", str(repo), "--api-key", "tiny7"]) == 2
    err = capsys.readouterr().err
    assert "api_key" in err and "tiny7" not in err


async def test_client_gone_or_too_slow_mid_upload_is_not_a_server_error(
    make_settings: Callable[..., Settings],
) -> None:
    app = create_app(make_settings(body_timeout_s=0.2))
    async with app.router.lifespan_context(app):
        left = await asgi_post(app, V1, b'{"instances": ["half', complete=False)
        t0 = time.perf_counter()
        slow = await asgi_post(app, V1, b'{"instances": ["half', asyncio_event(), complete=False)
        elapsed = time.perf_counter() - t0
    assert left["status"] in (None, 499)  # nobody to answer; never 500
    assert slow["status"] == 408 and slow["headers"]["connection"] == "close" and 0.15 < elapsed < 5
    assert "body_timeout_s" in json.loads(slow["body"])["error"]
    m = app.state.lara.metrics.registry
    v1_labels = {"model": TEXT, "protocol": "v1"}
    assert m.get_sample_value("lara_requests_total", {**v1_labels, "outcome": "client_disconnected"}) == 1
    assert m.get_sample_value("lara_requests_total", {**v1_labels, "outcome": "request_timeout"}) == 1
    assert m.get_sample_value("lara_client_timeouts_total", {"phase": "body"}) == 1
    assert m.get_sample_value("lara_requests_total", {**v1_labels, "outcome": "backend_failure"}) is None


def asyncio_event():  # type: ignore[no-untyped-def]
    import asyncio

    return asyncio.Event()  # never set: the client stalls


# -- a broken model is isolated ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broken_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One healthy model, one with a corrupt model.onnx, one whose config lists 3 labels for 4 logits."""
    root = tmp_path_factory.mktemp("broken_repository")
    make_text_model(root, "healthy", max_length=64)
    make_image_model(root, "corrupt")
    (root / "corrupt" / "1" / "model.onnx").write_bytes(b"\x08\x07not a protobuf" * 10)
    make_text_model(root, "mislabeled", max_length=64)
    config = json.loads((root / "mislabeled" / "config.json").read_text())
    config["labels"] = config["labels"][:3]
    (root / "mislabeled" / "config.json").write_text(json.dumps(config))
    return root


async def test_broken_models_are_reported_while_the_healthy_one_serves(broken_repo: Path) -> None:
    async with serve(Settings(model_repository=broken_repo, warmup=False)) as c:
        assert (await c.get("/v2/health/ready")).status_code == 200
        ok = await c.post("/v1/models/healthy:predict", json={"instances": ["still serving"]})
        assert ok.status_code == 200
        corrupt = await c.get("/v2/models/corrupt/ready")
        assert corrupt.status_code == 503 and "not available" in corrupt.json()["error"]
        mislabeled = await c.get("/v2/models/mislabeled/ready")
        assert mislabeled.status_code == 503 and "lists 3 labels" in mislabeled.json()["error"]
        infer = await c.post("/v1/models/mislabeled:predict", json={"instances": ["x"]})
        assert infer.status_code == 503
        metrics = (await c.get("/metrics")).text
    assert 'lara_model_ready{model="healthy"} 1.0' in metrics
    assert 'lara_model_ready{model="corrupt"} 0.0' in metrics
    assert 'lara_model_load_failures_total{model="mislabeled"} 1.0' in metrics


def test_strict_models_refuses_to_start(broken_repo: Path) -> None:
    with pytest.raises(ModelLoadError, match="strict_models"):
        load_repository(Settings(model_repository=broken_repo, warmup=False, strict_models=True))
    models, failed = load_repository(Settings(model_repository=broken_repo, warmup=False, models=["healthy"]))
    assert list(models) == ["healthy"] and failed == {}
    for model in models.values():
        model.backend.close()


def test_connection_cap_and_backlog_fit_a_low_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    from lara_serve.server import serving

    def refuse(*_: object) -> None:
        raise ValueError("cannot raise the limit")

    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 256))
    monkeypatch.setattr(resource, "setrlimit", refuse)
    connections, backlog = serving.fit_connections(1000)
    assert connections + backlog + serving.FD_RESERVE <= 256 and connections >= 100
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1 << 20, 1 << 20))
    assert serving.fit_connections(1000) == (1000, 2048)  # room enough: as asked
