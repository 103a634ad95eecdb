"""Preprocessing pinned against independent references: vocabulary and mask boundaries, byte ids, image
grayscale / bilinear resize / normalisation computed by hand in numpy, the decode budget, softmax."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from server_helpers import MAX_LENGTH, TEXT

from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.preprocess import (
    IDS,
    MASK,
    PIXELS,
    DecodeBudget,
    collate,
    image_item,
    image_items_from_tensors,
    softmax,
    text_item,
    text_items_from_tensors,
)
from lara_serve.server.repository import ImagePreprocessing, ModelConfig, TextPreprocessing, read_config

VOCAB = 257  # the synthetic text model: 256 byte values + padding id 0


@pytest.fixture(scope="module")
def text_config(repo: Path) -> ModelConfig:
    config = read_config(repo / TEXT)
    assert config.vocab_size == VOCAB
    return config


def tensors(ids: list[list[int]], mask: list[list[int]] | None = None) -> dict[str, np.ndarray]:
    out = {IDS: np.array(ids, dtype=np.int64)}
    if mask is not None:
        out[MASK] = np.array(mask, dtype=np.int64)
    return out


# -- text: ids, vocabulary, mask -----------------------------------------------------------------------


def test_vocabulary_bounds_are_inclusive_of_zero_and_exclusive_of_the_size(text_config: ModelConfig) -> None:
    (item,) = text_items_from_tensors(tensors([[0, VOCAB - 1]]), text_config, None)
    assert item.arrays[IDS].tolist() == [0, VOCAB - 1] and item.length == 2
    for bad, shown in ((VOCAB, f"got [5, {VOCAB}]"), (-1, "got [-1, 5]")):
        with pytest.raises(ServeError) as info:
            text_items_from_tensors(tensors([[bad, 5]]), text_config, None)
        assert info.value.kind is ErrorKind.INVALID_INPUT
        assert f"must be in [0, {VOCAB})" in info.value.message and shown in info.value.message


def test_zeros_inside_a_mask_row_are_kept_and_trailing_padding_dropped(text_config: ModelConfig) -> None:
    rows = text_items_from_tensors(
        tensors([[7, 8, 9, 0, 0], [4, 5, 6, 7, 8]], [[1, 0, 1, 0, 0], [1, 1, 1, 1, 1]]), text_config, None
    )
    assert rows[0].arrays[IDS].tolist() == [7, 8, 9] and rows[0].arrays[MASK].tolist() == [1, 0, 1]
    assert rows[0].length == 3 and not rows[0].truncated
    assert rows[1].arrays[MASK].tolist() == [1] * 5 and rows[1].length == 5
    (no_mask,) = text_items_from_tensors(tensors([[3, 0, 0]]), text_config, None)  # no mask: all tokens real
    assert no_mask.arrays[MASK].tolist() == [1, 1, 1] and no_mask.length == 3


@pytest.mark.parametrize(
    ("mask", "words"), [([[1, 2]], "only 0 and 1"), ([[0, 0]], "at least one 1"), ([[1, -1]], "only 0 and 1")]
)
def test_bad_masks_are_refused(text_config: ModelConfig, mask: list[list[int]], words: str) -> None:
    with pytest.raises(ServeError, match=words) as info:
        text_items_from_tensors(tensors([[5, 6]], mask), text_config, None)
    assert info.value.kind is ErrorKind.INVALID_INPUT


def test_mask_shape_and_empty_rows_are_refused(text_config: ModelConfig) -> None:
    with pytest.raises(ServeError, match=r"both be \[batch, length\]"):
        text_items_from_tensors(tensors([[5, 6]], [[1, 1, 1]]), text_config, None)
    with pytest.raises(ServeError, match="length >= 1"):
        text_items_from_tensors({IDS: np.zeros((1, 0), dtype=np.int64)}, text_config, None)


def test_tensor_rows_at_and_over_max_length(text_config: ModelConfig) -> None:
    (at,) = text_items_from_tensors(tensors([[5] * MAX_LENGTH]), text_config, None)
    assert at.length == MAX_LENGTH and not at.truncated
    over = tensors([[1 + i % 200 for i in range(MAX_LENGTH + 1)]])
    with pytest.raises(ServeError) as info:
        text_items_from_tensors(over, text_config, None)
    assert info.value.kind is ErrorKind.TOO_LARGE and f"has {MAX_LENGTH + 1} tokens" in info.value.message
    (tail,) = text_items_from_tensors(over, text_config, "tail")
    assert tail.arrays[IDS].tolist() == [1 + i % 200 for i in range(1, MAX_LENGTH + 1)] and tail.truncated
    # The mask is cut on the same side as the ids: a zero near the head moves with the cut.
    mask = [[1, 1, 0] + [1] * (MAX_LENGTH - 2)]
    (head,) = text_items_from_tensors({**over, MASK: np.array(mask)}, text_config, "head")
    (tail,) = text_items_from_tensors({**over, MASK: np.array(mask)}, text_config, "tail")
    assert head.arrays[MASK].tolist()[:4] == [1, 1, 0, 1] and tail.arrays[MASK].tolist()[:3] == [1, 0, 1]
    assert len(head.arrays[MASK]) == len(tail.arrays[MASK]) == MAX_LENGTH


def test_text_bytes_become_offset_ids_and_the_limit_is_inclusive() -> None:
    prep = TextPreprocessing(kind="bytes", max_length=4, byte_offset=1)
    item = text_item("aé".encode(), prep, None)  # 3 bytes: 0x61, 0xc3, 0xa9
    assert item.arrays[IDS].tolist() == [0x62, 0xC4, 0xAA] and item.arrays[MASK].tolist() == [1, 1, 1]
    assert item.arrays[IDS].dtype == np.int64 and item.length == 3 and not item.truncated
    assert text_item(b"abcd", prep, None).length == 4  # exactly max_length: accepted as it is
    with pytest.raises(ServeError) as info:
        text_item(b"abcde", prep, None)
    assert info.value.kind is ErrorKind.TOO_LARGE and "has 5 tokens" in info.value.message
    cut = text_item(b"abcde", prep, "tail")
    assert cut.arrays[IDS].tolist() == [ord(c) + 1 for c in "bcde"] and cut.truncated and cut.length == 4


@pytest.mark.parametrize(("data", "words"), [(b"", "must not be empty"), (b"\xff\xfe", "must be UTF-8")])
def test_text_that_is_empty_or_not_utf8_is_refused(data: bytes, words: str) -> None:
    prep = TextPreprocessing(kind="bytes", max_length=4)
    with pytest.raises(ServeError, match=words) as info:
        text_item(data, prep, None)
    assert info.value.kind is ErrorKind.INVALID_INPUT


def test_collate_pads_with_pad_id_and_mask_zero(text_config: ModelConfig) -> None:
    rows = text_items_from_tensors(tensors([[9, 8, 7], [6, 0, 0]], [[1, 0, 1], [1, 0, 0]]), text_config, None)
    batch = collate(rows, text_config)
    assert batch[IDS].tolist() == [[9, 8, 7], [6, 0, 0]] and batch[MASK].tolist() == [[1, 0, 1], [1, 0, 0]]
    assert batch[IDS].dtype == np.int64 and batch[MASK].dtype == np.int64


# -- images: a hand-computed reference -----------------------------------------------------------------

PREP = ImagePreprocessing(kind="image", height=28, width=28, mean=0.3, std=0.2)


def _bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of a triangle filter, widened by the scale when shrinking (antialiasing)."""
    scale = n_in / n_out
    width = max(scale, 1.0)
    centers = (np.arange(n_out) + 0.5) * scale  # [n_out], in input pixel units
    w = np.clip(1.0 - np.abs((np.arange(n_in)[None, :] + 0.5 - centers[:, None]) / width), 0.0, None)
    return w / w.sum(axis=1, keepdims=True)


