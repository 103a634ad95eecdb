"""What a client should know about a served model before sending it anything: the model card.

One place builds it, so v1 and v2 metadata, GET /info, Triton's model config and the /ui page all say the
same thing: task, labels, which inputs it takes (media types, longest text), the attention it runs, and
the accuracy measured when it was exported (config.json's `metrics`, written by model_export).
"""

from __future__ import annotations

from typing import Any

from lara_serve.server.content_types import IMAGE_TYPES, TEXT_TYPES
from lara_serve.server.models import RAW_INPUT, ServedModel
from lara_serve.server.preprocess import TRUNCATION_SIDES
from lara_serve.server.repository import ImagePreprocessing, TextPreprocessing
from lara_serve.server.schemas import MAX_PASSAGES_RANGE

# What each shipped kind of model was trained on, so a user knows what input gives a meaningful answer.
_SUITS = {
    "text": "English documents of a few hundred bytes or more, like the training corpus (see data); very short "
    "texts (a headline, a sentence) are out of distribution and get unreliable labels",
    # A word-piece model reads through a pretrained encoder that knew English before its head saw the data.
    "text_wordpiece": "English text from a headline or one sentence to a whole document (up to max_length word "
    "pieces, about 4-5 bytes each), on the topics of the training data (see data); other languages, code and "
    "tables alone are out of distribution",
    "image": "one centred object on a plain dark background, greyscale, like the training set (see data); the "
    "image is converted to greyscale and resized to {w}x{h}",
    # A model whose config.json turns the preparation steps on (server.preprocess.prepare_image).
    "image_prepared": "a single object (the shipped model: a garment), centred and filling most of the picture, on "
    "a plain background: light on dark or dark on light, opaque or on a transparent background, any size and "
    "aspect ratio: it is fitted to {w}x{h} keeping its aspect ratio, padded with the background. Unsuited: "
    "several objects, a person wearing the garment, a busy or patterned background",
}
# Pillow's mode "L", the conversion every image model's greyscale input goes through.
GREYSCALE = "ITU-R 601-2 luma (Pillow mode L): L = R * 299/1000 + G * 587/1000 + B * 114/1000"


def media_types(model: ServedModel) -> list[str]:
    return list(TEXT_TYPES if model.config.task == "text" else IMAGE_TYPES)


def preprocessing(model: ServedModel) -> dict[str, Any]:
    """The numbers a client needs to send the preprocessed tensors instead of `raw` and get the same answer.

    Flat keys, so Triton's string-valued config parameters carry each one alone (`parameters.mean`).
    """
    prep = model.config.preprocessing
    if isinstance(prep, TextPreprocessing) and prep.kind == "wordpiece":
        return {
            "preprocessing": "input_ids = [CLS] + the word pieces of the UTF-8 text (tokenizer.json in the model "
            "folder, Hugging Face tokenizers) + [SEP], attention_mask = 1; pad with pad_id (mask 0); more than "
            f"max_length pieces: 413 unless truncate= one of {list(TRUNCATION_SIDES)}",
            "tokenizer": "tokenizer.json",
            "pad_id": prep.pad_id,
            "max_length": prep.max_length,
            "truncation_sides": list(TRUNCATION_SIDES),
        }
    if isinstance(prep, TextPreprocessing):
        return {
            "preprocessing": f"input_ids = UTF-8 bytes + byte_offset, attention_mask = 1; pad with pad_id "
            f"(mask 0); longer than max_length: 413 unless truncate= one of {list(TRUNCATION_SIDES)}",
            "byte_offset": prep.byte_offset,
            "pad_id": prep.pad_id,
            "max_length": prep.max_length,
            "truncation_sides": list(TRUNCATION_SIDES),
        }
    steps = preparation_steps(prep)
    image = "image prepared as `preparation` says, then" if steps else "image"
    return {
        "preprocessing": f"pixel_values = (greyscale({image} resized bilinear to image_size) * pixel_scale - mean) "
        "/ std, float32 [batch, channels, height, width]",
        "image_size": [prep.height, prep.width],
        "channels": prep.channels,
        "color_mode": "L",
        "greyscale": GREYSCALE if prep.channels == 1 else "none: RGB",
        "resize": "bilinear",
        "pixel_scale": 1 / 255,
        "mean": prep.mean,
        "std": prep.std,
        "background": prep.background,
        "composite_alpha": prep.composite_alpha,
        "invert_light_background": prep.invert_light_background,
        "keep_aspect_ratio": prep.keep_aspect_ratio,
        "trim_margins": prep.trim_margins,
        "preparation": steps,
    }


