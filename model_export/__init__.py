"""LARA Serve models: ViT (images) and byte-level text encoders with selectable attention, and how they are
trained, given a serving head and exported. The rooms: models/, training/, pretrained/, head/, export/ and
your_data/ (`lara train`); each room's docstring says what lives there and what it may import.

Public API (imported on first use): `create_model`, `list_models`, `get_config`, `build_model`,
`load_pretrained`, `save_pretrained`, `make_config_dict`, `load_config` and the config classes.
"""

from __future__ import annotations

if __name__ == "model_export":  # imported by the folder's bare name from the repository root: not ours to answer
    from lara_serve._package import defer_to_installed

    defer_to_installed(__name__, __file__)

from lara_serve._package import lazy_exports

_HOMES = {
    "AttentionConfig": "lara_serve.model_export.models.config",
    "TextConfig": "lara_serve.model_export.models.config",
    "ViTConfig": "lara_serve.model_export.models.config",
    "build_model": "lara_serve.model_export.models.registry",
    "create_model": "lara_serve.model_export.models.registry",
    "get_config": "lara_serve.model_export.models.registry",
    "list_models": "lara_serve.model_export.models.registry",
    "load_config": "lara_serve.model_export.models.hub",
    "load_pretrained": "lara_serve.model_export.models.hub",
    "make_config_dict": "lara_serve.model_export.models.hub",
    "save_pretrained": "lara_serve.model_export.models.hub",
}
__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