def reference(gray: np.ndarray, prep: ImagePreprocessing) -> np.ndarray:
    """uint8 [H, W] -> bilinear resize (rows, then columns, 8-bit after each pass) -> (x/255 - mean) / std."""
    x = np.clip(np.round(gray.astype(np.float64) @ _bilinear_weights(gray.shape[1], prep.width).T), 0, 255)
    x = np.clip(np.round(_bilinear_weights(gray.shape[0], prep.height) @ x), 0, 255)  # [height, width]
    return (x / 255.0 - prep.mean) / prep.std


def encode(array: np.ndarray, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt)
    return buffer.getvalue()


def test_colour_image_is_converted_with_the_luma_weights_and_normalised() -> None:
    rgb = np.random.default_rng(1).integers(0, 256, size=(28, 28, 3), dtype=np.uint8)
    r, g, b = (rgb[..., i].astype(np.int64) for i in range(3))
    luma = (r * 299 + g * 587 + b * 114 + 500) // 1000  # ITU-R 601-2, rounded
    item = image_item(encode(rgb), PREP, max_pixels=10_000)
    assert item.length == 1 and item.arrays[PIXELS].shape == (1, 28, 28) and item.arrays[PIXELS].dtype == np.float32
    np.testing.assert_allclose(item.arrays[PIXELS][0], (luma / 255.0 - 0.3) / 0.2, rtol=0, atol=1e-5)


