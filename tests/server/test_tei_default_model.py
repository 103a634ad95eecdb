"""TEI on a server with two text models: the default text model, POST / and /invocations, /info's TEI keys,
ood_score in the body when asked, and huggingface_hub's InferenceClient against a live server."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from server_helpers import serve

from lara_serve.server import Settings
from lara_serve.server.synthetic import TEXT_LABELS, make_image_model, make_text_model
from lara_serve.server.testing import server_process

pytestmark = pytest.mark.anyio
FIRST, SECOND, IMAGE = "a-text", "b-text", "c-image"  # repository (name) order: FIRST is the default
DOC = "The company reported higher profits this quarter as sales grew in every region."


@pytest.fixture(scope="module")
def two_texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("two_texts")
    make_text_model(root, SECOND, max_length=256, seed=1)
    make_text_model(root, FIRST, max_length=256, ood=True)
    make_image_model(root, IMAGE)
    return root


@pytest.fixture
async def client(two_texts: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(Settings(model_repository=two_texts, max_queue_delay_ms=2.0)) as c:
        yield c


async def _scores(client: httpx.AsyncClient, path: str, body: dict) -> list:
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def test_default_is_the_first_text_model_on_every_route(client: httpx.AsyncClient) -> None:
    first = await _scores(client, f"/predict?model={FIRST}", {"inputs": DOC})
    second = await _scores(client, f"/predict?model={SECOND}", {"inputs": DOC})
    assert first != second  # two different models, so the comparisons below tell them apart
    for path in ("/predict", "/", "/invocations"):
        assert await _scores(client, path, {"inputs": DOC}) == first, path
    assert await _scores(client, f"/invocations?model={SECOND}", {"inputs": DOC}) == second
    image = await client.post(f"/?model={IMAGE}", json={"inputs": "x"})
    assert image.status_code == 422 and "image model" in image.json()["error"]
    assert (await client.post("/invocations", content=b"{")).status_code == 400


async def test_tei_model_setting_picks_the_default(two_texts: Path) -> None:
    async with serve(Settings(model_repository=two_texts, tei_model=SECOND)) as other:
        direct = await _scores(other, f"/predict?model={SECOND}", {"inputs": DOC})
        assert await _scores(other, "/predict", {"inputs": DOC}) == direct
        assert (await other.get("/info")).json()["model_id"] == SECOND


async def test_hf_parameters_form_answers_one_list_per_text(client: httpx.AsyncClient) -> None:
    tei = await _scores(client, "/", {"inputs": DOC})
    hf = await _scores(client, "/", {"inputs": DOC, "parameters": {}})
    assert hf == [tei]
    top2 = await _scores(client, "/invocations", {"inputs": [DOC, "x y"], "parameters": {"top_k": 2}})
    assert len(top2) == 2 and [len(r) for r in top2] == [2, 2] and top2[0] == tei[:2]
    raw = await _scores(client, "/", {"inputs": DOC, "parameters": {"function_to_apply": "none"}})
    assert [s["label"] for s in raw[0]] == [s["label"] for s in tei] and all(s["score"] < 0 for s in raw[0])
    sigmoid = await client.post("/", json={"inputs": DOC, "parameters": {"function_to_apply": "sigmoid"}})
    assert sigmoid.status_code == 400 and "softmax" in sigmoid.json()["error"]
    assert await _scores(client, "/predict", {"inputs": DOC, "parameters": {}}) == tei  # /predict: TEI's shape


async def test_ood_score_in_the_body_when_asked(client: httpx.AsyncClient) -> None:
    plain = await client.post("/predict", json={"inputs": [DOC, "zzzz qqqq"]})
    assert all(set(s) == {"label", "score"} for row in plain.json() for s in row)
    asked = await client.post("/predict", json={"inputs": [DOC, "zzzz qqqq"], "return_ood": True})
    header_scores = [float(v) for v in asked.headers["x-ood-score"].split(",")]
    header_flags = [v == "true" for v in asked.headers["x-in-distribution"].split(",")]
    for row, score, flag in zip(asked.json(), header_scores, header_flags, strict=True):
        assert [s["ood_score"] for s in row] == pytest.approx([score] * len(row), rel=1e-5)
        assert {s["in_distribution"] for s in row} == {flag}
    hf = await _scores(client, "/", {"inputs": DOC, "parameters": {"return_ood": True}})
    assert hf[0][0]["ood_score"] == pytest.approx(header_scores[0], rel=1e-5)
    no_ood = await _scores(client, f"/predict?model={SECOND}", {"inputs": DOC, "return_ood": True})
    assert no_ood[0]["ood_score"] is None and no_ood[0]["in_distribution"] is None


async def test_info_has_tei_keys_beside_its_own(client: httpx.AsyncClient) -> None:
    info = (await client.get("/info")).json()
    assert info["model_id"] == FIRST and info["model_dtype"] == "float32"
    assert info["model_type"]["classifier"]["id2label"] == {str(i): v for i, v in enumerate(TEXT_LABELS)}
    assert info["model_type"]["classifier"]["label2id"] == {v: i for i, v in enumerate(TEXT_LABELS)}
    assert info["max_batch_tokens"] == info["max_batch_total_tokens"] > 0
    assert info["max_input_length"] == 256 and info["server"] == "lara-serve" and len(info["models"]) == 3


async def test_image_only_server_has_null_tei_model(tmp_path: Path) -> None:
    make_image_model(tmp_path, IMAGE)
    async with serve(Settings(model_repository=tmp_path)) as images:
        info = (await images.get("/info")).json()
        assert (
            info["model_id"] is None
            and info["model_dtype"] is None
            and info["model_type"]["classifier"]["id2label"] == {}
        )
        r = await images.post("/predict", json={"inputs": "x"})
        assert r.status_code == 422 and "no text model" in r.json()["error"]


# -- huggingface_hub against a real server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def live_url(two_texts: Path) -> Iterator[str]:
    env = {"LARA_MODEL_REPOSITORY": str(two_texts), "LARA_MAX_QUEUE_DELAY_MS": "1", "LARA_NUM_THREADS": "1"}
    with server_process(["--log-level", "warning"], env=env) as url:
        yield url


@pytest.mark.parametrize("path", ["", "/invocations"])
def test_huggingface_hub_text_classification(live_url: str, path: str) -> None:
    hub = pytest.importorskip("huggingface_hub")
    want = httpx.post(f"{live_url}/predict", json={"inputs": DOC}, timeout=30).json()
    client = hub.InferenceClient(model=live_url + path, timeout=30)
    got = client.text_classification(DOC)
    assert [(e.label, e.score) for e in got] == [(s["label"], pytest.approx(s["score"])) for s in want]
    top = client.text_classification(DOC, top_k=2)
    assert [e.label for e in top] == [s["label"] for s in want[:2]]


def test_curl_upload_forms_on_torchserve_routes(live_url: str, tmp_path: Path) -> None:
    """curl's own defaults: -T is a PUT with no Content-Type, --data-binary a POST typed urlencoded."""
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    article = tmp_path / "article.txt"
    article.write_text("Revenue = price x volume; profits rose as sales grew, the company said.", encoding="utf-8")
    want = httpx.post(f"{live_url}/predictions/{FIRST}?top_k=9", content=article.read_bytes(),
                      headers={"content-type": "text/plain"}, timeout=30).json()  # fmt: skip
    for flags in (["-T", str(article)], ["--data-binary", f"@{article}"]):
        out = subprocess.run([curl, "-sS", "--max-time", "30", *flags, f"{live_url}/predictions/{FIRST}/1.0?top_k=9"],
                             capture_output=True, check=True, timeout=60).stdout  # fmt: skip
        assert json.loads(out) == pytest.approx(want), flags
