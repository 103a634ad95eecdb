"""Regenerate docs/ui.png from a live server, and docs/ui.json with the model-card figures it shows.

    .venv/bin/python -m tools.screenshot [--out docs] [--model lara-text-news]

Starts `python -m lara_serve.server` on a free 127.0.0.1 port with the shipped models, sends a few documents of other
lengths through the API (so the page's latency chart has bars), opens /ui in Debian's headless Chromium
(playwright from PyPI drives it; no browser is downloaded), classifies examples/article.txt and saves a
full-page screenshot. Every request the page makes outside loopback is refused. ui.json records the card's
text and the figures in it; tests/docs/test_screenshot.py compares them with model_repository/*/config.json,
so a retrained model with a stale screenshot fails the tests until this script is rerun.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from lara_serve.server.testing import server_process

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
_ACCURACY = re.compile(r"Test accuracy ([0-9.]+)% \(n=(\d+)\)")
_LIMIT = re.compile(r"Takes up to (\d+) (?:UTF-8 bytes|word pieces)")


def card_figures(card_text: str) -> dict[str, Any]:
    """The figures a model card shows, read from its text as the page renders it."""
    figures: dict[str, Any] = {}
    if m := _ACCURACY.search(card_text):
        figures["test_accuracy_pct"], figures["n_test"] = m.group(1), int(m.group(2))
    if m := _LIMIT.search(card_text):
        figures["max_length"] = int(m.group(1))
    return figures


def _loopback_only(route: Any) -> None:
    if urlparse(route.request.url).hostname in ("127.0.0.1", "localhost"):
        route.continue_()
    else:
        route.abort()


def capture(url: str, model: str, out: Path) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    article = (ROOT / "examples" / "article.txt").read_text(encoding="utf-8")
    long_doc = (ROOT / "examples" / "long-document.txt").read_text(encoding="utf-8")
    for length in (300, 1500, 8000):  # the chart shows what the server measured: give it a few lengths
        body = {"instances": [long_doc[:length]]}
        httpx.post(f"{url}/v1/models/{model}:predict", json=body, timeout=120).raise_for_status()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        page = browser.new_page(viewport={"width": 900, "height": 1100})
        page.route("**/*", _loopback_only)
        page.goto(f"{url}/ui?model={model}")
        page.wait_for_selector("#text-input:not([hidden])")
        card = page.locator("#card").inner_text()
        page.fill("#text", article)
        page.click("#classify")
        page.wait_for_selector("#status:text-is('done')", timeout=120_000)
        page.wait_for_selector("#chart rect", timeout=30_000)
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / "ui.png"), full_page=True)
        browser.close()
    record = {"model": model, "card_text": card, **card_figures(card), "input": "examples/article.txt",
              "command": "python -m tools.screenshot"}  # fmt: skip
    (out / "ui.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for ui.png and ui.json")
    p.add_argument("--model", default="lara-text-news", help="the text model whose page is shown")
    args = p.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"error: no Chromium at {CHROMIUM}; install Debian's chromium (make debs, as root)", file=sys.stderr)
        return 1
    with server_process(["--log-level", "warning", "--num-threads", "1"], timeout_s=180) as url:
        record = capture(url, args.model, args.out)
    print(f"wrote {args.out / 'ui.png'} and {args.out / 'ui.json'}: {json.dumps(record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
