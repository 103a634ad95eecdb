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

from clients import LaraClient, LaraError
from clients.loadtest import check_loopback, make_doc
from clients.loadtest import main as loadtest_main
from server.synthetic import IMAGE_LABELS, TEXT_LABELS

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
    base = [sys.executable, "-m", "clients", "--url", live_url, "--api-key", API_KEY, "predict"]
    out = subprocess.run([*base, "--model", "tiny-text", str(data_dir / "a.txt"), str(data_dir / "b.txt")],
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    lines = [json.loads(line) for line in out.splitlines()]
    assert [Path(line["file"]).name for line in lines] == ["a.txt", "b.txt"]
    assert all(line["label"] in TEXT_LABELS for line in lines)
    image = subprocess.run([*base, "--model", "tiny-image", str(data_dir / "c.png")],
                           capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    assert json.loads(image)["label"] in IMAGE_LABELS
    missing = subprocess.run([*base, "--model", "nope", str(data_dir / "a.txt")], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    assert missing.returncode == 1 and "404" in missing.stderr


def test_loadtest_writes_bounded_results(live_url: str, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    args = ["--url", live_url, "--model", "tiny-text", "--api-key", API_KEY, "--concurrency", "1,4",
            "--doc-bytes", "64,128", "--requests", "20", "--seconds", "5", "--out", str(out)]  # fmt: skip
    assert loadtest_main(args) == 0
    report = json.loads(out.read_text())
    assert [(c["doc_bytes"], c["concurrency"]) for c in report["cells"]] == [(64, 1), (64, 4), (128, 1), (128, 4)]
    for cell in report["cells"]:
        assert cell["requests"] == 20 and cell["errors"] == 0 and cell["throughput_rps"] > 0
        assert 0 < cell["p50_ms"] <= cell["p99_ms"]


def test_loadtest_is_loopback_only() -> None:
    for url in ("http://127.0.0.1:8000", "http://localhost:1", "http://127.3.2.1"):
        check_loopback(url)
    for url in ("http://10.0.0.1:8000", "http://example.com", "http://[2001:db8::1]/"):
        with pytest.raises(ValueError, match="loopback"):
            check_loopback(url)
    assert len(make_doc(2048, 0).encode()) == 2048 and make_doc(100, 1) == make_doc(100, 1)
