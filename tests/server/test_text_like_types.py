""":classify on a text model reads the text-like media types people have (a saved web page, a README, a CSV,
a JSON or XML document, an e-mail) as text under text/plain's charset rules; images stay images, and the v1
JSON body on :predict keeps its meaning."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import IMAGE, TEXT, png_bytes

from lara_serve.server.content_types import is_text_like

pytestmark = pytest.mark.anyio
PAGE = "<html><body><h1>Profits</h1><p>Sales grew in every region, the company said.</p></body></html>"
TYPES = [
    "text/html",
    "text/markdown",
    "text/csv",
    "text/xml",
    "application/json",
    "application/ld+json",
    "application/xml",
    "application/xhtml+xml",
    "message/rfc822",
    "TEXT/HTML; charset=UTF-8",
]


async def _scores(client: httpx.AsyncClient, body: bytes, content_type: str) -> dict[str, float]:
    r = await client.post(f"/v1/models/{TEXT}:classify?top_k=9", content=body, headers={"content-type": content_type})
    assert r.status_code == 200, (content_type, r.text)
    return {s["label"]: s["score"] for s in r.json()["top_k"]}


@pytest.mark.parametrize("content_type", TYPES)
async def test_text_like_types_are_the_text(client: httpx.AsyncClient, content_type: str) -> None:
    assert await _scores(client, PAGE.encode(), content_type) == await _scores(client, PAGE.encode(), "text/plain")


async def test_charsets_apply_as_for_text_plain(client: httpx.AsyncClient) -> None:
    text = "Café prices rose; the market reacted."
    want = await _scores(client, text.encode(), "text/plain")
    assert await _scores(client, text.encode("latin-1"), "text/html; charset=iso-8859-1") == pytest.approx(want)
    assert await _scores(client, text.encode("utf-16"), "message/rfc822; charset=utf-16") == pytest.approx(want)
    undeclared = await client.post(f"/v1/models/{TEXT}:classify", content=text.encode("latin-1"),
                                   headers={"content-type": "text/markdown"})  # fmt: skip
    assert undeclared.status_code == 422 and "UTF-8" in undeclared.json()["error"]
    unknown = await client.post(f"/v1/models/{TEXT}:classify", content=b"a",
                                headers={"content-type": "text/csv; charset=klingon"})  # fmt: skip
    assert unknown.status_code == 415 and "klingon" in unknown.json()["error"]


async def test_multipart_parts_of_text_like_types(client: httpx.AsyncClient) -> None:
    files = [
        ("file", ("page.html", PAGE.encode(), "text/html")),
        ("file", ("mail.eml", PAGE.encode(), "message/rfc822")),
    ]
    r = await client.post(f"/v1/models/{TEXT}:classify?top_k=9", files=files)
    assert r.status_code == 200, r.text
    got = [{s["label"]: s["score"] for s in p["top_k"]} for p in r.json()["predictions"]]
    assert got == [await _scores(client, PAGE.encode(), "text/plain")] * 2


async def test_images_stay_images_and_others_are_refused(client: httpx.AsyncClient) -> None:
    page = await client.post(
        f"/v1/models/{IMAGE}:classify", content=PAGE.encode(), headers={"content-type": "text/html"}
    )
    assert page.status_code == 415 and "image/png" in page.json()["error"]
    png = await client.post(f"/v1/models/{TEXT}:classify", content=png_bytes(), headers={"content-type": "image/png"})
    assert png.status_code == 415
    pdf = await client.post(
        f"/v1/models/{TEXT}:classify", content=b"%PDF-1.7", headers={"content-type": "application/pdf"}
    )
    error = pdf.json()["error"]
    assert pdf.status_code == 415 and "text/*" in error and "message/rfc822" in error


async def test_json_on_predict_stays_v1(client: httpx.AsyncClient) -> None:
    r = await client.post(f"/v1/models/{TEXT}:predict", json={"instances": ["a text", "another"]})
    assert r.status_code == 200 and len(r.json()["predictions"]) == 2
    bad = await client.post(f"/v1/models/{TEXT}:predict", json={"text": "not v1"})
    assert bad.status_code == 400 and "instances" in bad.json()["error"]


def test_is_text_like() -> None:
    assert all(is_text_like(t.split(";")[0].lower()) for t in TYPES)
    assert not any(is_text_like(t) for t in ("image/png", "application/pdf", "application/octet-stream", "video/x"))
