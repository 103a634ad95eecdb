"""TorchServe's own forms, as its documentation and curl send them: PUT (`curl -T`), curl's default
urlencoded type on a raw text, `1.0` versions, `{"data": ...}` JSON, /explanations, and the management API
(list, describe, register, unregister) behind model_control and the API key."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import httpx
import pytest
from server_helpers import IMAGE, TEXT, png_bytes, serve

from lara_serve.server import Settings
from lara_serve.server.synthetic import TEXT_LABELS

pytestmark = pytest.mark.anyio
DOC = "The company reported higher profits this quarter as sales grew in every region."
WITH_EQUALS = "Revenue = price x volume, the report says; the = sign must not cut this text."
URLENCODED = {"content-type": "application/x-www-form-urlencoded"}  # curl --data-binary's default


async def _classify(client: httpx.AsyncClient, text: str) -> dict[str, float]:
    r = await client.post(f"/v1/models/{TEXT}:classify?top_k=9", content=text.encode(),
                          headers={"content-type": "text/plain"})  # fmt: skip
    assert r.status_code == 200, r.text
    return {s["label"]: s["score"] for s in r.json()["top_k"]}


async def _ts(client: httpx.AsyncClient, method: str, path: str, **kwargs: object) -> dict[str, float]:
    r = await client.request(method, f"{path}?top_k=9", **kwargs)  # type: ignore[arg-type]
    assert r.status_code == 200, r.text
    return r.json()


async def test_put_and_urlencoded_bodies_are_the_text_as_sent(client: httpx.AsyncClient) -> None:
    want = await _classify(client, WITH_EQUALS)
    assert want != await _classify(client, WITH_EQUALS.split("=")[-1])  # the cut would change the answer
    put = await _ts(client, "PUT", f"/predictions/{TEXT}", content=WITH_EQUALS.encode())  # curl -T: no type
    posted = await _ts(client, "POST", f"/predictions/{TEXT}", content=WITH_EQUALS.encode(), headers=URLENCODED)
    markdown = await _ts(client, "POST", f"/predictions/{TEXT}", content=WITH_EQUALS.encode(),
                         headers={"content-type": "text/markdown"})  # fmt: skip
    assert put == pytest.approx(want) and posted == pytest.approx(want) and markdown == pytest.approx(want)
    latin1 = await _ts(client, "POST", f"/predictions/{TEXT}", content="café = bar".encode("latin-1"),
                       headers={"content-type": "application/x-www-form-urlencoded; charset=latin-1"})  # fmt: skip
    assert latin1 == pytest.approx(await _classify(client, "café = bar"))
    empty = await client.post(f"/predictions/{TEXT}", content=b"", headers=URLENCODED)
    assert empty.status_code == 422 and "empty" in empty.json()["error"]


async def test_images_stay_images(client: httpx.AsyncClient) -> None:
    png = png_bytes(seed=4)
    want = await _ts(client, "POST", f"/predictions/{IMAGE}", content=png, headers={"content-type": "image/png"})
    assert await _ts(client, "PUT", f"/predictions/{IMAGE}", content=png) == want
    assert await _ts(client, "POST", f"/predictions/{IMAGE}", content=png, headers=URLENCODED) == want
    to_text = await client.post(f"/predictions/{TEXT}", content=png, headers={"content-type": "image/png"})
    assert to_text.status_code == 415 and "text model" in to_text.json()["error"]
    text_to_image = await client.post(f"/predictions/{IMAGE}", content=b"hello", headers=URLENCODED)
    assert text_to_image.status_code == 415 and "looks like text/plain" in text_to_image.json()["error"]


async def test_versions_compare_as_numbers(client: httpx.AsyncClient) -> None:
    want = await _ts(client, "POST", f"/predictions/{TEXT}", content=DOC.encode())
    for version in ("1", "1.0", "1.00"):
        assert await _ts(client, "PUT", f"/predictions/{TEXT}/{version}", content=DOC.encode()) == want
    for version in ("2.0", "one"):
        wrong = await client.put(f"/predictions/{TEXT}/{version}", content=DOC.encode())
        assert wrong.status_code == 404 and "'1'" in wrong.json()["error"], wrong.text


async def test_json_data_bodies(client: httpx.AsyncClient) -> None:
    want = await _ts(client, "POST", f"/predictions/{TEXT}", content=DOC.encode())
    assert await _ts(client, "POST", f"/predictions/{TEXT}", json={"data": DOC}) == pytest.approx(want)
    assert await _ts(client, "POST", f"/predictions/{TEXT}", json={"body": DOC}) == pytest.approx(want)
    two = await _ts(client, "POST", f"/predictions/{TEXT}", json={"data": [DOC, "A late goal won the final."]})
    assert isinstance(two, list) and len(two) == 2 and two[0] == pytest.approx(want)
    other = {"title": "report", "text": DOC}  # no data field: for a text model the JSON document is the text
    as_text = await _ts(client, "POST", f"/predictions/{TEXT}", content=json.dumps(other).encode(),
                        headers={"content-type": "application/json"})  # fmt: skip
    assert as_text == pytest.approx(await _classify(client, json.dumps(other)))
    png = png_bytes(seed=6)
    image = await _ts(client, "POST", f"/predictions/{IMAGE}", json={"data": base64.b64encode(png).decode()})
    assert image == await _ts(client, "POST", f"/predictions/{IMAGE}", content=png)
    for body, words in (({"data": "not base64!"}, "base64"), ({"data": 7}, "string")):
        bad = await client.post(f"/predictions/{IMAGE}", json=body)
        assert bad.status_code == 422 and words in bad.json()["error"], bad.text
    no_data = await client.post(f"/predictions/{IMAGE}", json={"image": "x"})
    assert no_data.status_code == 415


async def test_explanations(client: httpx.AsyncClient) -> None:
    text = " ".join([DOC] * 3)  # under max_length
    v1 = await client.post(f"/v1/models/{TEXT}:explain", json={"instances": [text], "parameters": {"max_passages": 4}})
    assert v1.status_code == 200, v1.text
    want = v1.json()["explanations"][0]
    for method, kwargs in (("PUT", {"content": text.encode()}), ("POST", {"json": {"data": text}})):
        r = await client.request(method, f"/explanations/{TEXT}/1.0?max_passages=4", **kwargs)  # type: ignore[arg-type]
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["label"] == want["label"] and len(got["passages"]) == len(want["passages"]) >= 2
        assert [p["contribution"] for p in got["passages"]] == pytest.approx(
            [p["contribution"] for p in want["passages"]], abs=1e-5
        )
    image = await client.post(f"/explanations/{IMAGE}", content=png_bytes())
    assert image.status_code == 422 and "only text models explain" in image.json()["error"]


async def test_management_reads(client: httpx.AsyncClient) -> None:
    listed = await client.get("/models")
    assert listed.json() == {"models": [{"modelName": n, "modelUrl": n} for n in sorted([IMAGE, TEXT])]}
    page = (await client.get("/models?limit=1")).json()
    assert page["models"] == [{"modelName": IMAGE, "modelUrl": IMAGE}] and page["nextPageToken"] == "1"
    rest = (await client.get("/models?limit=1&next_page_token=1")).json()
    assert rest == {"models": [{"modelName": TEXT, "modelUrl": TEXT}]}
    for path in (f"/models/{TEXT}", f"/models/{TEXT}/1.0", f"/models/{TEXT}/all"):
        (card,) = (await client.get(path)).json()
        assert card["modelName"] == TEXT and card["modelVersion"] == "1" and card["workers"][0]["status"] == "READY"
    assert (await client.get("/models/nope")).status_code == 404
    off = await client.post(f"/models?url={TEXT}")
    assert off.status_code == 400 and "model_control" in off.json()["error"]
    assert (await client.delete(f"/models/{TEXT}")).status_code == 400


async def test_register_and_unregister(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(model_control="explicit", api_key="key-12345")) as client:
        key = {"x-api-key": "key-12345"}
        assert (await client.get("/models")).status_code == 401
        assert (await client.delete(f"/models/{TEXT}")).status_code == 401
        gone = await client.delete(f"/models/{TEXT}/1.0", headers=key)
        assert gone.status_code == 200 and gone.json() == {"status": f'Model "{TEXT}" unregistered'}
        assert (await client.get("/models", headers=key)).json()["models"] == [{"modelName": IMAGE, "modelUrl": IMAGE}]
        assert (await client.get(f"/models/{TEXT}", headers=key)).status_code == 404
        assert (await client.delete(f"/models/{TEXT}", headers=key)).status_code == 404
        assert (await client.post(f"/predictions/{TEXT}", content=DOC.encode(), headers=key)).status_code == 503
        back = await client.post(f"/models?url={TEXT}&initial_workers=1&synchronous=true", headers=key)
        assert back.status_code == 200, back.text
        assert back.json() == {"status": f'Model "{TEXT}" Version: 1 registered with 1 initial workers'}
        again = await client.post(f"/models?url={TEXT}", headers=key)
        assert again.status_code == 409 and "already registered" in again.json()["error"]
        renamed = await client.post(f"/models?url={TEXT}&model_name=other", headers=key)
        assert renamed.status_code == 422 and "must equal url" in renamed.json()["error"]
        missing = await client.post("/models?url=nope.mar", headers=key)
        assert missing.status_code == 404 and TEXT in missing.json()["error"]
        assert (await client.post("/models", headers=key)).status_code == 400  # url is required
        r = await client.put(f"/predictions/{TEXT}", content=DOC.encode(), headers=key)
        assert r.status_code == 200 and set(r.json()) <= set(TEXT_LABELS)
