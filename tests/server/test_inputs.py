"""Flexible inputs (multipart, octet-stream, charsets, base64 in v2 JSON) and discoverable models (/info, metadata)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from server_helpers import IMAGE, MAX_LENGTH, TEXT, png_bytes, serve

from lara_serve.server import Settings
from lara_serve.server.synthetic import IMAGE_LABELS, TEXT_LABELS

pytestmark = pytest.mark.anyio
TEXT_SAMPLE = "Café prices rose in Zürich; the résumé of the week: señor Müller's naïve coöperative won."


def scores(response: httpx.Response) -> dict[str, float]:
    assert response.status_code == 200, response.text
    return {t["label"]: t["score"] for t in response.json()["top_k"]}


async def classify(
    client: httpx.AsyncClient, model: str, body: bytes, content_type: str, **params: Any
) -> httpx.Response:
    headers = {"Content-Type": content_type}
    return await client.post(
        f"/v1/models/{model}:classify", content=body, headers=headers, params={"top_k": 10, **params}
    )


# -- multipart and octet-stream ----------------------------------------------------------------------------


async def test_multipart_one_file_answers_like_a_raw_body(client: httpx.AsyncClient) -> None:
    image = png_bytes(seed=3)
    raw = await classify(client, IMAGE, image, "image/png")
    upload = await client.post(f"/v1/models/{IMAGE}:classify", params={"top_k": 10},
                               files={"file": ("shoe.png", image, "image/png")})  # fmt: skip
    assert scores(upload) == scores(raw) and upload.json()["model_name"] == IMAGE
    assert set(scores(raw)) == set(IMAGE_LABELS)


async def test_multipart_several_files_one_prediction_each_in_order(client: httpx.AsyncClient) -> None:
    images = [png_bytes(seed=s) for s in (1, 2, 3)]
    files = [
        ("file", ("a.png", images[0], "image/png")),
        ("file", ("b.bin", images[1], "application/octet-stream")),  # sniffed
        ("other", ("c.png", images[2], "image/png")),
    ]
    response = await client.post(f"/v1/models/{IMAGE}:classify", params={"top_k": 10}, files=files)
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert [p["filename"] for p in predictions] == ["a.png", "b.bin", "c.png"]
    for prediction, image in zip(predictions, images, strict=True):
        alone = scores(await classify(client, IMAGE, image, "image/png"))
        assert {t["label"]: t["score"] for t in prediction["top_k"]} == pytest.approx(alone, abs=1e-6)


async def test_multipart_text_parts_decode_their_charset_and_fields_count_as_texts(client: httpx.AsyncClient) -> None:
    utf8 = scores(await classify(client, TEXT, TEXT_SAMPLE.encode(), "text/plain; charset=utf-8"))
    files = [("doc", ("doc.txt", TEXT_SAMPLE.encode("latin-1"), "text/plain; charset=latin-1"))]
    upload = await client.post(f"/v1/models/{TEXT}:classify", params={"top_k": 10}, files=files)
    assert scores(upload) == pytest.approx(utf8, abs=1e-6)
    field = await client.post(f"/v1/models/{TEXT}:classify", params={"top_k": 10}, data={"text": TEXT_SAMPLE})
    assert scores(field) == pytest.approx(utf8, abs=1e-6)


async def test_multipart_errors_name_the_part(client: httpx.AsyncClient) -> None:
    wrong = await client.post(f"/v1/models/{IMAGE}:classify", files={"file": ("notes.txt", b"hello", "text/plain")})
    assert wrong.status_code == 415 and "notes.txt" in wrong.json()["error"] and "image/png" in wrong.json()["error"]
    field = await client.post(
        f"/v1/models/{IMAGE}:classify", data={"text": "hello"}, files={"f": ("a.png", png_bytes(), "image/png")}
    )
    assert field.status_code == 422 and "'text' is not a file" in field.json()["error"]
    empty = await client.post(f"/v1/models/{IMAGE}:classify", content=b"--x--\r\n",
                              headers={"Content-Type": "multipart/form-data; boundary=x"})  # fmt: skip
    assert empty.status_code == 422 and "-F file=@" in empty.json()["error"]


async def test_octet_stream_is_sniffed(client: httpx.AsyncClient) -> None:
    image = png_bytes(seed=5)
    assert scores(await classify(client, IMAGE, image, "application/octet-stream")) == scores(
        await classify(client, IMAGE, image, "image/png")
    )
    jpeg = png_bytes(seed=5, fmt="JPEG")
    assert (await classify(client, IMAGE, jpeg, "application/octet-stream")).status_code == 200
    text = TEXT_SAMPLE.encode()
    assert scores(await classify(client, TEXT, text, "application/octet-stream")) == scores(
        await classify(client, TEXT, text, "text/plain")
    )
    image_to_text = await classify(client, TEXT, image, "application/octet-stream")
    assert image_to_text.status_code == 415 and "looks like image/png" in image_to_text.json()["error"]
    text_to_image = await classify(client, IMAGE, text, "application/octet-stream")
    assert text_to_image.status_code == 415 and "looks like text/plain" in text_to_image.json()["error"]
    noise = await classify(client, IMAGE, bytes(range(256)) * 4, "application/octet-stream")
    assert noise.status_code == 415 and "not text or a known image format" in noise.json()["error"]


# -- charsets ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("charset", ["iso-8859-1", "latin-1", "cp1252", "utf-16", '"ISO-8859-15"'])
async def test_declared_charsets_are_decoded(client: httpx.AsyncClient, charset: str) -> None:
    utf8 = scores(await classify(client, TEXT, TEXT_SAMPLE.encode(), "text/plain; charset=utf-8"))
    encoded = TEXT_SAMPLE.encode(charset.strip('"'))
    assert scores(await classify(client, TEXT, encoded, f"text/plain; charset={charset}")) == pytest.approx(
        utf8, abs=1e-6
    )


async def test_charset_decoding_is_what_makes_non_utf8_text_acceptable(client: httpx.AsyncClient) -> None:
    latin1 = TEXT_SAMPLE.encode("latin-1")
    assert (await classify(client, TEXT, latin1, "text/plain; charset=latin-1")).status_code == 200
    undeclared = await classify(client, TEXT, latin1, "text/plain")  # the same bytes read as UTF-8
    assert undeclared.status_code == 422 and "UTF-8" in undeclared.json()["error"]


async def test_charset_errors(client: httpx.AsyncClient) -> None:
    unknown = await classify(client, TEXT, b"abc", "text/plain; charset=klingon")
    assert unknown.status_code == 415 and "klingon" in unknown.json()["error"]
    undecodable = await classify(client, TEXT, b"caf\xe9", "text/plain; charset=us-ascii")
    assert undecodable.status_code == 422 and "us-ascii" in undecodable.json()["error"]


async def test_charset_decoded_text_is_truncated_in_utf8_bytes(client: httpx.AsyncClient) -> None:
    # 200 "é" are 200 latin-1 bytes but 400 UTF-8 bytes: over MAX_LENGTH=256 once decoded.
    body = ("é" * 200).encode("latin-1")
    refused = await classify(client, TEXT, body, "text/plain; charset=latin-1")
    assert refused.status_code == 413
    cut = await classify(client, TEXT, body, "text/plain; charset=latin-1", truncate="head")
    assert cut.status_code == 200 and cut.json()["truncated"] is True


# -- base64 images in v2 JSON -----------------------------------------------------------------------------


def v2_raw(elements: list[str], content_type: str | None = "base64") -> dict[str, Any]:
    params = {"content_type": content_type} if content_type else {}
    return {
        "inputs": [
            {"name": "raw", "datatype": "BYTES", "shape": [len(elements)], "data": elements, "parameters": params}
        ]
    }


async def test_base64_images_in_v2_json(client: httpx.AsyncClient) -> None:
    images = [png_bytes(seed=s) for s in (7, 8)]
    body = v2_raw([base64.b64encode(i).decode() for i in images])
    response = await client.post(f"/v2/models/{IMAGE}/infer", json=body)
    assert response.status_code == 200, response.text
    probabilities = {o["name"]: o["data"] for o in response.json()["outputs"]}["probabilities"]
    for n, image in enumerate(images):
        alone = scores(await classify(client, IMAGE, image, "image/png"))
        row = probabilities[n * len(IMAGE_LABELS) : (n + 1) * len(IMAGE_LABELS)]
        assert dict(zip(IMAGE_LABELS, row, strict=True)) == pytest.approx(alone, abs=1e-6)


async def test_base64_errors_name_the_input(client: httpx.AsyncClient) -> None:
    bad = await client.post(f"/v2/models/{IMAGE}/infer", json=v2_raw(["not base64!"]))
    assert bad.status_code == 422 and "'raw' element 0 is not valid base64" in bad.json()["error"]
    undeclared = await client.post(
        f"/v2/models/{IMAGE}/infer", json=v2_raw([base64.b64encode(png_bytes()).decode()], None)
    )
    assert undeclared.status_code == 422
    assert "0x" not in undeclared.json()["error"]  # no Python object repr in the message


# -- discoverable models -------------------------------------------------------------------------------------


async def test_info_tells_limits_and_model_cards(client: httpx.AsyncClient) -> None:
    info = (await client.get("/info")).json()
    assert info["max_input_length"] == MAX_LENGTH and info["max_batch_total_tokens"] == 65536
    assert "classification" in info["protocols"]["v2_extensions"] and info["docs"]["swagger"] == "/docs"
    cards = {c["name"]: c for c in info["models"]}
    assert cards[TEXT]["labels"] == TEXT_LABELS and cards[TEXT]["media_types"] == ["text/plain"]
    assert cards[TEXT]["max_length"] == MAX_LENGTH and "head+tail" in cards[TEXT]["truncation_sides"]
    assert "image/png" in cards[IMAGE]["media_types"] and cards[IMAGE]["image_size"] == [28, 28]
    assert "max_length" not in cards[IMAGE]


async def test_v1_and_v2_metadata_carry_the_card(client: httpx.AsyncClient) -> None:
    v1 = (await client.get(f"/v1/models/{TEXT}")).json()
    v2 = (await client.get(f"/v2/models/{TEXT}")).json()["parameters"]
    for meta in (v1, v2):
        assert meta["max_length"] == MAX_LENGTH and meta["media_types"] == ["text/plain"]
        assert meta["labels"] == TEXT_LABELS and "suited_inputs" in meta
    assert v1["ready"] is True


async def test_shipped_cards_carry_attention_and_accuracy() -> None:
    from lara_serve.server.model_card import describe
    from lara_serve.server.models import load_models
    from lara_serve.server.settings import DEFAULT_MODEL_REPOSITORY

    settings = Settings(model_repository=DEFAULT_MODEL_REPOSITORY, models=["lara-vit-fashion"], warmup=False)
    (model,) = load_models(settings).values()
    try:
        card = describe(model)
        assert card["attention"]["kind"] == "lara" and 0.5 < card["accuracy"]["test_accuracy"] <= 1.0
        assert card["attention_kernel"] == "fused"  # the default, ort_attention=auto, where it can be built
    finally:
        model.backend.close()


async def test_health_answers_head(client: httpx.AsyncClient) -> None:
    assert (await client.head("/v2/health/live")).status_code == 200
    assert (await client.head("/v2/health/ready")).status_code == 200


# -- metrics -----------------------------------------------------------------------------------------------


async def test_metrics_input_length_version_and_process(client: httpx.AsyncClient) -> None:
    await classify(client, TEXT, b"x" * 100, "text/plain")
    text = (await client.get("/metrics")).text
    assert f'lara_input_length_count{{model="{TEXT}"}} 1.0' in text
    assert f'lara_item_seconds_count{{length="128",model="{TEXT}"}} 1.0' in text
    assert f'lara_model_info{{backend="onnxruntime",model="{TEXT}",task="text",version="1"}} 1.0' in text
    assert "process_resident_memory_bytes" in text and "lara_build_info" in text


async def test_metrics_without_the_key_only_when_asked(make_settings: Callable[..., Settings]) -> None:
    key = {"api_key": "metrics-test-key"}
    async with serve(make_settings(**key)) as locked:
        assert (await locked.get("/metrics")).status_code == 401
        assert (await locked.get("/info")).status_code == 401
        # The pages are public (they hold no data); the calls they make carry the key the user types in.
        for page in ("/ui", "/ui/app.js", "/docs", "/redoc"):
            assert (await locked.get(page)).status_code == 200, page
        assert (await locked.get("/ui/../settings.py")).status_code == 404
    async with serve(make_settings(**key, metrics_auth=False)) as open_metrics:
        assert (await open_metrics.get("/metrics")).status_code == 200
        assert (await open_metrics.get("/v1/models")).status_code == 401  # the API still needs the key
