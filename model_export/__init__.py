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

_MODELS = "lara_serve.model_export.models"
_EXPORTS = {
    f"{_MODELS}.config": ("AttentionConfig", "TextConfig", "ViTConfig"),
    f"{_MODELS}.registry": ("build_model", "create_model", "get_config", "list_models"),
    f"{_MODELS}.hub": ("load_config", "load_pretrained", "make_config_dict", "save_pretrained"),
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
