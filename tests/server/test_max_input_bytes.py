"""max_input_bytes: a model's (config.json) and the server's cap on one input, 413 before decoding."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import httpx
import pytest
from server_helpers import IMAGE, TEXT, png_bytes, serve

from lara_serve.server import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def capped_repo(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test repository with the text model's config.json capping inputs at 100 bytes."""
    root = tmp_path_factory.mktemp("capped") / "repo"
    shutil.copytree(repo, root)
    path = root / TEXT / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_input_bytes": 100}))
    return root


async def test_model_cap_refuses_before_decoding_and_says_the_limit(capped_repo: Path) -> None:
    async with serve(Settings(model_repository=capped_repo, warmup=False)) as c:
        ok = await c.post(f"/v1/models/{TEXT}:predict", json={"instances": ["a" * 100]})
        assert ok.status_code == 200
        # Not even valid UTF-8: refused for its size before the text is decoded (else it would be a 422).
        body = {"instances": ["short", {"b64": base64.b64encode(b"\xff" * 120).decode()}]}
        too_big = await c.post(f"/v1/models/{TEXT}:predict", json=body)
        assert too_big.status_code == 413
        error = too_big.json()["error"]
        assert "input 1 is 120 bytes" in error and "max_input_bytes=100" in error
        # truncate does not lift it: the cap bounds memory, truncation only the tokens that run
        cut = await c.post(f"/v1/models/{TEXT}:classify?truncate=head", content=b"b" * 101,
                           headers={"Content-Type": "text/plain"})  # fmt: skip
        assert cut.status_code == 413
        meta = (await c.get(f"/v2/models/{TEXT}")).json()
        assert meta["parameters"]["max_input_bytes"] == 100
        assert "max_input_bytes" not in (await c.get(f"/v2/models/{IMAGE}")).json()["parameters"]


async def test_server_cap_applies_to_every_model_and_the_smaller_wins(capped_repo: Path) -> None:
    image = png_bytes()
    async with serve(Settings(model_repository=capped_repo, warmup=False, max_input_bytes=len(image) - 1)) as c:
        refused = await c.post(f"/v1/models/{IMAGE}:classify", content=image, headers={"Content-Type": "image/png"})
        assert refused.status_code == 413 and f"max_input_bytes={len(image) - 1}" in refused.json()["error"]
        text = await c.post(f"/v1/models/{TEXT}:predict", json={"instances": ["a" * 101]})
        assert text.status_code == 413 and "max_input_bytes=100" in text.json()["error"]  # config.json's is smaller
        v2 = await c.post(
            f"/v2/models/{TEXT}/infer",
            json={"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": ["a" * 101]}]},
        )
        assert v2.status_code == 413


def test_settings_refuse_a_negative_cap(repo: Path) -> None:
    with pytest.raises(ValueError, match="max_input_bytes"):
        Settings(model_repository=repo, max_input_bytes=-1)


async def test_unset_cap_changes_nothing(repo: Path) -> None:
    async with serve(Settings(model_repository=repo, warmup=False)) as c:
        r = await c.post(f"/v1/models/{TEXT}:predict", json={"instances": ["a" * 200]})
        assert r.status_code == 200
        assert isinstance(c, httpx.AsyncClient)
