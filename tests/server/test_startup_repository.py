"""Start-up with a bad repository is one line and exit 2; a failed load under strict_models is exit 1;
version folders are served by config.json's version_policy (Triton's default: the latest)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lara_serve.server.__main__ import main
from lara_serve.server.errors import ServeError
from lara_serve.server.models import load_repository, refuse_unsupported
from lara_serve.server.repository import TRITON_CONFIG
from lara_serve.server.settings import Settings
from lara_serve.server.synthetic import make_image_model, make_text_model
from lara_serve.server.testing import free_port

NAME = "versioned"


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output  # no traceback, no model-loading log before it
    assert lines[0].startswith("lara-serve: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def versioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NAME with 1/ (seed 0) and 2/ (seed 1: other weights, other logits); config.json as exported."""
    root = tmp_path_factory.mktemp("versioned")
    make_text_model(root, NAME, max_length=64, seed=0)
    other = tmp_path_factory.mktemp("other")
    make_text_model(other, NAME, max_length=64, seed=1)
    shutil.copytree(other / NAME / "1", root / NAME / "2")
    return root


def with_policy(root: Path, tmp: Path, policy: object) -> Path:
    copy = tmp / "repo"
    shutil.copytree(root, copy)
    config = json.loads((copy / NAME / "config.json").read_text())
    (copy / NAME / "config.json").write_text(json.dumps({**config, "version_policy": policy}))
    return copy


