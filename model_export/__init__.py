"""LARA Serve models: ViT (images) and byte-level text encoders with selectable attention.

Public API: `create_model`, `list_models`, `get_config`, `build_model`, `load_pretrained`,
`save_pretrained`, `make_config_dict`.
"""

from model_export.config import AttentionConfig, TextConfig, ViTConfig
from model_export.hub import load_config, load_pretrained, make_config_dict, save_pretrained
from model_export.registry import build_model, create_model, get_config, list_models

__all__ = [
    "AttentionConfig",
    "TextConfig",
    "ViTConfig",
    "build_model",
    "create_model",
    "get_config",
    "list_models",
    "load_config",
    "load_pretrained",
    "make_config_dict",
    "save_pretrained",
]
