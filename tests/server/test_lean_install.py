"""The serving install: a plain `pip install .` in a fresh venv has no torch, and `lara-serve` serves the
shipped models with it (`lara` classifies with the same venv).

Slow (one pip install into a new venv, from pip's cache when `make setup` filled it): the venv is built
once per run. The sources are copied first, so the build writes nothing into the working tree.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lara_serve.server.settings import REPO_ROOT
from lara_serve.server.testing import server_process
from tests.install_helpers import bare_venv, copy_sources

pytestmark = pytest.mark.slow
HEAVY = ("torch", "triton", "onnx", "onnxscript", "safetensors", "matplotlib", "pytest", "sklearn", "tritonclient")


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


@pytest.fixture(scope="module")
def lean_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("lean")
    src = copy_sources(root)
    venv = root / "venv"
    t0 = time.monotonic()
    # --no-compile: the .pyc files are written on first import instead; neither changes what is installed.
    python = bare_venv(venv)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-compile", "--disable-pip-version-check", str(src)], check=True, timeout=600)  # fmt: skip
    print(f"serving install: {time.monotonic() - t0:.1f} s, {_size_mb(venv):.0f} MB")
    yield venv


def test_no_torch_or_dev_tools(lean_venv: Path) -> None:
    probe = f"import importlib.util as u, json; print(json.dumps([m for m in {list(HEAVY)!r} if u.find_spec(m)]))"
    found = subprocess.run([str(lean_venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                           check=True, timeout=60)  # fmt: skip
    assert json.loads(found.stdout) == []
    assert (lean_venv / "bin" / "lara-serve").exists() and (lean_venv / "bin" / "lara").exists()
    assert _size_mb(lean_venv) < 300  # measured 170 MB here (230 MB with pip and .pyc files); [dev]: 2.3 GB


def test_lara_train_says_how_to_get_the_training_extra(lean_venv: Path, tmp_path: Path) -> None:
    done = subprocess.run([str(lean_venv / "bin" / "lara"), "train", "data.jsonl", "--out", str(tmp_path / "m")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "pip install 'lara-serve[train]'" in done.stderr, done.stderr
    assert not (tmp_path / "m").exists()


def test_lara_serve_serves_the_shipped_models(lean_venv: Path, tmp_path: Path) -> None:
    args = ["--model-repository", str(REPO_ROOT / "model_repository"), "--num-threads", "1", "--log-level", "warning"]
    serve = [str(lean_venv / "bin" / "lara-serve")]
    with server_process(args, command=serve, cwd=str(tmp_path), timeout_s=120) as url:
        text = tmp_path / "sport.txt"
        text.write_text(
            "Arsenal beat Chelsea 2-1 in the Premier League on Saturday. The striker scored twice in the second "
            "half and the manager praised his defence after the match. The win lifts the club to second in the "
            "table, three points behind the leaders, with the cup final against Liverpool next week."
        )
        done = subprocess.run([str(lean_venv / "bin" / "lara"), "--url", url, "predict", "--json", "--model",
                               "lara-text-news-bytes", str(text)], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["label"] == "sport"
        metadata = httpx.get(f"{url}/v2/models/lara-vit-fashion").json()
        assert metadata["parameters"]["image_size"] == [28, 28]
        assert httpx.get(f"{url}/docs").status_code == 200  # the offline docs come with the lean install