@pytest.mark.parametrize("size", [(5, 7), (64, 48), (3, 100)])
def test_resize_is_bilinear_against_a_hand_computed_reference(size: tuple[int, int]) -> None:
    gray = np.random.default_rng(size[0]).integers(0, 256, size=size, dtype=np.uint8)
    got = image_item(encode(gray), PREP, max_pixels=10_000).arrays[PIXELS][0]
    # Pillow rounds in fixed point: one grey level apart from the float reference at most.
    np.testing.assert_allclose(got, reference(gray, PREP), rtol=0, atol=1.01 / 255 / PREP.std)


def test_image_limits_and_bad_data() -> None:
    gray = np.zeros((10, 10), dtype=np.uint8)
    assert image_item(encode(gray), PREP, max_pixels=100).length == 1  # exactly the limit
    with pytest.raises(ServeError) as info:
        image_item(encode(gray), PREP, max_pixels=99)
    assert info.value.kind is ErrorKind.TOO_LARGE and "10x10" in info.value.message
    with pytest.raises(ServeError, match="cannot decode") as bad:
        image_item(b"not an image at all", PREP, max_pixels=100)
    assert bad.value.kind is ErrorKind.INVALID_INPUT
    with pytest.raises(ServeError, match="cannot decode"):
        image_item(encode(gray, "TIFF"), PREP, max_pixels=100)  # not on the allow-list


def test_decode_budget_is_back_to_zero_after_success_and_failure() -> None:
    budget = DecodeBudget(capacity=1000)
    good = encode(np.full((20, 20), 7, dtype=np.uint8))
    truncated = good[: len(good) // 2]  # the header parses (size known), the pixel data does not
    image_item(good, PREP, max_pixels=10_000, budget=budget)
    with pytest.raises(ServeError, match="cannot decode"):
        image_item(truncated, PREP, max_pixels=10_000, budget=budget)
    # Everything held was handed back: the whole capacity can be taken at once without waiting.
    taker = threading.Thread(target=budget.acquire, args=(1000,), daemon=True)
    taker.start()
    taker.join(timeout=2)
    assert not taker.is_alive(), "the decode budget leaked: a full-capacity acquire blocks"


def test_pixel_tensors_are_checked() -> None:
    config = ModelConfig(
        name="img", task="image", labels=["a"], preprocessing=PREP,
        inputs=[{"name": PIXELS, "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
        outputs=[{"name": "probabilities", "datatype": "FP32", "shape": [-1, 1]}],
    )  # fmt: skip
    ok = image_items_from_tensors({PIXELS: np.ones((2, 1, 28, 28), dtype=np.float64)}, config)
    assert len(ok) == 2 and ok[1].arrays[PIXELS].dtype == np.float32 and ok[1].length == 1
    assert collate(ok, config)[PIXELS].shape == (2, 1, 28, 28)
    with pytest.raises(ServeError, match=r"\[batch, 1, 28, 28\]"):
        image_items_from_tensors({PIXELS: np.ones((1, 28, 28), dtype=np.float32)}, config)
    with pytest.raises(ServeError, match="finite"):
        image_items_from_tensors({PIXELS: np.full((1, 1, 28, 28), np.inf, dtype=np.float32)}, config)


# -- softmax -------------------------------------------------------------------------------------------


def test_softmax_is_finite_and_exact_at_large_logits() -> None:
    logits = np.array([[1e3, -1e3, 999.0], [-1e3, -1e3, -1e3], [0.0, np.log(3.0), 0.0]], dtype=np.float32)
    probs = softmax(logits)
    assert probs.dtype == np.float32 and np.isfinite(probs).all()
    e = np.exp(-1.0)
    expected = [[1 / (1 + e), 0.0, e / (1 + e)], [1 / 3] * 3, [0.2, 0.6, 0.2]]
    np.testing.assert_allclose(probs, expected, rtol=1e-6, atol=1e-7)
    assert softmax(logits[1:2]).tobytes() == probs[1:2].tobytes()  # same row -> same bits, whatever the batch
