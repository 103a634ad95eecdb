"""Triton's extensions, checked with tritonclient's own calls against a live server (and in-process edges)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from server_helpers import IMAGE, MAX_LENGTH, TEXT, serve

from lara_serve.server import Settings
from lara_serve.server.synthetic import TEXT_LABELS
from lara_serve.server.testing import server_process

http = pytest.importorskip("tritonclient.http")
KEY = "triton-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def triton(repo: Path) -> Iterator[object]:
    env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_NUM_THREADS": "1", "LARA_API_KEY": KEY}
    with server_process(
        ["--log-level", "warning", "--model-control", "explicit", "--max-batch-size", "8"], env=env
    ) as url:
        yield http.InferenceServerClient(url=url.removeprefix("http://"))


def _texts(*texts: str) -> object:
    tensor = http.InferInput("raw", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    return tensor


def test_server_metadata_lists_the_extensions_served(triton: object) -> None:
    extensions = set(triton.get_server_metadata(headers=AUTH)["extensions"])
    assert {
        "binary_tensor_data",
        "classification",
        "model_configuration",
        "model_repository",
        "statistics",
    } <= extensions


def test_model_config_in_triton_shape(triton: object) -> None:
    config = triton.get_model_config(TEXT, headers=AUTH)
    assert config["name"] == TEXT and config["max_batch_size"] == 8
    inputs = {i["name"]: i for i in config["input"]}
    assert inputs["raw"]["data_type"] == "TYPE_STRING"
    assert inputs["input_ids"]["data_type"] == "TYPE_INT64" and inputs["input_ids"]["dims"] == [
        -1
    ]  # batch axis left out
    outputs = {o["name"]: o for o in config["output"]}
    assert outputs["probabilities"]["dims"] == [len(TEXT_LABELS)]
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] >= 8
    assert config["parameters"]["max_length"]["string_value"] == str(MAX_LENGTH)
    image = triton.get_model_config(IMAGE, headers=AUTH)
    assert {i["name"]: i["dims"] for i in image["input"]}["pixel_values"] == [1, 28, 28]


def test_statistics_count_what_was_served(triton: object) -> None:
    def success() -> tuple[int, int, int]:
        (stats,) = triton.get_inference_statistics(TEXT, headers=AUTH)["model_stats"]
        return (
            stats["inference_stats"]["success"]["count"],
            stats["inference_count"],
            stats["inference_stats"]["queue"]["count"],
        )

    before = success()
    triton.infer(TEXT, [_texts("one", "two", "three")], headers=AUTH)
    triton.infer(TEXT, [_texts("four")], headers=AUTH)
    after = success()
    # queue: per successful request, as Triton counts it (lara_serve.server.statistics)
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (2, 4, 2)
    everything = triton.get_inference_statistics(headers=AUTH)["model_stats"]
    assert sorted(s["name"] for s in everything) == sorted([IMAGE, TEXT])
    (text,) = [s for s in everything if s["name"] == TEXT]
    assert text["inference_stats"]["compute_infer"]["ns"] > 0 and text["execution_count"] >= 1


def test_classification_extension_gives_score_index_label(triton: object) -> None:
    texts = _texts("markets and shares", "a long match report about the final")
    probabilities = triton.infer(TEXT, [texts], headers=AUTH).as_numpy("probabilities")  # [2, n_labels]
    for binary in (True, False):
        wanted = [http.InferRequestedOutput("probabilities", binary_data=binary, class_count=3)]
        top = triton.infer(TEXT, [texts], outputs=wanted, headers=AUTH).as_numpy("probabilities")
        assert top.shape == (2, 3)
        for row, expected in zip(top, probabilities, strict=True):
            # binary outputs come back as bytes, JSON ones as str
            parsed = [(v.decode() if isinstance(v, bytes) else v).split(":") for v in row]
            indices = [int(i) for _, i, _ in parsed]
            assert indices == list(np.argsort(-expected, kind="stable")[:3])
            assert [label for _, _, label in parsed] == [TEXT_LABELS[i] for i in indices]
            np.testing.assert_allclose([float(s) for s, _, _ in parsed], expected[indices], atol=1e-6)


def test_repository_index_unload_and_load(triton: object) -> None:
    index = {m["name"]: m for m in triton.get_model_repository_index(headers=AUTH)}
    assert index[TEXT]["state"] == "READY" and index[IMAGE]["state"] == "READY"
    triton.unload_model(IMAGE, headers=AUTH)
    try:
        assert not triton.is_model_ready(IMAGE, headers=AUTH)
        index = {m["name"]: m for m in triton.get_model_repository_index(headers=AUTH)}
        assert index[IMAGE]["state"] == "UNAVAILABLE" and "unloaded" in index[IMAGE]["reason"]
        with pytest.raises(http.InferenceServerException, match="not available"):
            triton.get_model_metadata(IMAGE, headers=AUTH)
        assert triton.is_model_ready(TEXT, headers=AUTH)  # the other model is untouched
    finally:
        triton.load_model(IMAGE, headers=AUTH)
    assert triton.is_model_ready(IMAGE, headers=AUTH)
    triton.load_model(TEXT, headers=AUTH)  # reload of a served model: still serves afterwards
    assert triton.infer(TEXT, [_texts("after reload")], headers=AUTH).as_numpy("probabilities").shape == (1, 4)


def test_model_control_needs_the_key(triton: object) -> None:
    with pytest.raises(http.InferenceServerException, match="API key"):
        triton.unload_model(TEXT)
    with pytest.raises(http.InferenceServerException, match="API key"):
        triton.get_model_repository_index()
    assert triton.is_model_ready(TEXT, headers=AUTH)


# -- in process: the edges ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_model_control_is_off_by_default(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings()) as client:
        response = await client.post(f"/v2/repository/models/{TEXT}/unload")
        assert response.status_code == 400 and "--model-control explicit" in response.json()["error"]
        assert (await client.get(f"/v2/models/{TEXT}/ready")).status_code == 200


@pytest.mark.anyio
async def test_load_errors_are_clear(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(model_control="explicit")) as client:
        missing = await client.post("/v2/repository/models/nope/load")
        assert missing.status_code == 404 and "nope" in missing.json()["error"]
        override = await client.post(f"/v2/repository/models/{TEXT}/load", json={"parameters": {"config": "{}"}})
        assert override.status_code == 422 and "config.json" in override.json()["error"]
        assert (await client.post("/v2/repository/models/nope/unload")).status_code == 404
        assert (await client.post("/v2/repository/index", content=b"[1]")).status_code == 400
        bad_class = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
                     "outputs": [{"name": "label", "parameters": {"classification": 2}}]}  # fmt: skip
        response = await client.post(f"/v2/models/{TEXT}/infer", json=bad_class)
        assert response.status_code == 422 and "probabilities" in response.json()["error"]
