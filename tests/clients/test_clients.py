"""The client library, the CLI and the load tester against a live loopback server."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lara_serve.clients import LaraClient, LaraError
from lara_serve.server.synthetic import IMAGE_LABELS, TEXT_LABELS

API_KEY = "client-test-key"  # as in conftest.py


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (28, 28), color=200).save(buffer, format="PNG")
    return buffer.getvalue()


def test_library_v1_v2_classify(live_url: str) -> None:
    with LaraClient(live_url, api_key=API_KEY) as client:
        assert client.is_live() and client.is_ready()
        assert client.models() == ["tiny-image", "tiny-text"]
        assert client.model_info("tiny-text")["task"] == "text"
        texts = ["business news", "a match report " * 5]
        predictions = client.predict("tiny-text", texts, top_k=2)
        assert [p.label in TEXT_LABELS for p in predictions] == [True, True] and len(predictions[0].top_k) == 2
        assert client.predict("tiny-image", [png()])[0].label in IMAGE_LABELS
        assert client.classify("tiny-text", "business news").label == predictions[0].label
        assert client.classify("tiny-image", png(), "image/png").label in IMAGE_LABELS
        assert float(client.last_headers["x-total-time-ms"]) > 0
        binary, as_json = (
            client.infer("tiny-text", [t.encode() for t in texts]),
            client.infer("tiny-text", [t.encode() for t in texts], binary=False),
        )
        np.testing.assert_array_equal(binary.probabilities, as_json.probabilities)
        assert binary.labels == [p.label for p in predictions]
        with pytest.raises(LaraError) as info:
            client.predict("tiny-text", ["x" * 500])
        assert info.value.status == 413 and "truncat" in info.value.message
        assert client.predict("tiny-text", ["x" * 500], truncate=True)[0].label in TEXT_LABELS
    with LaraClient(live_url) as anonymous, pytest.raises(LaraError) as info:
        anonymous.models()
    assert info.value.status == 401


def test_cli_predict(live_url: str, data_dir: Path) -> None:
    (data_dir / "a.txt").write_text("stocks rallied on earnings")
    (data_dir / "b.txt").write_text("the striker scored twice")
    (data_dir / "c.png").write_bytes(png())
    base = [sys.executable, "-m", "lara_serve.clients", "--url", live_url, "--api-key", API_KEY, "predict"]
    out = subprocess.run([*base, "--json", "--model", "tiny-text", str(data_dir / "a.txt"), str(data_dir / "b.txt")],
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    lines = [json.loads(line) for line in out.splitlines()]
    assert [Path(line["file"]).name for line in lines] == ["a.txt", "b.txt"]
    assert all(line["label"] in TEXT_LABELS for line in lines)
    image = subprocess.run([*base, "--json", "--model", "tiny-image", str(data_dir / "c.png")],
                           capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    assert json.loads(image)["label"] in IMAGE_LABELS
    missing = subprocess.run([*base, "--model", "nope", str(data_dir / "a.txt")], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    assert missing.returncode == 1 and "404" in missing.stderr
