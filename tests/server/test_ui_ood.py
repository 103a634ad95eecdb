"""/ui in headless Chromium (Playwright), offline, with synthetic models: the "not like the training data" badge
and the ood_score row follow the server's answer, and Explain colours the passages of a text, the three that
raised the label most outlined, the first of them inside the article hidden in filler."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from test_explain import ARTICLE_WORDS, FILLER_WORDS, sentences
from test_ui import Offline, browser, screenshot  # noqa: F401 - browser: test_ui's Chromium fixture, one per module

from lara_serve.server.synthetic import ENGLISH, make_image_model, make_text_model
from lara_serve.server.testing import server_process

pytestmark = pytest.mark.slow
OOD_TEXT, OOD_IMAGE, TRIGGER_TEXT = "ood-text", "ood-image", "trigger-text"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("ui_ood_repo")
    make_text_model(repo, OOD_TEXT, max_length=8192, ood=True)
    make_image_model(repo, OOD_IMAGE, ood=True)
    make_text_model(repo, TRIGGER_TEXT, max_length=8192, trigger=b"zqxj", trigger_label=2)
    # A long timeout: until issue 36's fixed cost per batch lands, the batcher's per-token estimate learnt from
    # one-byte texts refuses the 17 runs of a 3 KB explanation as a (false) 504.
    env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_NUM_THREADS": "1", "LARA_REQUEST_TIMEOUT_S": "3600"}
    with server_process(["--log-level", "warning"], env=env) as u:
        yield u


def _classify_text(page: Any, text: str) -> None:
    page.fill("#text", text)
    page.click("#classify")
    page.wait_for_selector("#status:text-is('done')", timeout=30_000)


def test_badge_follows_in_distribution(browser: Any, url: str, tmp_path: Path) -> None:  # noqa: F811 - the imported fixture
    tab = Offline(browser)
    page = tab.page
    page.goto(f"{url}/ui?model={OOD_TEXT}")
    page.wait_for_selector("#text-input:not([hidden])")
    _classify_text(page, "a")
    api = httpx.post(
        f"{url}/v1/models/{OOD_TEXT}:classify", content=b"a", headers={"content-type": "text/plain"}
    ).json()
    assert api["in_distribution"] is False
    assert page.is_visible("#ood-badge") and "Not like the training data" in page.inner_text("#ood-badge")
    assert float(page.inner_text("#ood-score").split()[0]) == pytest.approx(api["ood_score"], rel=1e-3)
    assert "not like the training data" in page.inner_text("#ood-score")
    screenshot(page, tmp_path, "ui-ood.png")
    _classify_text(page, ENGLISH[2].decode())
    assert not page.is_visible("#ood-badge") and "(like the training data)" in page.inner_text("#ood-score")

    noise = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8), mode="L").save(noise, "PNG")
    page.select_option("#model", OOD_IMAGE)
    page.wait_for_selector("#image-input:not([hidden])")
    assert not page.is_visible("#explain")  # images do not explain
    page.set_input_files("#image-file", files=[{"name": "n.png", "mimeType": "image/png", "buffer": noise.getvalue()}])
    page.click("#classify")
    page.wait_for_selector("#status:text-is('done')", timeout=30_000)
    assert page.is_visible("#ood-badge")
    page.select_option("#model", TRIGGER_TEXT)  # a model without ood_score: no badge, says it has none
    _classify_text(page, "a")
    assert not page.is_visible("#ood-badge") and "has none" in page.inner_text("#ood-score")
    assert tab.blocked == [] and tab.errors == []


def test_explain_highlights_the_article(browser: Any, url: str, tmp_path: Path) -> None:  # noqa: F811 - the imported fixture
    before = sentences(FILLER_WORDS, 30, seed=1) + "\n\n"
    article = sentences(ARTICLE_WORDS, 16, seed=2) + "\n\n"
    text = before + article + sentences(FILLER_WORDS, 30, seed=3)
    start, end = len(before.encode()), len((before + article).encode())
    tab = Offline(browser)
    page = tab.page
    page.goto(f"{url}/ui?model={TRIGGER_TEXT}")
    page.wait_for_selector("#text-input:not([hidden])")
    page.fill("#text", text)
    page.click("#explain")
    page.wait_for_selector("#status:text-matches('^(done|HTTP|request failed)')", timeout=30_000)
    assert page.inner_text("#status") == "done", (page.inner_text("#status"), tab.errors)
    assert page.is_visible("#explanation")
    spans = page.locator("#passages .passage")
    api = httpx.post(f"{url}/v1/models/{TRIGGER_TEXT}:explain", json={"instances": [text]}).json()["explanations"][0]
    assert spans.count() == len(api["passages"]) and page.inner_text("#explained-label") == api["label"] == "sports"
    assert "".join(spans.nth(i).inner_text() for i in range(spans.count())).split() == text.split()
    first = page.locator("#passages .passage.top[data-rank='1']")
    assert start <= int(first.get_attribute("data-start") or -1) and int(first.get_attribute("data-end") or 0) <= end
    assert page.locator("#passages .passage.top").count() == 3
    # coloured by log-odds on one absolute scale (full at 3 units), so the colour shows the real effect
    top_api = max(api["passages"], key=lambda p: p["log_odds"] or 0.0)
    assert float(first.get_attribute("data-log-odds") or "nan") == pytest.approx(top_api["log_odds"], rel=1e-6)
    shown = float((first.get_attribute("style") or "").rsplit(",", 1)[-1].strip(" );"))
    assert shown == pytest.approx(0.7 * min(1.0, abs(top_api["log_odds"]) / 3.0), abs=1e-3)
    colours = {spans.nth(i).get_attribute("style") or "" for i in range(spans.count())}
    assert any("rgba(46, 160, 67" in c for c in colours) and any("rgba(207, 34, 46" in c for c in colours)
    screenshot(page, tmp_path, "ui-explain.png")
    assert tab.blocked == [] and tab.errors == []
