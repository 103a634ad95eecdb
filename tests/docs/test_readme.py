"""README.md: short, in the issue's order, and every command in it runs as written.

Each fenced bash or python block is preceded by a marker: `<!-- readme-test: run -->` blocks run here
against a live server with the shipped models on a free 127.0.0.1 port (the README's `localhost:8000` and
`127.0.0.1:8000` become that address); `<!-- readme-test: skip (reason) -->` blocks (make, docker, kubectl,
Ray) are checked for shell syntax only, and must say why they are skipped."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lara_serve.server.testing import server_process

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
_BLOCK = re.compile(r"(?:<!-- readme-test: (run|skip \(([^)]+)\)) -->\n)?```(\w*)\n(.*?)```", re.DOTALL)


def blocks() -> list[tuple[str, str | None, str, str]]:
    """(marker, skip reason, language, code) for every fenced block."""
    return [(m.group(1) or "", m.group(2), m.group(3), m.group(4)) for m in _BLOCK.finditer(README)]


def commands(code: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments and blank lines dropped."""
    joined = code.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_is_short_and_in_order() -> None:
    lines = README.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; at most 250"
    headings = [line for line in lines if line.startswith("## ")]
    order = ["## The two commands", "## Try it", "## Call it", "## Deploy", "## The models", "## Performance",
             "## Documentation"]  # fmt: skip
    assert headings == order
    assert lines.index("## Deploy") < 120  # serve, call and deploy within the first 120 lines
    assert "LARA_PORT" in README and "lean install" in README


def test_every_code_block_is_marked() -> None:
    found = blocks()
    assert len(found) >= 6
    for marker, reason, language, code in found:
        assert language in ("bash", "python"), code[:80]
        assert marker == "run" or (marker.startswith("skip") and reason), f"unmarked block:\n{code[:200]}"
    assert "make serve" in found[0][3] and "make test" in found[0][3]


def test_skipped_blocks_are_valid_shell() -> None:
    for marker, _, language, code in blocks():
        if marker != "run" and language == "bash":
            done = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True, timeout=10)
            assert done.returncode == 0, done.stderr


def test_readme_links_exist() -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with server_process(["--log-level", "warning", "--num-threads", "1"], timeout_s=180) as base:
        yield base


@pytest.mark.slow
def test_runnable_blocks_run_as_written(url: str) -> None:
    address = url.removeprefix("http://")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "LARA_URL": url}
    ran = 0
    for marker, _, language, code in blocks():
        if marker != "run":
            continue
        code = code.replace("localhost:8000", address).replace("127.0.0.1:8000", address)
        if language == "python":
            runs = [[sys.executable, "-c", code]]
        else:
            runs = [["bash", "-c", command] for command in commands(code)]
        for argv in runs:
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{argv[-1]}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            assert '"error"' not in done.stdout, f"{argv[-1]}\n{done.stdout[-2000:]}"
            ran += 1
    assert ran >= 10