def preparation_steps(prep: ImagePreprocessing) -> list[str]:
    """The preparation config.json turns on, in the order server.preprocess.prepare_image applies it."""
    b, steps = prep.background, []
    if prep.composite_alpha:
        steps.append(
            f"transparency: composited onto grey level {b} (the training background); onto {255 - b} instead when "
            "the visible pixels are themselves on the background's side of mid-grey, so a dark drawing stays visible"
        )
    if prep.invert_light_background:
        steps.append(
            f"inversion: when the median of the one-pixel border is on the other side of mid-grey (127.5) from "
            f"grey level {b}, the image is inverted (255 - x) to the training convention"
        )
    if prep.trim_margins:
        steps.append(
            f"margins trimmed: background (pixels within 32 grey levels of {b}) beyond the object is cut off the longer "
            f"side, down to the {prep.width}:{prep.height} aspect ratio at most, keeping the object centred"
        )
    if prep.keep_aspect_ratio:
        steps.append(
            f"aspect ratio kept: resized to fit inside {prep.width}x{prep.height}, centred, padded with grey level {b}"
        )
    return steps


def describe(model: ServedModel) -> dict[str, Any]:
    """The model card: JSON-ready, without anything secret or host-specific."""
    config = model.config
    extra = config.model_extra or {}
    prep = config.preprocessing
    card: dict[str, Any] = {
        "name": model.name,
        "version": model.version,
        "task": config.task,
        "labels": list(config.labels),
        "backend": model.backend.name,
        "device": model.backend.device,
        **({"attention_kernel": k} if (k := getattr(model.backend, "attention_kernel", None)) else {}),
        "media_types": media_types(model),
        "inputs": {
            RAW_INPUT: "v2 BYTES: one element per item, the encoded file (image) or UTF-8 text; in JSON an image "
            "is a base64 string with the input's parameters.content_type='base64'",
            **{spec.name: f"v2 {spec.datatype} {spec.shape}: preprocessed" for spec in config.inputs},
        },
    }
    card.update(preprocessing(model))
    if isinstance(prep, TextPreprocessing):
        card["max_length"] = prep.max_length
        card["length_unit"] = "word pieces" if prep.kind == "wordpiece" else "UTF-8 bytes"
        card["truncation_sides"] = list(TRUNCATION_SIDES)
        card["suited_inputs"] = _SUITS["text_wordpiece" if prep.kind == "wordpiece" else "text"]
        card["explain"] = {"v1": ":explain", "v2_parameter": "explain", "method": "occlusion",
                           "max_passages": list(MAX_PASSAGES_RANGE)}  # fmt: skip
    elif isinstance(prep, ImagePreprocessing):
        card["image_size"] = [prep.height, prep.width]
        card["channels"] = prep.channels
        suits = "image_prepared" if prep.keep_aspect_ratio and prep.invert_light_background else "image"
        card["suited_inputs"] = _SUITS[suits].format(w=prep.width, h=prep.height)
    attention = extra.get("attention")
    if isinstance(attention, dict):
        card["attention"] = attention
    metrics = extra.get("metrics")
    if isinstance(metrics, dict):
        card["accuracy"] = {k: metrics[k] for k in ("test_accuracy", "val_accuracy", "n_test") if k in metrics}
    data = extra.get("data")
    if isinstance(data, dict):
        card["data"] = data
    # "Not mine": each prediction's ood_score is compared with this threshold (in_distribution).
    ood = extra.get("ood")
    if config.has_ood_output:
        card["ood"] = {"output": "ood_score", **(ood if isinstance(ood, dict) else {})}
        if (threshold := config.ood_threshold_of(model.backend.name)) is not None:
            card["ood"]["threshold"] = threshold  # the one this backend's scores are compared with
    calibration = extra.get("calibration")  # informational: the temperature is already in the logits
    if isinstance(calibration, dict):
        card["calibration"] = calibration
    if (quantized := served_quantization(model)) is not None:
        card["quantization"] = {k: quantized[k] for k in _QUANTIZATION_KEYS if k in quantized}
    return card


def served_quantization(model: ServedModel) -> dict[str, Any] | None:
    """config.json export.quantization when the served graph is the quantized one (onnxruntime reads
    model.onnx, the int8 graph; the torch backend reads the float weights), else None."""
    export = (model.config.model_extra or {}).get("export")
    quantized = export.get("quantization") if isinstance(export, dict) else None
    return quantized if isinstance(quantized, dict) and model.backend.name == "onnxruntime" else None


def weights_dtype(model: ServedModel) -> str:
    """The served weights' dtype as TEI's /info names it: "int8" for a dynamically quantized graph (its
    projections' weights; activations and the other weights stay float32), else "float32"."""
    return "int8" if served_quantization(model) is not None else "float32"


# What the card says of an int8 graph (config.json export.quantization, model_export.export.quantize)
_QUANTIZATION_KEYS = ("weights", "activations", "quantized_matmuls", "float_matmuls")
