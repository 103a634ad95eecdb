"""The shipped text models through a real `python -m server` on 127.0.0.1, at 64 KB: served whole, refused
one byte past max_length with the options named, truncated on request and said so."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from model_export.data import DataUnavailable, load_news
from model_export.long_docs import make_composites
from server.testing import server_process

REPO = Path(__file__).resolve().parents[2] / "model_repository"
NEWS = "lara-text-news"
MAX = 65536
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def composites() -> list[tuple[bytes, int]]:
    try:
        docs = load_news("test")
    except DataUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the BBC corpus installed by `make test`: {e}")
        pytest.skip(str(e))
    return make_composites([d.text for d in docs], [d.label for d in docs], MAX, per_class=1)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    env = {"LARA_MODEL_REPOSITORY": str(REPO), "LARA_MAX_QUEUE_DELAY_MS": "1", "LARA_NUM_THREADS": "2"}
    with server_process(["--log-level", "warning"], env=env) as u:
        yield u


def test_metadata_says_64k(url: str) -> None:
    for path in (f"/v1/models/{NEWS}", f"/v2/models/{NEWS}"):
        body = httpx.get(url + path, timeout=10).json()
        assert body.get("max_length", body.get("parameters", {}).get("max_length")) == MAX


def test_64k_documents_served_whole(url: str, composites: list[tuple[bytes, int]]) -> None:
    labels = httpx.get(f"{url}/v1/models/{NEWS}", timeout=10).json()["labels"]
    texts = [raw.decode("utf-8", "ignore") for raw, _ in composites[:3]]
    r = httpx.post(f"{url}/v1/models/{NEWS}:predict", json={"instances": texts}, timeout=120)
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    assert not any(p["truncated"] for p in preds)
    right = sum(p["label"] == labels[y] for p, (_, y) in zip(preds, composites[:3], strict=True))
    assert right >= 2, preds  # the benchmark measures accuracy; this checks the path returns sense


def test_one_byte_over_is_413_and_truncation_is_reported(url: str, composites: list[tuple[bytes, int]]) -> None:
    raw = composites[0][0] + b"x"
    headers = {"content-type": "text/plain"}
    refused = httpx.post(f"{url}/v1/models/{NEWS}:classify", content=raw, headers=headers, timeout=60)
    assert refused.status_code == 413 and str(MAX) in refused.json()["error"] and "head+tail" in refused.json()["error"]
    for side in ("head", "tail", "head+tail"):
        r = httpx.post(f"{url}/v1/models/{NEWS}:classify?truncate={side}", content=raw, headers=headers, timeout=60)
        assert r.status_code == 200 and r.json()["truncated"] is True
