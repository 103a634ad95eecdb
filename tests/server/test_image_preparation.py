"""Image preparation (server.preprocess.prepare_image): each step on small synthetic images, the identity on a
Fashion-MNIST-like input, a model without the new config.json keys served exactly as before, and the shipped
model's card and answers through a live server (tritonclient)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from lara_serve.server.model_card import GREYSCALE, preprocessing
from lara_serve.server.preprocess import PIXELS, image_item, prepare_image
from lara_serve.server.repository import ImagePreprocessing, read_config

REPO = Path(__file__).resolve().parents[2] / "model_repository"
IMAGE = "lara-vit-fashion"
STEPS = {"composite_alpha": True, "invert_light_background": True, "keep_aspect_ratio": True, "trim_margins": True}
OLD = ImagePreprocessing(kind="image", height=28, width=28, mean=0.286, std=0.353)  # a config.json of before
NEW = OLD.model_copy(update={"background": 0, **STEPS})
MAX_PIXELS = 1 << 20


def png(array: np.ndarray, mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


def garment(h: int = 28, w: int = 28, seed: int = 0) -> np.ndarray:
    """Light on black like Fashion-MNIST: a textured blob that touches no border."""
    rng = np.random.default_rng(seed)
    x = np.zeros((h, w), dtype=np.uint8)
    x[3 : h - 3, 5 : w - 5] = rng.integers(90, 256, (h - 6, w - 10), dtype=np.uint8)
    return x


def prepared(data: bytes, prep: ImagePreprocessing = NEW) -> np.ndarray:
    return np.asarray(prepare_image(Image.open(io.BytesIO(data)), prep))


def old_pipeline(data: bytes) -> np.ndarray:
    """What image_item did before the preparation steps existed: convert to L, stretch bilinearly."""
    image = Image.open(io.BytesIO(data)).convert("L").resize((28, 28), Image.Resampling.BILINEAR)
    return ((np.asarray(image, dtype=np.float32) / 255.0 - np.float32(0.286)) / np.float32(0.353))[None]


# -- each step -----------------------------------------------------------------------------------------


def test_a_dark_square_on_white_is_inverted_to_light_on_black() -> None:
    x = np.full((28, 28), 255, dtype=np.uint8)
    x[8:20, 8:20] = 40
    got = prepared(png(x))
    np.testing.assert_array_equal(got, 255 - x)
    assert got[0, 0] == 0 and got[14, 14] == 215


def test_a_light_background_is_inverted_in_rgb_too() -> None:
    rgb = np.full((28, 28, 3), 250, dtype=np.uint8)
    rgb[10:18, 10:18] = (200, 30, 30)
    got = prepared(png(rgb), NEW.model_copy(update={"channels": 3}))
    np.testing.assert_array_equal(got, 255 - rgb)


def test_transparent_background_equals_the_composited_image() -> None:
    light = garment()
    rgba = np.zeros((28, 28, 4), dtype=np.uint8)
    rgba[..., :3] = (0, 200, 255)  # colour where it is transparent must not matter
    inside = light > 0
    rgba[inside, :3] = light[inside, None]
    rgba[..., 3] = np.where(inside, 255, 0)
    np.testing.assert_array_equal(prepared(png(rgba, "RGBA")), light)  # onto black: the garment itself
    # The old path drops alpha: the cyan "background" shows through as grey.
    assert old_pipeline(png(rgba, "RGBA"))[0, 0, 0] > 0


def test_alpha_as_the_garment_composites_exactly() -> None:
    x = garment(seed=1)
    white = np.dstack([np.full_like(x, 255)] * 3 + [x])  # white ink, alpha = the garment
    np.testing.assert_array_equal(prepared(png(white, "RGBA")), x)
    black = np.dstack([np.zeros_like(x)] * 3 + [x])  # black ink: onto white, then the border is inverted
    np.testing.assert_array_equal(prepared(png(black, "RGBA")), x)


def test_a_fully_transparent_image_is_all_background() -> None:
    clear = np.zeros((10, 10, 4), dtype=np.uint8)
    clear[..., :3] = 255
    assert not prepared(png(clear, "RGBA")).any()


def test_a_tall_image_is_padded_not_stretched() -> None:
    x = np.zeros((40, 20), dtype=np.uint8)  # 20 wide, 40 high
    x[:, :] = 100  # all content (darker than mid-grey: not inverted), so it shows where the image lies
    got = prepared(png(x))
    cols = np.flatnonzero(got.any(axis=0))
    assert got.shape == (28, 28)
    assert (cols.min(), cols.max()) == (7, 20)  # 14 of 28 columns: the 1:2 ratio kept, centred
    assert got[:, :7].max() == 0 and got[:, 21:].max() == 0 and got[:, 7:21].min() == 100
    stretched = old_pipeline(png(x))
    assert np.unique(stretched).size == 1  # the old path fills the frame with the content


def test_a_square_stays_square_in_a_wide_image() -> None:
    x = np.zeros((40, 80), dtype=np.uint8)
    x[10:30, 30:50] = 255  # a 20x20 square
    for trim, side in ((False, (7, 8)), (True, (14,))):  # 80 -> 28: scale 0.35; trimmed to 40x40 first: 0.7
        got = prepared(png(x), NEW.model_copy(update={"trim_margins": trim}))
        rows, cols = np.flatnonzero(got.max(axis=1) > 127), np.flatnonzero(got.max(axis=0) > 127)
        assert abs(len(rows) - len(cols)) <= 1 and len(rows) in side


def test_margins_beyond_the_aspect_ratio_are_trimmed_around_the_object() -> None:
    x = garment(seed=2)
    tall = np.zeros((40, 28), dtype=np.uint8)
    tall[6:34] = x  # padded with background to 28 wide x 40 high
    np.testing.assert_array_equal(prepared(png(tall)), x)  # trimmed back to the garment's own frame
    no_trim = prepared(png(tall), NEW.model_copy(update={"trim_margins": False}))
    assert np.flatnonzero(no_trim.any(axis=0)).size < np.flatnonzero(x.any(axis=0)).size  # shrunk into padding
    low = np.zeros((60, 28), dtype=np.uint8)
    low[60 - 28 :] = x  # the object at the bottom: the window follows it
    np.testing.assert_array_equal(prepared(png(low)), x)
    wide = np.full((28, 50), 255, dtype=np.uint8)
    wide[:, 11:39] = 255 - x  # dark on white, wide: inverted, then trimmed to the garment's columns
    np.testing.assert_array_equal(prepared(png(wide)), x)


def test_a_long_strip_is_fitted_without_a_large_canvas() -> None:
    got = prepared(png(np.full((1, 20_000), 100, dtype=np.uint8)))
    assert got.shape == (28, 28) and np.flatnonzero(got.any(axis=1)).tolist() == [13] and got[13].min() == 100


def test_dark_background_image_passes_unchanged_bit_for_bit() -> None:
    for seed in range(5):
        data = png(garment(seed=seed))
        new = image_item(data, NEW, MAX_PIXELS).arrays[PIXELS]
        old = image_item(data, OLD, MAX_PIXELS).arrays[PIXELS]
        assert new.dtype == old.dtype and new.tobytes() == old.tobytes()


def test_fashion_mnist_images_pass_unchanged() -> None:
    data = pytest.importorskip("lara_serve.model_export.training.data")
    try:
        images, _ = data.load_fashion("test")
    except data.DataUnavailable as exc:
        pytest.skip(str(exc))
    for im in images[::250].numpy():  # 40 images across the classes
        raw = png(im[0])
        assert image_item(raw, NEW, MAX_PIXELS).arrays[PIXELS].tobytes() == old_pipeline(raw).tobytes()


# -- a model without the keys --------------------------------------------------------------------------


def test_without_the_keys_every_step_is_off_and_images_are_treated_as_before(tmp_path: Path) -> None:
    config = json.loads((REPO / IMAGE / "config.json").read_text())
    for key in ("background", *STEPS):
        config["preprocessing"].pop(key)
    (tmp_path / IMAGE).mkdir()
    (tmp_path / IMAGE / "config.json").write_text(json.dumps(config))
    prep = read_config(tmp_path / IMAGE).preprocessing
    assert prep == OLD and not any(getattr(prep, step) for step in STEPS)
    white = np.full((28, 28), 255, dtype=np.uint8)
    white[5:20, 5:20] = 0
    rgba = np.dstack([np.full((28, 28), 255, dtype=np.uint8)] * 3 + [garment()])
    for data in (png(white), png(rgba, "RGBA"), png(garment(40, 20)), png(garment(17, 63))):
        np.testing.assert_array_equal(image_item(data, prep, MAX_PIXELS).arrays[PIXELS], old_pipeline(data))


def test_card_without_the_keys_says_what_it_said() -> None:
    card = preprocessing(SimpleNamespace(config=SimpleNamespace(preprocessing=OLD)))  # type: ignore[arg-type]
    assert card["preprocessing"].startswith("pixel_values = (greyscale(image resized bilinear to image_size)")
    assert card["preparation"] == [] and card["greyscale"] == GREYSCALE


def test_shipped_model_turns_every_step_on_and_its_card_states_them() -> None:
    prep = read_config(REPO / IMAGE).preprocessing
    assert isinstance(prep, ImagePreprocessing)
    assert prep.background == 0 and all(getattr(prep, step) is True for step in STEPS)
    card = preprocessing(SimpleNamespace(config=SimpleNamespace(preprocessing=prep)))  # type: ignore[arg-type]
    steps = card["preparation"]
    assert [s.split(":")[0] for s in steps] == ["transparency", "inversion", "margins trimmed", "aspect ratio kept"]
    assert "299/1000" in card["greyscale"] and "`preparation`" in card["preprocessing"]


# -- live: the shipped model through tritonclient ------------------------------------------------------

http = pytest.importorskip("tritonclient.http")


@pytest.fixture(scope="module")
def triton() -> Iterator[object]:
    from lara_serve.server.testing import server_process

    env = {"LARA_MODEL_REPOSITORY": str(REPO), "LARA_NUM_THREADS": "1", "LARA_MODELS": IMAGE}
    with server_process(["--log-level", "warning", "--no-warmup"], env=env, timeout_s=180) as url:
        yield http.InferenceServerClient(url=url.removeprefix("http://"))


def _infer(triton: object, raws: list[bytes]) -> tuple[np.ndarray, list[str]]:
    tensor = http.InferInput("raw", [len(raws)], "BYTES")
    tensor.set_data_from_numpy(np.array(raws, dtype=object), binary_data=True)
    outputs = [http.InferRequestedOutput("probabilities"), http.InferRequestedOutput("label")]
    result = triton.infer(IMAGE, [tensor], outputs=outputs)
    labels = [v.decode() if isinstance(v, bytes) else str(v) for v in result.as_numpy("label")]
    return result.as_numpy("probabilities"), labels


def _garments() -> np.ndarray:
    try:
        from lara_serve.model_export.training.data import load_fashion

        return load_fashion("test")[0][:12, 0].numpy()  # uint8 [12, 28, 28]
    except Exception:  # no data package: synthetic light-on-black images still compare the two paths
        return np.stack([garment(seed=s) for s in range(12)])


def test_metadata_states_the_preparation(triton: object) -> None:
    params = triton.get_model_metadata(IMAGE)["parameters"]
    assert params["keep_aspect_ratio"] is True and params["background"] == 0 and len(params["preparation"]) == 4
    assert "fitted to 28x28 keeping its aspect ratio" in params["suited_inputs"]
    config = triton.get_model_config(IMAGE)["parameters"]
    assert json.loads(config["invert_light_background"]["string_value"]) is True


def test_dark_on_light_and_transparent_garments_get_the_answers_of_the_originals(triton: object) -> None:
    x = _garments()
    p_clean, l_clean = _infer(triton, [png(im) for im in x])
    p_dark, l_dark = _infer(triton, [png(255 - im) for im in x])
    clear = [png(np.dstack([np.full_like(im, 255)] * 3 + [im]), "RGBA") for im in x]
    p_clear, l_clear = _infer(triton, clear)
    assert l_dark == l_clean and l_clear == l_clean
    np.testing.assert_array_equal(p_dark, p_clean)  # the preparation recovers the very same pixels
    np.testing.assert_array_equal(p_clear, p_clean)
