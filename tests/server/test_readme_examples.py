"""The README's curl examples: each parses as the shell reads it (tests/docs/test_readme.py runs them against
a live server with the shipped models). (A stray apostrophe once ended a single-quoted JSON body mid-sentence; `bash -n` did not notice,
because the next command's quote closed it.)"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.anyio

README = Path(__file__).resolve().parents[2] / "README.md"
NEWS = "lara-text-news"


def curl_commands() -> list[tuple[list[str], str]]:
    """(argv, the `# -> ...` line after it or "") for every curl command in the README's bash blocks."""
    out: list[tuple[list[str], str]] = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        logical = re.sub(r"\\\n\s*", " ", block).splitlines()  # join continued lines
        for i, line in enumerate(logical):
            if line.lstrip().startswith("curl "):
                nxt = logical[i + 1].strip() if i + 1 < len(logical) else ""
                out.append((shlex.split(line, comments=True), nxt if nxt.startswith("# ->") else ""))
    return out


def json_bodies() -> list[tuple[str, dict, str]]:
    """(url path, JSON body, documented answer) of every curl command that posts a JSON body with -d."""
    found = []
    for argv, answer in curl_commands():
        if "-d" in argv:
            url = next(a for a in argv if "localhost:" in a or "127.0.0.1:" in a)
            found.append((url.split(":8000", 1)[1], json.loads(argv[argv.index("-d") + 1]), answer))
    return found


def test_every_curl_json_body_is_one_shell_word_of_valid_json() -> None:
    bodies = json_bodies()  # json.loads raises on a body the shell cut short
    assert len(bodies) >= 2
    paths = [p for p, _, _ in bodies]
    assert f"/v1/models/{NEWS}:predict" in paths and f"/v2/models/{NEWS}/infer" in paths
