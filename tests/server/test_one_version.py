"""Every answer from one model version's files (issue 50, item 9): the long-document torch forward, made at
the first long document, refuses model files that changed on disk since the model was loaded; the
fallback warning suggests installing `[train]` only when torch or model_export is what is missing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from server_helpers import TEXT

from lara_serve.server.backends import BackendUnavailable, OrtOptions, create_backend, onnx_runtime, pytorch
from lara_serve.server.repository import ONNX_FILE, TORCH_FILE, read_config

REAL_TORCH_BACKEND = pytorch.TorchBackend


class FakeTorch:
    """Stands in for TorchBackend: records that the weights were read."""

    made = 0

    def __init__(self, *args: Any) -> None:
        FakeTorch.made += 1

    def close(self) -> None:
        pass


@pytest.fixture
def model_dir(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(repo / TEXT, tmp_path / TEXT)
    monkeypatch.setattr(pytorch, "TorchBackend", FakeTorch)
    FakeTorch.made = 0
    return tmp_path / TEXT


def test_unchanged_files_are_loaded(model_dir: Path) -> None:
    long = onnx_runtime._TorchForLong(model_dir, read_config(model_dir), 0)
    assert long.get() is not None and FakeTorch.made == 1 and long.unavailable is None


@pytest.mark.parametrize("changed", [TORCH_FILE, "config.json"])
def test_files_changed_after_load_are_refused(model_dir: Path, changed: str) -> None:
    config = read_config(model_dir)
    long = onnx_runtime._TorchForLong(model_dir, config, 0)  # the model loads: its files are fingerprinted
    path = model_dir / config.version / changed if changed == TORCH_FILE else model_dir / changed
    path.write_bytes(path.read_bytes() + b" ")  # another version lands on disk without a reload
    with pytest.warns(UserWarning, match="changed on disk since the model was loaded"):
        assert long.get() is None
    assert FakeTorch.made == 0  # the new weights were never read into the served model
    assert long.get() is None and FakeTorch.made == 0  # and stay refused


def test_changed_while_being_read_is_refused(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = read_config(model_dir)
    weights = model_dir / config.version / TORCH_FILE

    class Racing(FakeTorch):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            weights.write_bytes(weights.read_bytes() + b" ")

    monkeypatch.setattr(pytorch, "TorchBackend", Racing)
    long = onnx_runtime._TorchForLong(model_dir, config, 0)
    with pytest.warns(UserWarning, match="changed on disk"):
        assert long.get() is None


def test_train_hint_only_when_torch_is_missing(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(FakeTorch):
        def __init__(self, *args: Any) -> None:
            raise KeyError("weights of another architecture")

    monkeypatch.setattr(pytorch, "TorchBackend", Broken)
    long = onnx_runtime._TorchForLong(model_dir, read_config(model_dir), 0)
    with pytest.warns(UserWarning) as seen:
        long.get()
    assert "KeyError" in str(seen[0].message) and "[train]" not in str(seen[0].message)

    class Missing(FakeTorch):
        def __init__(self, *args: Any) -> None:
            raise ImportError("No module named 'torch'")

    monkeypatch.setattr(pytorch, "TorchBackend", Missing)
    long = onnx_runtime._TorchForLong(model_dir, read_config(model_dir), 0)
    with pytest.warns(UserWarning, match=r"pip install '\.\[train\]'"):
        long.get()


def test_a_version_other_than_the_loaders_is_not_served_from_its_weights(model_dir: Path) -> None:
    config = read_config(model_dir).model_copy(update={"version": "2"})
    (model_dir / "2").mkdir()
    shutil.copy(model_dir / read_config(model_dir).version / TORCH_FILE, model_dir / "2" / TORCH_FILE)
    long = onnx_runtime._TorchForLong(model_dir, config, 0)
    assert long.unavailable is not None and "version 2 is served" in long.unavailable
    pytest.importorskip("torch")
    with pytest.raises(BackendUnavailable, match="reads the weights of version 1 only"):
        REAL_TORCH_BACKEND(model_dir, config, "cpu")


def test_lean_long_session_is_not_made_from_a_changed_onnx(repo: Path, tmp_path: Path) -> None:
    shutil.copytree(repo / TEXT, tmp_path / TEXT)
    model_dir = tmp_path / TEXT
    config = read_config(model_dir)
    backend = create_backend("onnxruntime", model_dir, config, "cpu", ort_options=OrtOptions(long_via_torch=False))
    onnx = model_dir / config.version / ONNX_FILE
    onnx.write_bytes(b"not the model that was loaded")  # a new version lands without a reload
    with pytest.warns(UserWarning, match="model.onnx changed on disk since the model was loaded"):
        lean = backend._lean_session.get()  # type: ignore[attr-defined]
    assert lean is backend.session  # type: ignore[attr-defined]  # the loaded session, not the changed file


def test_lean_long_session_is_made_from_an_unchanged_onnx(repo: Path) -> None:
    config = read_config(repo / TEXT)
    backend = create_backend("onnxruntime", repo / TEXT, config, "cpu", ort_options=OrtOptions(long_via_torch=False))
    lean = backend._lean_session.get()  # type: ignore[attr-defined]
    assert lean is not backend.session  # type: ignore[attr-defined]
