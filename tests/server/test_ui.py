"""/docs, /redoc and /ui in headless Debian Chromium (driven by Playwright), with every non-loopback request
blocked: the pages must render from the server alone. The /ui page classifies a real Fashion-MNIST test
image and a real BBC News test article with the shipped models; the result is read from the DOM.

Set LARA_UI_SCREENSHOT=<folder> to keep the screenshots (docs/ui.png in the repository comes from here).
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from lara_serve.server.testing import server_process

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]  # fmt: skip
pytestmark = pytest.mark.slow


def _need(condition: bool, what: str) -> None:
    if not condition:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have {what} (installed by `make test`)")
        pytest.skip(f"{what} not installed")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _need(Path(CHROMIUM).exists(), "Debian chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def shipped_url() -> Iterator[str]:
    with server_process(["--log-level", "warning", "--num-threads", "1"], timeout_s=120) as url:
        yield url


class Offline:
    """A page whose requests may go to loopback only; anything else is aborted and recorded."""

    def __init__(self, browser: Any) -> None:
        self.blocked: list[str] = []
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": 900, "height": 1100})
        self.page.route("**/*", self._route)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def _route(self, route: Any) -> None:
        if urlparse(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()


def screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("LARA_UI_SCREENSHOT", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    return path


def test_swagger_and_redoc_render_offline(browser: Any, shipped_url: str, tmp_path: Path) -> None:
    tab = Offline(browser)
    tab.page.goto(f"{shipped_url}/docs")
    tab.page.wait_for_selector(".opblock", timeout=20_000)
    paths = tab.page.locator(".opblock-summary-path").all_inner_texts()
    for route in ("/v2/models/{name}/infer", "/v1/models/{name}:classify", "/v2/models/{name}/config", "/info"):
        assert any(p.replace("\u200b", "") == route for p in paths), route
    screenshot(tab.page, tmp_path, "docs.png")

    tab.page.goto(f"{shipped_url}/redoc")
    tab.page.wait_for_selector("h1", timeout=20_000)
    tab.page.get_by_text("/v1/models/{name}:classify").first.wait_for(state="attached", timeout=20_000)
    assert tab.blocked == [] and tab.errors == []


def _fashion_png() -> tuple[bytes, str]:
    data = pytest.importorskip("lara_serve.model_export.training.data")
    from PIL import Image

    from lara_serve.model_export.models.registry import FASHION_LABELS

    try:
        images, labels = data.load_fashion("test")
    except data.DataUnavailable as exc:
        _need(False, f"Fashion-MNIST ({exc})")
    buffer = io.BytesIO()
    Image.fromarray(images[0, 0].numpy()).save(buffer, format="PNG")
    return buffer.getvalue(), FASHION_LABELS[int(labels[0])]


def _news_text() -> tuple[str, str]:
    data = pytest.importorskip("lara_serve.model_export.training.data")
    try:
        doc = data.load_news("test")[0]
    except data.DataUnavailable as exc:
        _need(False, f"BBC News ({exc})")
    return doc.text, data.NEWS_CLASSES[doc.label]


def _read_result(page: Any) -> dict[str, Any]:
    page.wait_for_selector("#result:not([hidden])", timeout=30_000)
    rows = page.locator("#scores li")
    return {
        "label": page.inner_text("#top-label"),
        "top_k": [
            (rows.nth(i).get_attribute("data-label"), float(rows.nth(i).get_attribute("data-score") or "nan"))
            for i in range(rows.count())
        ],  # fmt: skip
        "queue": page.inner_text("#queue-ms"),
        "inference": page.inner_text("#inference-ms"),
        "truncated": page.inner_text("#truncated"),
    }


def test_ui_classifies_a_fashion_image_and_a_news_article(browser: Any, shipped_url: str, tmp_path: Path) -> None:
    png, image_label = _fashion_png()
    text, text_label = _news_text()
    tab = Offline(browser)
    page = tab.page
    page.goto(f"{shipped_url}/ui?model=lara-vit-fashion")
    page.wait_for_selector("#image-input:not([hidden])")
    page.set_input_files("#image-file", files=[{"name": "fashion.png", "mimeType": "image/png", "buffer": png}])
    page.click("#classify")
    image = _read_result(page)
    api = httpx.post(f"{shipped_url}/v1/models/lara-vit-fashion:classify", content=png,
                     headers={"Content-Type": "image/png"}, params={"top_k": 3}).json()  # fmt: skip
    assert image["label"] == api["label"] == image_label
    assert [label for label, _ in image["top_k"]] == [t["label"] for t in api["top_k"]]
    assert image["top_k"][0][1] == pytest.approx(api["score"], abs=1e-6)
    assert image["queue"].endswith(" ms") and image["inference"].endswith(" ms")
    screenshot(page, tmp_path, "ui-image.png")

    # Other lengths through the API first: the chart is built from what the server measured, not the page.
    doc = (text * 8).encode()
    for length in (300, 4000, 8000):
        body = {"instances": [doc[:length].decode(errors="ignore")]}
        assert (
            httpx.post(f"{shipped_url}/v1/models/lara-text-news-bytes:predict", json=body, timeout=60).status_code
            == 200
        )
    page.select_option("#model", "lara-text-news-bytes")
    page.wait_for_selector("#text-input:not([hidden])")
    page.fill("#text", text)
    page.click("#classify")
    # Locator waits, not wait_for_function: the page's CSP forbids the eval that one would need.
    page.wait_for_selector("#status:text-is('done')", timeout=30_000)
    news = _read_result(page)
    assert news["label"] == text_label and news["truncated"].startswith("no")
    page.wait_for_selector("#chart rect", timeout=10_000)  # latency-vs-length from the server's /metrics
    bars = page.locator("#chart rect")
    lengths = [int(bars.nth(i).get_attribute("data-length") or 0) for i in range(bars.count())]
    sent = (300, 4000, 8000, len(text.encode()))
    assert lengths == sorted({1 << (n - 1).bit_length() for n in sent})  # each length's power-of-two bucket
    assert "input length in UTF-8 bytes" in page.locator("#chart-note").inner_text()  # the card's length_unit
    screenshot(page, tmp_path, "ui.png")

    page.select_option("#truncate", "false")
    max_length = httpx.get(f"{shipped_url}/v1/models/lara-text-news-bytes").json()["max_length"]
    page.fill("#text", "x" * (max_length + 1))  # one byte too long: refused, and the page says why
    page.click("#classify")
    page.wait_for_selector("#status.error", timeout=30_000)
    assert "413" in page.inner_text("#status")
    assert tab.blocked == [] and tab.errors == []
