"""examples/: the quick-start script against a live loopback server with the shipped models, and the
files the README uses (present, of the kind they claim, the long document reproducible)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from lara_serve.server.testing import free_port, server_process

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
REPO = ROOT / "model_repository"


def test_example_files_are_what_the_readme_says() -> None:
    article = (EXAMPLES / "article.txt").read_text(encoding="utf-8")
    assert 2_000 <= len(article.encode()) <= 8_000
    long_doc = (EXAMPLES / "long-document.txt").read_bytes()
    assert 40_000 <= len(long_doc) <= 65_536  # long, yet within the text models' 65,536 bytes
    with Image.open(EXAMPLES / "ankle-boot.png") as image:
        assert image.size == (28, 28) and image.mode == "L"
    done = subprocess.run([sys.executable, str(EXAMPLES / "make_long_document.py"), "--check"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(not (REPO / "lara-text-news").is_dir(), reason="no shipped models in model_repository/")
def test_quickstart_against_a_live_server() -> None:
    env = {"LARA_MODELS": "lara-text-news,lara-vit-fashion", "LARA_NUM_THREADS": "1"}
    with server_process(["--log-level", "warning"], env=env, timeout_s=120) as url:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "quickstart.py"), url], capture_output=True, text=True, timeout=180, cwd="/"
        )  # fmt: skip  (cwd: the script must not rely on it)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{url} serves lara-text-news, lara-vit-fashion")
    assert any(line.startswith("article.txt: business") for line in lines)
    assert any(line.startswith("long-document.txt: business") for line in lines)
    assert any(line.startswith("ankle-boot.png: Ankle boot") for line in lines)


def test_quickstart_says_when_no_server_answers() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), url], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 1 and "cannot reach" in done.stderr and "make serve" in done.stderr
