"""Preprocessing described where clients look: a tritonclient user who builds `pixel_values` or `input_ids`
from the numbers in model metadata gets the label and scores of the raw input (shipped models)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lara_serve.server.testing import server_process

http = pytest.importorskip("tritonclient.http")
REPO = Path(__file__).resolve().parents[2] / "model_repository"
IMAGE, TEXT = "lara-vit-fashion", "lara-text-news-bytes"

# Twenty texts written for this test, of the kinds the news model knows and a few it does not.
TEXTS = [
    "The central bank raised interest rates by half a point on Tuesday, citing stubborn inflation.",
    "Shares of the carmaker fell 7% after it cut its delivery forecast for the rest of the year.",
    "The striker scored twice in the second half as the home side came back to win 3-2.",
    "Researchers unveiled a chip that runs neural networks on a fraction of the usual power.",
    "Rebel forces and the army agreed to a ceasefire brokered by neighbouring countries.",
    "The merger of the two airlines still needs approval from competition regulators in Brussels.",
    "A new species of frog was found in the cloud forests of the Andes, scientists reported.",
    "The champion retained her title after a five-set final that lasted nearly four hours.",
    "Parliament passed the budget late on Thursday after a week of heated debate.",
    "The software company said quarterly revenue rose 18%, beating analyst expectations.",
    "Astronomers detected water vapour in the atmosphere of a planet orbiting a distant star.",
    "Thousands marched through the capital demanding early elections and an end to corruption.",
    "The coach was sacked after a run of nine games without a win left the club near the bottom.",
    "Oil prices climbed to a three-month high as producers agreed to extend output cuts.",
    "A security flaw in a popular browser let attackers run code on visitors' computers.",
    "The prime minister flew to Washington for talks on trade and the war in the region.",
    "The Olympic committee announced the host city for the 2036 summer games.",
    "Retail sales slipped in December as shoppers cut back on holiday spending.",
    "Engineers tested a reusable rocket stage that landed upright on a barge at sea.",
    "my cat sleeps on the warm laptop every afternoon",
]


@pytest.fixture(scope="module")
def triton() -> Iterator[object]:
    env = {"LARA_MODEL_REPOSITORY": str(REPO), "LARA_NUM_THREADS": "1", "LARA_MODELS": f"{IMAGE},{TEXT}"}
    with server_process(["--log-level", "warning", "--no-warmup"], env=env, timeout_s=180) as url:
        yield http.InferenceServerClient(url=url.removeprefix("http://"))


def _infer(triton: object, model: str, name: str, datatype: str, array: np.ndarray) -> tuple[np.ndarray, list[str]]:
    tensor = http.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=True)
    outputs = [http.InferRequestedOutput("probabilities"), http.InferRequestedOutput("label")]
    result = triton.infer(model, [tensor], outputs=outputs)
    return result.as_numpy("probabilities"), _labels(result)


def _labels(result: object) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in result.as_numpy("label")]


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def test_metadata_and_config_carry_the_preprocessing(triton: object) -> None:
    params = triton.get_model_metadata(IMAGE)["parameters"]
    assert params["image_size"] == [28, 28] and params["channels"] == 1
    assert 0 < params["mean"] < 1 and 0 < params["std"] < 1 and params["pixel_scale"] == pytest.approx(1 / 255)
    config = triton.get_model_config(IMAGE)["parameters"]
    assert float(config["mean"]["string_value"]) == params["mean"]
    assert json.loads(config["image_size"]["string_value"]) == [28, 28]
    text = triton.get_model_metadata(TEXT)["parameters"]
    assert text["byte_offset"] == 1 and text["max_length"] > 0
    assert text["truncation_sides"] == ["head", "tail", "head+tail"]
    text_config = triton.get_model_config(TEXT)["parameters"]
    assert int(text_config["byte_offset"]["string_value"]) == 1
    assert triton.get_model_metadata(TEXT)["platform"] == triton.get_model_config(TEXT)["platform"]


def test_pixel_values_from_the_metadata_match_the_raw_images(triton: object) -> None:
    data = pytest.importorskip("lara_serve.model_export.training.data")
    try:
        images, _ = data.load_fashion("test")
    except data.DataUnavailable as exc:
        pytest.skip(str(exc))
    images = images[:20].numpy()  # uint8 [20, 1, 28, 28]
    params = triton.get_model_metadata(IMAGE)["parameters"]
    scale, mean, std = (np.float32(params[k]) for k in ("pixel_scale", "mean", "std"))
    pixels = ((images.astype(np.float32) * scale - mean) / std).astype(np.float32)  # [20, 1, 28, 28]
    raw = np.array([_png(im[0]) for im in images], dtype=object)
    p_raw, l_raw = _infer(triton, IMAGE, "raw", "BYTES", raw)
    p_pre, l_pre = _infer(triton, IMAGE, "pixel_values", "FP32", pixels)
    assert l_pre == l_raw
    np.testing.assert_allclose(p_pre, p_raw, atol=1e-5)
    # What most pipelines send, [0, 1] pixels, is a different input: the numbers above are needed.
    p_unit, _ = _infer(triton, IMAGE, "pixel_values", "FP32", images.astype(np.float32) / 255)
    assert not np.allclose(p_unit, p_raw, atol=1e-3)


def test_input_ids_from_the_metadata_match_the_raw_texts(triton: object) -> None:
    params = triton.get_model_metadata(TEXT)["parameters"]
    offset, pad = params["byte_offset"], params["pad_id"]
    encoded = [t.encode() for t in TEXTS]
    longest = max(map(len, encoded))
    ids = np.full((len(encoded), longest), pad, dtype=np.int64)  # [20, L], padded with pad_id
    mask = np.zeros_like(ids)
    for row, text in enumerate(encoded):
        ids[row, : len(text)] = np.frombuffer(text, dtype=np.uint8) + offset
        mask[row, : len(text)] = 1
    p_raw, l_raw = _infer(triton, TEXT, "raw", "BYTES", np.array(encoded, dtype=object))
    ids_in, mask_in = (
        http.InferInput("input_ids", list(ids.shape), "INT64"),
        http.InferInput("attention_mask", list(mask.shape), "INT64"),
    )
    ids_in.set_data_from_numpy(ids)
    mask_in.set_data_from_numpy(mask)
    result = triton.infer(TEXT, [ids_in, mask_in])
    assert _labels(result) == l_raw
    np.testing.assert_allclose(result.as_numpy("probabilities"), p_raw, atol=1e-5)
