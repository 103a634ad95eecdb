"""A model's own truncation default (config.json preprocessing.truncate, written by `lara train` for models
trained on documents cut at max_length): applied on every route when the request says nothing, never when
it says false; a model without the key keeps the 413."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import MAX_LENGTH, live_server, serve, tritonclient_http

from lara_serve.server import Settings
from lara_serve.server.repository import RepositoryError, read_config
from lara_serve.server.synthetic import make_text_model

pytestmark = pytest.mark.anyio
CUTS, PLAIN = "cuts-head", "plain"  # preprocessing.truncate "head", and no key (as every shipped model)
LONG = "ab" * MAX_LENGTH  # 2x max_length
PLAIN_TEXT = {"content-type": "text/plain"}


def _set_truncate(model_dir: Path, value: object) -> None:
    path = model_dir / "config.json"
    conf = json.loads(path.read_text())
    conf["preprocessing"]["truncate"] = value
    path.write_text(json.dumps(conf))


@pytest.fixture(scope="module")
def default_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("truncate_default")
    make_text_model(root, CUTS, max_length=MAX_LENGTH)
    make_text_model(root, PLAIN, max_length=MAX_LENGTH)
    _set_truncate(root / CUTS, "head")
    return root


@pytest.fixture
async def client(default_repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(Settings(model_repository=default_repo, max_queue_delay_ms=2.0, tei_model=CUTS)) as c:
        yield c


async def _statuses(client: httpx.AsyncClient, name: str, say: dict[str, object]) -> dict[str, int]:
    """Status per route for LONG, the request's truncate given as `say` ({} = not given)."""
    query = {k: str(v).lower() for k, v in say.items()}
    params = dict(say)
    v2 = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": [LONG]}], "parameters": params}
    tei = {"inputs": LONG, **params}
    responses = {
        "classify": await client.post(f"/v1/models/{name}:classify", params=query, content=LONG, headers=PLAIN_TEXT),
        "predict": await client.post(f"/v1/models/{name}:predict", json={"instances": [LONG], "parameters": params}),
        "v2": await client.post(f"/v2/models/{name}/infer", json=v2),
        "torchserve": await client.post(f"/predictions/{name}", params=query, content=LONG, headers=PLAIN_TEXT),
        "tei": await client.post("/predict", params={"model": name}, json=tei),
    }
    return {route: r.status_code for route, r in responses.items()}


async def test_the_models_default_applies_when_the_request_is_silent(client: httpx.AsyncClient) -> None:
    assert set((await _statuses(client, CUTS, {})).values()) == {200}
    r = await client.post(f"/v1/models/{CUTS}:predict", json={"instances": [LONG]})
    assert r.json()["predictions"][0]["truncated"] is True
    same = await client.post(
        f"/v1/models/{CUTS}:predict", json={"instances": [LONG], "parameters": {"truncate": "head"}}
    )
    assert same.json()["predictions"][0]["score"] == r.json()["predictions"][0]["score"]  # the default is the head


async def test_an_explicit_false_keeps_the_413(client: httpx.AsyncClient) -> None:
    assert set((await _statuses(client, CUTS, {"truncate": False})).values()) == {413}


async def test_a_model_without_the_key_answers_413_as_before(client: httpx.AsyncClient) -> None:
    assert set((await _statuses(client, PLAIN, {})).values()) == {413}
    assert set((await _statuses(client, PLAIN, {"truncate": True})).values()) == {200}


async def test_metadata_and_tei_info_state_the_default(client: httpx.AsyncClient) -> None:
    cuts = (await client.get(f"/v2/models/{CUTS}")).json()["parameters"]
    plain = (await client.get(f"/v2/models/{PLAIN}")).json()["parameters"]
    assert (cuts["truncate_default"], plain["truncate_default"]) == ("head", False)
    assert (await client.get("/info")).json()["auto_truncate"] is True


def test_a_config_with_an_unknown_default_is_refused(tmp_path: Path) -> None:
    make_text_model(tmp_path, "odd", max_length=MAX_LENGTH)
    _set_truncate(tmp_path / "odd", "middle")
    with pytest.raises(RepositoryError, match="preprocessing"):
        read_config(tmp_path / "odd")


@pytest.fixture(scope="module")
def live_url(default_repo: Path) -> Iterator[str]:
    yield from live_server(default_repo)


def test_tritonclient_gets_the_default_unless_it_says_false(live_url: str) -> None:
    http, client = tritonclient_http(live_url)
    raw = http.InferInput("raw", [1], "BYTES")
    raw.set_data_from_numpy(np.array([LONG.encode()], dtype=object), binary_data=True)
    answer = client.infer(CUTS, [raw])  # tritonclient sends no truncate parameter
    assert answer.as_numpy("probabilities").shape[0] == 1 and answer.get_response()["parameters"]["truncated"]
    with pytest.raises(http.InferenceServerException, match="413|at most"):
        client.infer(CUTS, [raw], parameters={"truncate": False})
    with pytest.raises(http.InferenceServerException, match="413|at most"):
        client.infer(PLAIN, [raw])
    client.close()