def logits(repo: Path) -> tuple[str, np.ndarray]:
    models, failed = load_repository(Settings(model_repository=repo, warmup=False))
    assert not failed, failed
    model = models[NAME]
    try:
        ids = np.arange(1, 33, dtype=np.int64)[None]  # [1, 32]
        out = model.backend.run({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        return model.version, out
    finally:
        model.backend.close()


def test_latest_version_is_served_by_default_and_specific_pins_one(versioned: Path, tmp_path: Path) -> None:
    version, latest = logits(versioned)
    assert version == "2"  # config.json says "version": "1"; Triton's default policy serves the highest folder
    pinned_version, pinned = logits(with_policy(versioned, tmp_path / "a", {"specific": {"versions": [1]}}))
    assert pinned_version == "1"
    assert not np.allclose(latest, pinned)  # the two folders really hold different models
    assert logits(with_policy(versioned, tmp_path / "b", {"latest": {"num_versions": 1}}))[0] == "2"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({"all": {}}, "selects versions [1, 2]; one version per model"),
        ({"latest": {"num_versions": 2}}, "selects versions [1, 2]"),
        ({"specific": {"versions": [3]}}, "names versions [3] that have no folder; it has [1, 2]"),
        ({"newest": {}}, "version_policy must be one of"),
        ({"latest": {"num_versions": 0}}, "num_versions must be an integer >= 1"),
    ],
)
def test_version_policy_errors_are_one_line_exit_2(
    versioned: Path, tmp_path: Path, policy: object, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = with_policy(versioned, tmp_path, policy)
    code = main(["--model-repository", str(repo), "--port", str(free_port())])
    captured = capsys.readouterr()
    assert code == 2 and expected in one_error_line(captured.err + captured.out)


@pytest.fixture(scope="module")
def bad_repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    triton = root / "triton" / "resnet"
    (triton / "1").mkdir(parents=True)
    (triton / TRITON_CONFIG).write_text('name: "resnet"\nplatform: "onnxruntime_onnx"\n')
    broken_json = root / "broken_json"
    make_text_model(broken_json, "t", max_length=64)
    (broken_json / "t" / "config.json").write_text("{not json")
    wrong_task = root / "wrong_task"
    make_text_model(wrong_task, "t", max_length=64)
    config = json.loads((wrong_task / "t" / "config.json").read_text())
    (wrong_task / "t" / "config.json").write_text(json.dumps({**config, "task": "audio"}))
    renamed = root / "renamed"
    make_text_model(renamed, "t", max_length=64)
    (renamed / "t").rename(renamed / "u")
    return {"triton": root / "triton", "broken_json": broken_json, "wrong_task": wrong_task, "renamed": renamed}


@pytest.mark.parametrize(
    ("which", "args", "expected"),
    [
        ("triton", [], "have Triton's config.pbtxt but no config.json"),
        ("triton", ["--models", "resnet"], "models ['resnet'] not in"),
        ("broken_json", [], "unusable model config"),
        ("wrong_task", [], "unusable model config"),
        ("renamed", [], "names the model 't', not 'u'"),
        ("broken_json", ["--models", "nope"], "models ['nope'] not in"),
    ],
)
def test_repository_errors_are_one_line_exit_2(
    bad_repos: dict[str, Path], which: str, args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--model-repository", str(bad_repos[which]), "--port", str(free_port()), *args])
    captured = capsys.readouterr()
    assert code == 2 and expected in one_error_line(captured.err + captured.out)


def test_one_bad_config_among_good_ones_still_serves_the_others_unless_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_text_model(tmp_path, "good", max_length=64)
    make_text_model(tmp_path, "bad", max_length=64)
    (tmp_path / "bad" / "config.json").write_text("{}")
    models, failed = load_repository(Settings(model_repository=tmp_path, warmup=False))
    assert list(models) == ["good"] and "unusable model config" in failed["bad"]  # as before: isolated
    models["good"].backend.close()
    code = main(["--model-repository", str(tmp_path), "--port", str(free_port()), "--strict-models"])
    captured = capsys.readouterr()
    assert code == 2 and "bad/config.json: unusable model config" in one_error_line(captured.err + captured.out)


def test_strict_models_load_failure_is_exit_1_without_traceback(tmp_path: Path) -> None:
    make_text_model(tmp_path, "healthy", max_length=64)
    make_image_model(tmp_path, "corrupt")
    (tmp_path / "corrupt" / "1" / "model.onnx").write_bytes(b"\x08\x07not a protobuf" * 10)
    cmd = [sys.executable, "-m", "lara_serve.server", "--model-repository", str(tmp_path), "--strict-models",
           "--no-warmup", "--port", str(free_port())]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("lara-serve: error: model 'corrupt' failed to load (strict_models=true)")


@pytest.mark.parametrize("params", [{"priority": 1}, {"truncate": "head", "priority": 0}])
def test_priority_is_refused_not_ignored(params: dict[str, object]) -> None:
    with pytest.raises(ServeError, match="parameter 'priority' is not supported") as info:
        refuse_unsupported(params)
    assert info.value.kind.value == "malformed_request"  # 400 in the one status map


def test_other_parameters_pass() -> None:
    refuse_unsupported({"truncate": "head", "binary_data_output": True})
    refuse_unsupported(None)


def test_unreadable_repository_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = Path.iterdir

    def denied(self: Path):  # type: ignore[no-untyped-def]
        if self == tmp_path:  # root reads any folder, so the refusal is simulated
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", denied)
    code = main(["--model-repository", str(tmp_path), "--port", str(free_port())])
    captured = capsys.readouterr()
    assert code == 2 and "cannot read model_repository" in one_error_line(captured.err + captured.out)
    assert "Permission denied" in captured.err


@pytest.mark.anyio
async def test_priority_is_refused_on_every_route(tmp_path: Path) -> None:
    """v1 :predict and :explain, v2 JSON: a request that sets priority gets the 400, others are served."""
    from server_helpers import serve

    from lara_serve.server import Settings
    from lara_serve.server.synthetic import make_text_model

    make_text_model(tmp_path, "prio-text")
    async with serve(Settings(model_repository=tmp_path, warmup=False)) as client:
        v2 = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": ["a text"]}]}
        requests = [
            ("/v1/models/prio-text:predict", {"instances": ["a text"]}),
            ("/v1/models/prio-text:explain", {"instances": ["a text"]}),
            ("/v2/models/prio-text/infer", v2),
        ]
        for url, body in requests:
            assert (await client.post(url, json=body)).status_code == 200, url
            refused = await client.post(url, json={**body, "parameters": {"priority": 1}})
            assert refused.status_code == 400 and "'priority' is not supported" in refused.json()["error"], url
