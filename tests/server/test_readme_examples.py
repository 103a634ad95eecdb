"""The README's curl examples: each parses as the shell reads it, and the documented answers are the shipped
model's. (A stray apostrophe once ended a single-quoted JSON body mid-sentence; `bash -n` did not notice,
because the next command's quote closed it.)"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from server_helpers import serve

from server import Settings
from server.settings import DEFAULT_MODEL_REPOSITORY

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


@pytest.mark.skipif(not (DEFAULT_MODEL_REPOSITORY / NEWS / "config.json").is_file(), reason="no shipped text model")
async def test_documented_answers_are_the_shipped_models() -> None:
    settings = Settings(model_repository=DEFAULT_MODEL_REPOSITORY, models=[NEWS], max_queue_delay_ms=1.0)
    bodies = json_bodies()
    v2 = next(b for p, b, _ in bodies if p.endswith("/infer"))
    checked = 0
    async with serve(settings) as c:
        for path, body, answer in bodies:
            response = await c.post(path, json=body)
            assert response.status_code == 200, response.text
            if path.endswith(":predict"):
                got = response.json()["predictions"][0]
                documented = re.search(r'"label":"(\w+)","score":([0-9.]+?)\.*,', answer)
                assert documented, f"{path}: no documented answer after the command"
                assert got["label"] == documented[1]
                assert f"{got['score']:.6f}".startswith(documented[2])  # the digits the README prints
                assert v2["inputs"][0]["data"] == body["instances"]  # v1 and v2 examples send the same text
                checked += 1
            else:
                assert response.json()["outputs"][1]["data"] == ["business"]
                checked += 1
    assert checked >= 2
