"""tools.device_tree: what a device call would send, and the slim tree around one, on a small git repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tools.device_tree import is_slim, restore, size, slim, travelling


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    files = {"README.md": 100, "model_repository/a/config.json": 50, "model_repository/a/1/model.onnx": 5000,
             "model_repository/b/1/model.safetensors": 3000, "model_repository/b/1/small.onnx": 10}  # fmt: skip
    for name, n in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * n)
    (root / ".gitignore").write_text("/runs/\n")
    (root / "runs").mkdir()
    (root / "runs" / "big.bin").write_bytes(b"y" * 9000)  # ignored: never travels
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    (root / "notes.txt").write_bytes(b"z" * 7)  # untracked, not ignored: travels
    return root


def test_size_counts_tracked_and_untracked_files_git_does_not_ignore(repo: Path) -> None:
    names = {p.relative_to(repo).as_posix() for p in travelling(repo)}
    assert "notes.txt" in names and "runs/big.bin" not in names
    assert size(repo) == 100 + 50 + 5000 + 3000 + 10 + len("/runs/\n") + 7


def test_slim_leaves_large_models_behind_until_restored(repo: Path) -> None:
    before = size(repo)
    out = slim(repo, keep=("model_repository/b/1/model.safetensors",), large=1000)
    assert out == ["model_repository/a/1/model.onnx"] and is_slim(repo)
    assert (repo / "model_repository/a/1/model.onnx").is_file()  # on disk still
    assert size(repo) == before - 5000
    with pytest.raises(SystemExit, match="already slim"):
        slim(repo)
    refused = git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "oops")
    assert refused.returncode != 0 and "tools.device_tree restore" in refused.stderr
    assert restore(repo) == out and not is_slim(repo)
    assert size(repo) == before
    assert git(repo, "status", "--porcelain").stdout == "?? notes.txt\n"  # nothing staged, nothing ignored
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert restore(repo) == []  # idempotent
