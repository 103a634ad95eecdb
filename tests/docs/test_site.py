"""The documentation site builds with `mkdocs build --strict` (a broken link or anchor fails it), every page
of the nav exists, and the generated settings table lists every server setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from lara_serve.server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def nav_pages(nav: list) -> list[str]:
    out: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            out += nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_nav_page_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = nav_pages(config["nav"])
    assert {"index.md", "serving.md", "models.md", "long-documents.md", "performance.md", "deploy.md"} <= set(pages)
    missing = [p for p in pages if not (ROOT / "docs" / p).is_file()]
    assert not missing, f"nav names pages that do not exist: {missing}"


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    serving = (site / "serving" / "index.html").read_text()
    for name in Settings.model_fields:
        assert f"LARA_{name.upper()}" in serving, f"settings table lacks {name}"
    # figures that live outside docs/ are published with the site
    assert (site / "repo" / "research" / "results" / "gap_power.png").is_file()
    assert (site / "index.html").is_file()
