"""docs/ui.png must show the served models as they are: the card figures captured with it (docs/ui.json,
written by tools/screenshot.py in the same run) must equal model_repository/<model>/config.json's. After a
retraining this fails until `python -m tools.screenshot` is rerun."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import Image

from tools.screenshot import CHROMIUM, card_figures

ROOT = Path(__file__).resolve().parents[2]


def expected(model: str) -> dict[str, object]:
    config = json.loads((ROOT / "model_repository" / model / "config.json").read_text())
    metrics = config["metrics"]
    return {
        "test_accuracy_pct": f"{100 * metrics['test_accuracy']:.1f}",  # as the page rounds it (server/ui/app.js)
        "n_test": metrics["n_test"],
        "max_length": config["preprocessing"]["max_length"],
    }


def test_the_screenshot_shows_the_served_model_card() -> None:
    shot = json.loads((ROOT / "docs" / "ui.json").read_text())
    figures = {k: shot[k] for k in ("test_accuracy_pct", "n_test", "max_length")}
    assert figures == expected(shot["model"]), "docs/ui.png is stale: rerun `python -m tools.screenshot`"
    assert card_figures(shot["card_text"]) == figures  # the figures are the ones in the captured text
    with Image.open(ROOT / "docs" / "ui.png") as image:
        assert image.width >= 800 and image.height >= 600


def test_card_figures_are_read_from_the_page_text() -> None:
    text = "Labels: a, b. Takes up to 4096 UTF-8 bytes. Test accuracy 91.3% (n=250). Attention: lara."
    assert card_figures(text) == {"test_accuracy_pct": "91.3", "n_test": 250, "max_length": 4096}
    pieces = text.replace("4096 UTF-8 bytes", "262144 word pieces")  # a word-piece model's card
    assert card_figures(pieces) == {"test_accuracy_pct": "91.3", "n_test": 250, "max_length": 262144}
    assert card_figures("Labels: a, b.") == {}


@pytest.mark.slow
def test_the_script_regenerates_the_screenshot(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("CI must have Debian chromium (installed by `make test`)")
        pytest.skip("Debian chromium not installed (make test installs it)")
    pytest.importorskip("playwright.sync_api")
    from tools.screenshot import main

    assert main(["--out", str(tmp_path)]) == 0
    shot = json.loads((tmp_path / "ui.json").read_text())
    assert {k: shot[k] for k in ("test_accuracy_pct", "n_test", "max_length")} == expected(shot["model"])
    assert (tmp_path / "ui.png").stat().st_size > 20_000
