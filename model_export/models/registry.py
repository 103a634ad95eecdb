"""A small registry of named model configurations and `create_model(name, **overrides)`."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from lara_serve.model_export.models.bert_lara import LaraBertClassifier
from lara_serve.model_export.models.config import AttentionConfig, BertTextConfig, ModelConfig, TextConfig, ViTConfig
from lara_serve.model_export.models.text import TextEncoder
from lara_serve.model_export.models.vit import ViT

FASHION_LABELS = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
NEWS_LABELS = ["business", "entertainment", "politics", "sport", "tech"]
GENRE_LABELS = ["press", "general", "learned", "fiction"]  # lara_serve.model_export.training.brown.GENRES

# Convolutional (relative) positions + mixed-length training: accuracy holds from 1 KB to 64 KB.
_NEWS = TextConfig(
    max_length=65536,
    dim=128,
    depth=2,
    heads=4,
    ngram_buckets=16381,
    positions="conv",
    dropout=0.1,
    attention=AttentionConfig(kind="lara", num_landmarks=16),
)

_VIT = ViTConfig(
    patch_size=2,
    stem_channels=32,
    stem_layers=2,
    stem_grid_layers=2,
    mlp_dwconv=True,
    dim=64,
    depth=2,
    heads=2,
    mlp_ratio=2.0,
    attention=AttentionConfig(kind="lara", num_landmarks=49),
)

# What the tiny text model changes of the news architecture (tests and smoke runs).
_TINY_TEXT: dict[str, Any] = {
    "max_length": 8192, "dim": 16, "depth": 1, "heads": 2, "mlp_ratio": 1.0, "ngram_buckets": 97, "conv_kernel": 3,
    "dropout": 0.0, "attention": AttentionConfig(kind="lara", num_landmarks=4),
}  # fmt: skip

# One row per registered model: its configuration, its labels and the data set it trains on.
_MODELS: dict[str, tuple[ModelConfig, list[str], str]] = {
    "lara-vit-fashion": (_VIT, FASHION_LABELS, "fashion"),
    "lara-text-news-bytes": (_NEWS, NEWS_LABELS, "news"),
    # Brown corpus genres, 12-15 KB documents served whole: the news architecture, more dropout, 4 classes.
    "lara-text-genre": (dataclasses.replace(_NEWS, dropout=0.2, num_classes=4), GENRE_LABELS, "brown"),
    # all-MiniLM-L6-v2 converted to LARA in every layer (model_export/pretrained), a linear head on its embedding
    "lara-text-news": (BertTextConfig(), NEWS_LABELS, "news"),
    # Tiny configurations for tests and smoke runs.
    "tiny-vit": (
        dataclasses.replace(
            _VIT, stem_channels=8, stem_layers=1, stem_grid_layers=0, mlp_dwconv=False, dim=16, depth=1, mlp_ratio=1.0
        ),
        FASHION_LABELS,
        "fashion",
    ),
    "tiny-text": (
        dataclasses.replace(_NEWS, **_TINY_TEXT),
        NEWS_LABELS,
        "news",
    ),
}
_REGISTRY: dict[str, ModelConfig] = {name: cfg for name, (cfg, _, _) in _MODELS.items()}
LABELS = {name: labels for name, (_, labels, _) in _MODELS.items()}
DATASETS = {name: dataset for name, (_, _, dataset) in _MODELS.items()}


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """Registered config with overrides; `attention="softmax"` (a kind) or an AttentionConfig/dict."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown model {name!r}; registered: {list_models()}")
    cfg = _REGISTRY[name]
    att = overrides.pop("attention", None)
    if isinstance(att, str):
        att = dataclasses.replace(cfg.attention, kind=att)
    elif isinstance(att, dict):
        att = dataclasses.replace(cfg.attention, **att)
    if att is not None:
        overrides["attention"] = att
    return dataclasses.replace(cfg, **overrides)


def build_model(cfg: ModelConfig, seed: int = 0) -> nn.Module:
    if isinstance(cfg, ViTConfig):
        return ViT(cfg, seed=seed)
    if isinstance(cfg, TextConfig):
        return TextEncoder(cfg, seed=seed)
    if isinstance(cfg, BertTextConfig):
        return LaraBertClassifier(cfg, seed=seed)
    raise TypeError(f"no model class for config {type(cfg).__name__}")


def create_model(name: str, seed: int = 0, **overrides: Any) -> nn.Module:
    """Build a registered model, e.g. create_model("lara-vit-fashion", attention="performer", depth=2)."""
    return build_model(get_config(name, **overrides), seed=seed)
