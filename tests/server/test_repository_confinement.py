"""The repository never reaches outside itself, and config.json's values are bounded before anything is
sized by them (issue 50, item 7). Refusals name the file and the rule, never what a refused file holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from lara_serve.server.repository import (
    MAX_IMAGE_SIDE,
    MAX_TEXT_LENGTH,
    ONNX_FILE,
    RepositoryError,
    served_config,
)
from lara_serve.server.synthetic import make_image_model, make_text_model

SECRET = "s3cr3t-value-from-outside"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """(repository with a text and an image model, a folder beside it holding a model of its own)."""
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    make_text_model(repo, "text")
    make_image_model(repo, "image")
    make_text_model(outside, "vdir")  # a servable model, outside the repository
    return repo, outside


def edit(model_dir: Path, **changes: Any) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if key in ("max_length", "height", "width"):
            config["preprocessing"][key] = value
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def refusal(name: str, model_dir: Path) -> str:
    with pytest.raises(RepositoryError) as caught:
        served_config(name, model_dir)
    return str(caught.value)


@pytest.mark.parametrize("version", ["../../outside/vdir/1", "../image/1", "/etc", "..", "1/../../image/1", ""])
def test_version_that_is_a_path_is_refused(layout: tuple[Path, Path], version: str) -> None:
    repo, _ = layout
    for folder in [p for p in (repo / "text").iterdir() if p.is_dir()]:  # no numeric folder: config.json's version
        folder.rename(repo / "text" / f"v{folder.name}")
    edit(repo / "text", version=version)
    assert "version: Value error, must be one folder name" in refusal("text", repo / "text")


def test_symlinked_config_leading_outside_is_refused_without_echo(layout: tuple[Path, Path]) -> None:
    repo, outside = layout
    stolen = json.loads((outside / "vdir" / "config.json").read_text())
    stolen.update(name="text", labels=SECRET, api_token=SECRET)  # a wrong field would quote its value
    (outside / "other.json").write_text(json.dumps(stolen))
    (repo / "text" / "config.json").unlink()
    (repo / "text" / "config.json").symlink_to(outside / "other.json")
    message = refusal("text", repo / "text")
    assert "leads outside the model repository" in message and "config.json" in message
    assert SECRET not in message and "other.json" not in message


def test_symlinked_version_folder_or_artifact_leading_outside_is_refused(layout: tuple[Path, Path]) -> None:
    repo, outside = layout
    version = served_config("text", repo / "text").version
    shutil.rmtree(repo / "text" / version)
    (repo / "text" / version).symlink_to(outside / "vdir" / "1")
    assert "leads outside the model repository" in refusal("text", repo / "text")
    (repo / "text" / version).unlink()
    (repo / "text" / version).mkdir()
    (repo / "text" / version / ONNX_FILE).symlink_to(outside / "vdir" / "1" / ONNX_FILE)
    assert f"{ONNX_FILE}: leads outside the model repository" in refusal("text", repo / "text")


def test_symlinks_inside_the_repository_still_work(layout: tuple[Path, Path]) -> None:
    repo, _ = layout
    version = served_config("text", repo / "text").version
    onnx = repo / "text" / version / ONNX_FILE
    shutil.move(onnx, repo / "shared.onnx")
    onnx.symlink_to(repo / "shared.onnx")
    assert served_config("text", repo / "text").name == "text"


@pytest.mark.parametrize(
    ("model", "field", "value", "rule"),
    [
        ("text", "max_length", 2**40, f"less than or equal to {MAX_TEXT_LENGTH}"),
        ("image", "height", 40000, f"less than or equal to {MAX_IMAGE_SIDE}"),
        ("image", "width", 40000, f"less than or equal to {MAX_IMAGE_SIDE}"),
    ],
)
def test_config_values_over_their_bounds_are_refused(
    layout: tuple[Path, Path], model: str, field: str, value: int, rule: str
) -> None:
    repo, _ = layout
    edit(repo / model, **{field: value})
    message = refusal(model, repo / model)
    assert field in message and rule in message and str(value) not in message


def test_the_shipped_bounds_still_load(layout: tuple[Path, Path]) -> None:
    repo, _ = layout
    edit(repo / "text", max_length=MAX_TEXT_LENGTH)  # the shipped long-document models take 1 MiB
    assert served_config("text", repo / "text").preprocessing.max_length == MAX_TEXT_LENGTH  # type: ignore[union-attr]
