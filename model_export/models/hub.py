"""Artifact layout shared with export and the server: <dir>/config.json and <dir>/1/model.safetensors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from lara_serve.model_export.models.config import (
    BertTextConfig,
    ModelConfig,
    TextConfig,
    ViTConfig,
    config_from_dict,
    config_to_dict,
)

TOKENIZER_FILE = "tokenizer.json"  # a wordpiece model's tokenizer (Hugging Face tokenizers), beside config.json

VERSION = "1"
WEIGHTS = "model.safetensors"
# How the server prepares a user's picture into a training convention (server.preprocess.prepare_image reads
# these keys of "preprocessing"; each is off when absent). Fashion-MNIST's convention: a light garment centred
# on black. Not a default of every ViT: a model trained on the user's own photos keeps its pictures as sent.
PREPARATION_KEYS = ("background", "composite_alpha", "invert_light_background", "keep_aspect_ratio", "trim_margins")
LIGHT_ON_BLACK: dict[str, Any] = {
    "background": 0,
    "composite_alpha": True,
    "invert_light_background": True,
    "keep_aspect_ratio": True,
    "trim_margins": True,
}


def model_io_spec(cfg: ModelConfig, preparation: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The "inputs", "outputs" and "preprocessing" sections of config.json for a model config.

    preparation: image models, the PREPARATION_KEYS written into "preprocessing" (e.g. LIGHT_ON_BLACK)."""
    n = cfg.num_classes
    outputs = [{"name": "logits", "datatype": "FP32", "shape": [-1, n]}]
    if isinstance(cfg, ViTConfig):
        s, c = cfg.image_size, cfg.in_chans
        return {
            "task": "image",
            "inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [-1, c, s, s]}],
            "outputs": outputs,
            "preprocessing": {
                "kind": "image",
                "height": s,
                "width": s,
                "channels": c,
                "mean": cfg.mean,
                "std": cfg.std,
                **_preparation(preparation),
            },
        }
    if preparation:
        raise ValueError("preparation keys are for image models")
    if isinstance(cfg, BertTextConfig):
        pre = {"kind": "wordpiece", "max_length": cfg.max_length, "pad_id": 0, "tokenizer": TOKENIZER_FILE}
        return {"task": "text", "inputs": _text_inputs(), "outputs": outputs, "preprocessing": pre}
    if isinstance(cfg, TextConfig):
        pre = {"kind": "bytes", "max_length": cfg.max_length, "pad_id": 0, "byte_offset": 1}
        if cfg.vocab_size != 257:
            pre = {"kind": "tokens", "max_length": cfg.max_length, "pad_id": 0, "vocab_size": cfg.vocab_size}
        return {"task": "text", "inputs": _text_inputs(), "outputs": outputs, "preprocessing": pre}
    raise TypeError(f"unsupported config {type(cfg).__name__}")


def _text_inputs() -> list[dict[str, Any]]:
    return [
        {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
        {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]},
    ]


def _preparation(preparation: Mapping[str, Any] | None) -> dict[str, Any]:
    unknown = sorted(set(preparation or {}) - set(PREPARATION_KEYS))
    if unknown:
        raise ValueError(f"unknown preparation key(s) {unknown}; allowed: {list(PREPARATION_KEYS)}")
    return dict(preparation or {})


def make_config_dict(
    name: str, cfg: ModelConfig, labels: list[str], preparation: Mapping[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """Full config.json dict: name, version, task, labels, io, model, attention, plus extras (seed, data, metrics).
    preparation: an image model's PREPARATION_KEYS (model_io_spec)."""
    if len(labels) != cfg.num_classes:
        raise ValueError(f"{len(labels)} labels for {cfg.num_classes} classes")
    io = model_io_spec(cfg, preparation)
    d: dict[str, Any] = {"name": name, "version": VERSION, "task": io.pop("task"), "labels": list(labels)}
    d.update(io)
    d["model"] = config_to_dict(cfg)
    d["attention"] = dict(vars(cfg.attention))
    d.update(extra)
    return d


def save_pretrained(model: nn.Module, config_dict: dict[str, Any], model_dir: str | Path) -> Path:
    """Write <model_dir>/config.json and <model_dir>/1/model.safetensors (no pickle)."""
    model_dir = Path(model_dir)
    (model_dir / VERSION).mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(model_dir / VERSION / WEIGHTS), metadata={"format": "pt"})
    (model_dir / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
    return model_dir


def load_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a model directory holds config.json and {VERSION}/{WEIGHTS}")
    return json.loads(path.read_text())


def load_pretrained(
    model_dir: str | Path, map_location: str | torch.device = "cpu", serving: bool = False
) -> nn.Module:
    """Rebuild the model from config.json, load 1/model.safetensors strictly, return it in eval mode.

    serving: when the weights also hold the serving head (calibration temperature and out-of-distribution
    score, lara_serve.model_export.models.ood), return the model as it is served, forward -> (logits / T, ood_score);
    otherwise (or without that head) the trained model alone, forward -> logits."""
    from lara_serve.model_export.models.ood import SERVING_KEYS, ServingModel
    from lara_serve.model_export.models.registry import build_model

    conf = load_config(model_dir)
    cfg = config_from_dict(conf["model"], conf["attention"])
    model = build_model(cfg, seed=int(conf.get("seed", 0)))
    state = load_file(str(Path(model_dir) / VERSION / WEIGHTS), device=str(map_location))
    extra = {k: state.pop(k) for k in list(state) if k.startswith("serving.")}
    if extra and not set(SERVING_KEYS) <= set(extra):
        raise ValueError(f"{model_dir}: the serving head needs all of {SERVING_KEYS}, found {sorted(extra)}")
    model.load_state_dict(state, strict=True)
    if serving and extra:
        model = ServingModel.from_state(model, extra)
    return model.to(map_location).eval()
