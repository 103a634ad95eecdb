"""TEI's /predict and /health, TorchServe's /ping and /predictions, and GET / -> /ui: the shapes of their
documentation, the answers of the v1 routes, the same 413/422 rules."""

from __future__ import annotations

import math
from collections.abc import Callable

import httpx
import pytest
from server_helpers import IMAGE, MAX_LENGTH, TEXT, png_bytes, serve

from lara_serve.server import Settings
from lara_serve.server.synthetic import TEXT_LABELS

pytestmark = pytest.mark.anyio
DOC = "The company reported higher profits this quarter as sales grew in every region."


async def _v1(client: httpx.AsyncClient, text: str, truncate: str | None = None) -> dict[str, float]:
    query = f"?truncate={truncate}" if truncate else ""
    r = await client.post(f"/v1/models/{TEXT}:predict{query}", json={"instances": [text], "parameters": {"top_k": 9}})
    assert r.status_code == 200, r.text
    return {s["label"]: s["score"] for s in r.json()["predictions"][0]["top_k"]}


async def test_tei_predict_one_text_as_documented(client: httpx.AsyncClient) -> None:
    r = await client.post("/predict", json={"inputs": DOC})  # TEI's README example, on the default model
    assert r.status_code == 200, r.text
    scores = r.json()
    assert [set(s) for s in scores] == [{"label", "score"}] * len(TEXT_LABELS)
    assert sorted(s["label"] for s in scores) == sorted(TEXT_LABELS)
    assert [s["score"] for s in scores] == sorted((s["score"] for s in scores), reverse=True)
    assert {s["label"]: s["score"] for s in scores} == pytest.approx(await _v1(client, DOC))
    assert r.headers["x-truncated"] == "false"


async def test_tei_batch_forms_and_raw_scores(client: httpx.AsyncClient) -> None:
    texts = [DOC, "The team won the final after a late goal."]
    plain = (await client.post("/predict", json={"inputs": texts})).json()
    nested = (await client.post(f"/predict?model={TEXT}", json={"inputs": [[t] for t in texts]})).json()
    assert plain == nested and len(plain) == 2
    single = (await client.post("/predict", json={"inputs": texts[1]})).json()
    assert [s["label"] for s in plain[1]] == [s["label"] for s in single]
    assert [s["score"] for s in plain[1]] == pytest.approx([s["score"] for s in single], abs=1e-6)
    raw = (await client.post("/predict", json={"inputs": texts[1], "raw_scores": True})).json()
    assert [s["label"] for s in raw] == [s["label"] for s in single]
    assert sum(math.exp(s["score"]) for s in raw) == pytest.approx(1.0, abs=1e-5)
    assert any(s["score"] < 0 for s in raw)


async def test_tei_truncation_follows_tei_and_the_413_rule(client: httpx.AsyncClient) -> None:
    long = "head " * 30 + "x" * MAX_LENGTH + " tail" * 30
    refused = await client.post("/predict", json={"inputs": long})
    assert refused.status_code == 413 and "truncat" in refused.json()["error"]
    right = await client.post("/predict", json={"inputs": long, "truncate": True})
    left = await client.post("/predict", json={"inputs": long, "truncate": True, "truncation_direction": "Left"})
    assert right.status_code == left.status_code == 200 and right.headers["x-truncated"] == "true"
    assert {s["label"]: s["score"] for s in right.json()} == pytest.approx(await _v1(client, long, "head"))
    assert {s["label"]: s["score"] for s in left.json()} == pytest.approx(await _v1(client, long, "tail"))


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"inputs": [["one", "two"]]}, 422, "pairs"),
        ({"inputs": ""}, 422, "empty"),
        ({"inputs": []}, 422, "at least one"),
        ({"text": "no inputs"}, 400, "inputs"),
        ({"inputs": "x", "truncation_direction": "Up"}, 400, "truncation_direction"),
    ],
)
async def test_tei_bad_bodies(client: httpx.AsyncClient, body: dict, status: int, words: str) -> None:
    r = await client.post("/predict", json=body)
    assert r.status_code == status and words in r.json()["error"], r.text


async def test_tei_model_choice(client: httpx.AsyncClient, make_settings: Callable[..., Settings]) -> None:
    image = await client.post(f"/predict?model={IMAGE}", json={"inputs": "x"})
    assert image.status_code == 422 and "image model" in image.json()["error"]
    assert (await client.post("/predict?model=nope", json={"inputs": "x"})).status_code == 404
    async with serve(make_settings(tei_model=IMAGE)) as other:
        assert (await other.post("/predict", json={"inputs": "x"})).status_code == 422


async def test_health_ping_and_root(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).status_code == 200
    ping = await client.get("/ping")
    assert ping.status_code == 200 and ping.json() == {"status": "Healthy"}
    root = await client.get("/", headers={"accept": "text/html"})  # a browser; API clients: test_kserve_v1_root.py
    assert root.status_code in (302, 307) and root.headers["location"] == "/ui"


async def test_torchserve_predictions_match_classify(client: httpx.AsyncClient) -> None:
    png = png_bytes(seed=3)
    expected = await client.post(
        f"/v1/models/{IMAGE}:classify?top_k=3", content=png, headers={"content-type": "image/png"}
    )
    as_body = await client.post(f"/predictions/{IMAGE}?top_k=3", content=png)  # curl -T: no Content-Type
    as_form = await client.post(f"/predictions/{IMAGE}/1?top_k=3", files={"data": ("a.png", png, "image/png")})
    assert as_body.status_code == as_form.status_code == 200, as_body.text
    want = {s["label"]: s["score"] for s in expected.json()["top_k"]}
    assert as_body.json() == pytest.approx(want) and list(as_body.json()) == list(want)
    assert as_form.json() == as_body.json()
    two = await client.post(f"/predictions/{IMAGE}", files=[("data", ("a.png", png)), ("data", ("b.png", png))])
    assert two.status_code == 200 and len(two.json()) == 2
    text = await client.post(f"/predictions/{TEXT}", content=DOC.encode(), headers={"content-type": "text/plain"})
    assert text.status_code == 200 and set(text.json()) <= set(TEXT_LABELS)
    wrong = await client.post(f"/predictions/{IMAGE}", content=b"not an image", headers={"content-type": "image/png"})
    assert wrong.status_code == 422
    assert (await client.post(f"/predictions/{TEXT}", content=b"x" * (MAX_LENGTH + 1))).status_code == 413


async def test_every_front_door_is_in_the_openapi_document(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert {"/predict", "/health", "/ping", "/", "/predictions/{name}"} <= set(paths)
    assert "post" in paths["/predict"] and "post" in paths["/predictions/{name}"]
