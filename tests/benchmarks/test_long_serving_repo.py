"""`benchmarks.long_serving --before REV` serves the model as commit REV shipped it: its graph AND its
config.json (today's config declares an ood_score output that graphs before issue 35 lack)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.long_serving import _repo_at
from tests.digests import sha256

ROOT = Path(__file__).resolve().parents[2]
BEFORE_OOD = "c2e11b4"  # the last commit whose byte news model (then lara-text-news) had one output


def test_before_repo_pairs_the_old_graph_with_its_own_config(tmp_path: Path) -> None:
    try:
        subprocess.run(["git", "cat-file", "-e", f"{BEFORE_OOD}^{{commit}}"], cwd=ROOT, check=True, capture_output=True)
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip(f"commit {BEFORE_OOD} is not in this clone's history (shallow clone)")
    repo = _repo_at(BEFORE_OOD, "lara-text-news-bytes", tmp_path)
    model = repo / "lara-text-news-bytes"
    old_config = json.loads((model / "config.json").read_text())
    today = json.loads((ROOT / "model_repository" / "lara-text-news-bytes" / "config.json").read_text())
    assert [o["name"] for o in old_config["outputs"]] == ["logits"]
    assert [o["name"] for o in today["outputs"]] == ["logits", "ood_score"]
    shipped = subprocess.run(
        ["git", "show", f"{BEFORE_OOD}:model_repository/lara-text-news/1/model.onnx"], cwd=ROOT, capture_output=True
    ).stdout
    assert sha256(model / "1" / "model.onnx") == sha256(shipped)
    assert (model / "1" / "model.onnx").read_bytes() != (
        ROOT / "model_repository/lara-text-news-bytes/1/model.onnx"
    ).read_bytes()
