"""config.json's image preparation keys (model_export.models.hub): written for the Fashion-MNIST ViT, so a
retrained or re-exported model keeps what the server's prepare_image reads; absent for other models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lara_serve.model_export.models import hub
from lara_serve.model_export.models.registry import LABELS, get_config
from lara_serve.server.repository import ImagePreprocessing

SHIPPED = Path(__file__).resolve().parents[2] / "model_repository" / "lara-vit-fashion" / "config.json"


def test_vit_config_carries_the_preparation_the_server_reads() -> None:
    conf = hub.make_config_dict("v", get_config("lara-vit-fashion"), LABELS["lara-vit-fashion"],
                                preparation=hub.LIGHT_ON_BLACK, seed=0)  # fmt: skip
    pre = conf["preprocessing"]
    assert {k: pre[k] for k in hub.PREPARATION_KEYS} == hub.LIGHT_ON_BLACK
    parsed = ImagePreprocessing.model_validate(pre)
    assert parsed.invert_light_background and parsed.trim_margins and parsed.keep_aspect_ratio
    assert parsed.composite_alpha and parsed.background == 0
    assert "preparation" not in conf  # an argument, not an extra section


def test_shipped_preparation_is_what_retraining_writes() -> None:
    shipped = json.loads(SHIPPED.read_text())["preprocessing"]
    assert {k: shipped[k] for k in hub.PREPARATION_KEYS if k in shipped} == hub.LIGHT_ON_BLACK


def test_without_preparation_the_keys_stay_off_and_bad_ones_are_named() -> None:
    plain = hub.model_io_spec(get_config("lara-vit-fashion"))["preprocessing"]
    assert not set(hub.PREPARATION_KEYS) & set(plain)  # a user's own photos are served as sent
    with pytest.raises(ValueError, match=r"unknown preparation key\(s\) \['invert'\]; allowed"):
        hub.model_io_spec(get_config("lara-vit-fashion"), {"invert": True})
    with pytest.raises(ValueError, match="for image models"):
        hub.model_io_spec(get_config("tiny-text"), hub.LIGHT_ON_BLACK)
