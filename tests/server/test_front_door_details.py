"""The small things a first-time user meets: 405s with the right Allow, one :classify shape, an image sent to
a text model named as such, plain text at :predict pointed to :classify, `lara-serve --help`, the /ui log."""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable

import httpx
import pytest
from server_helpers import IMAGE, TEXT, png_bytes, serve

from lara_serve.server import Settings
from lara_serve.server.__main__ import build_parser

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", f"/v1/models/{TEXT}:predict", "POST"),
        ("GET", f"/v1/models/{TEXT}:classify", "POST"),
        ("GET", f"/v1/models/{TEXT}:explain", "POST"),
        ("PUT", f"/v1/models/{TEXT}:explain", "POST"),
    ],
)
async def test_wrong_method_is_405_with_allow(client: httpx.AsyncClient, method: str, path: str, allow: str) -> None:
    r = await client.request(method, path)
    assert r.status_code == 405 and r.headers["allow"] == allow, r.text


async def test_post_explain_is_served(client: httpx.AsyncClient) -> None:
    r = await client.post(f"/v1/models/{TEXT}:explain", json={"instances": ["a short text to explain"]})
    assert r.status_code == 200


async def test_classify_has_predictions_for_one_file_and_for_several(client: httpx.AsyncClient) -> None:
    one = await client.post(f"/v1/models/{IMAGE}:classify", content=png_bytes(), headers={"content-type": "image/png"})
    two = await client.post(
        f"/v1/models/{IMAGE}:classify", files=[("file", ("a.png", png_bytes(seed=1))), ("file", ("b.png", png_bytes()))]
    )
    assert one.status_code == two.status_code == 200
    single, double = one.json(), two.json()
    assert len(single["predictions"]) == 1 and len(double["predictions"]) == 2
    assert single["predictions"][0]["filename"] is None
    assert [p["filename"] for p in double["predictions"]] == ["a.png", "b.png"]
    # The old single-file fields stay, equal to its entry in predictions.
    assert single["label"] == single["predictions"][0]["label"] == double["predictions"][1]["label"]
    assert single["top_k"] == single["predictions"][0]["top_k"]
    assert "label" not in double


@pytest.mark.parametrize("base64_param", [True, False])
async def test_image_sent_to_a_text_model_is_named(client: httpx.AsyncClient, base64_param: bool) -> None:
    data = base64.b64encode(png_bytes()).decode()
    params = {"parameters": {"content_type": "base64"}} if base64_param else {}
    body = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": [data], **params}]}
    r = await client.post(f"/v2/models/{TEXT}/infer", json=body)
    assert r.status_code == 422 and "looks like an image" in r.json()["error"], r.text
    v1 = await client.post(f"/v1/models/{TEXT}:predict", json={"instances": [{"b64": data}]})
    assert v1.status_code == 422 and "looks like an image" in v1.json()["error"]


async def test_text_that_starts_like_base64_is_still_text(client: httpx.AsyncClient) -> None:
    r = await client.post(f"/v1/models/{TEXT}:predict", json={"instances": ["/9j/ is how a JPEG starts in base64"]})
    assert r.status_code == 200


async def test_plain_text_at_predict_points_to_classify(client: httpx.AsyncClient) -> None:
    r = await client.post(
        f"/v1/models/{TEXT}:predict", content=b"just some text", headers={"content-type": "text/plain"}
    )
    assert r.status_code == 400 and f"/v1/models/{TEXT}:classify" in r.json()["error"]
    json_error = await client.post(f"/v1/models/{TEXT}:predict", json={"instance": []})
    assert ":classify" not in json_error.json()["error"]  # a JSON body with a wrong shape gets the usual message


def test_help_names_the_command() -> None:
    assert build_parser().format_usage().startswith("usage: lara-serve")


async def test_startup_log_mentions_the_ui(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="lara_serve.server.app"):
        async with serve(make_settings(port=8123)):
            pass
    assert any("http://127.0.0.1:8123/ui" in r.getMessage() for r in caplog.records)
