"""KServe clients on their first call: v1 liveness at the bare address (a browser still lands on /ui), and
v2 response parameters that are scalars, as the Open Inference Protocol and kserve's SDK read them."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest
from server_helpers import IMAGE, MAX_LENGTH, TEXT, png_bytes

from lara_serve.server.synthetic import TEXT_LABELS

pytestmark = pytest.mark.anyio
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


async def test_root_is_v1_liveness_for_api_clients(client: httpx.AsyncClient) -> None:
    # kserve 0.21's InferenceRESTClient(RESTConfig(protocol="v1")).is_server_live(base_url) sends exactly
    # this: GET {base_url}/ from an httpx.AsyncClient (Accept: */*, no redirects followed), then requires a
    # 2xx and `response.json().get("status").lower() == "alive"`.
    live = await client.get("/", headers={"accept": "*/*"})
    assert live.status_code == 200 and live.headers["content-type"] == "application/json"
    assert live.json() == {"status": "alive"} and live.json().get("status").lower() == "alive"
    assert (await client.get("/")).json() == {"status": "alive"}  # httpx's own defaults, curl's too


async def test_root_redirects_a_browser_to_the_ui(client: httpx.AsyncClient) -> None:
    page = await client.get("/", headers={"accept": BROWSER_ACCEPT})
    assert page.status_code == 307 and page.headers["location"] == "/ui"


async def test_kserve_sdk_v1_is_server_live(client: httpx.AsyncClient) -> None:
    kserve = pytest.importorskip("kserve", reason="kserve is not installed: the request it makes is tested above")
    transport = client._transport  # type: ignore[attr-defined]  # the app in process
    rest = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v1", transport=transport))
    assert await rest.is_server_live("http://test") is True


def _scalar_parameters(body: dict[str, Any]) -> dict[str, Any]:
    """Every parameter of a v2 response (the response's and each output's) must be a bool, int or str."""
    found = dict(body.get("parameters") or {})
    for output in body["outputs"]:
        found.update({f"{output['name']}.{k}": v for k, v in (output.get("parameters") or {}).items()})
    odd = {k: v for k, v in found.items() if not isinstance(v, bool | int | str)}
    assert not odd, f"v2 parameters are scalars: {odd}"
    return found


async def test_v2_response_parameters_are_scalars(client: httpx.AsyncClient) -> None:
    long = "x" * (MAX_LENGTH + 5)
    one = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": ["short"]}]}
    r = await client.post(f"/v2/models/{TEXT}/infer", json=one)
    assert r.status_code == 200 and _scalar_parameters(r.json()) == {"truncated": False, "truncated_count": 0}
    batch = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [3], "data": [long, "a", long]}],
             "parameters": {"truncate": "head", "binary_data_output": True}}  # fmt: skip
    r = await client.post(f"/v2/models/{TEXT}/infer", json=batch)
    assert r.status_code == 200
    length = int(r.headers["inference-header-content-length"])
    params = _scalar_parameters(httpx.Response(200, content=r.content[:length]).json())
    assert params["truncated"] is True and params["truncated_count"] == 2
    assert params["probabilities.binary_data_size"] == 3 * len(TEXT_LABELS) * 4  # [3, n_labels] FP32
    image = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "parameters": {"content_type": "base64"},
                         "data": [base64.b64encode(png_bytes()).decode()]}]}  # fmt: skip
    r = await client.post(f"/v2/models/{IMAGE}/infer", json=image)
    assert r.status_code == 200 and _scalar_parameters(r.json()) == {}  # nothing is cut from an image


async def test_truncated_output_is_per_item_and_only_on_request(client: httpx.AsyncClient) -> None:
    long = "y" * (MAX_LENGTH + 1)
    inputs = [{"name": "raw", "datatype": "BYTES", "shape": [2], "data": ["a", long]}]
    plain = await client.post(f"/v2/models/{TEXT}/infer", json={"inputs": inputs, "parameters": {"truncate": True}})
    assert [o["name"] for o in plain.json()["outputs"]] == ["probabilities", "label"]  # old clients: unchanged
    asked = {"inputs": inputs, "parameters": {"truncate": True}, "outputs": [{"name": "truncated"}]}
    r = await client.post(f"/v2/models/{TEXT}/infer", json=asked)
    assert r.status_code == 200 and r.json()["outputs"] == [
        {"name": "truncated", "datatype": "BOOL", "shape": [2], "data": [False, True]}
    ]
    wrong = await client.post(f"/v2/models/{IMAGE}/infer", json={**asked, "inputs": [
        {"name": "raw", "datatype": "BYTES", "shape": [1], "parameters": {"content_type": "base64"},
         "data": [base64.b64encode(png_bytes()).decode()]}]})  # fmt: skip
    assert wrong.status_code in (400, 422) and "unknown outputs ['truncated']" in wrong.json()["error"]
