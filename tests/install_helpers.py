"""A fresh virtualenv with the project built from a copy of its sources: the install tests' common start.

The sources are copied first, so a build writes nothing into the working tree; the venv has no pip of its
own (ensurepip alone takes 30 s on a loaded machine): the caller's pip installs into it with `--python`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from lara_serve.server.settings import REPO_ROOT

SOURCES = ("pyproject.toml", "README.md", "lara_serve", "server", "clients", "kernels", "model_export")


def copy_sources(root: Path) -> Path:
    """SOURCES copied to root/src (no caches, no egg-info); returns that folder, ready for `pip install`."""
    src = root / "src"
    for name in SOURCES:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    return src


def bare_venv(path: Path) -> Path:
    """A new venv at `path` without pip; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path / "bin" / "python"
