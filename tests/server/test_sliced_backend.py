"""The onnxruntime backend runs text rows over LONG_TOKENS on the model's sliced program
(lara_serve.sliced_program) when the model ships one: each long row alone over its own ids, the
other rows on the whole graph, the same answers as the whole graph within float32 rounding; a program that
does not belong to the served model.onnx is not used, and says so.

LONG_TOKENS is lowered so that a few KB take the path a 1 MiB document takes (the graphs take any length).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from lara_serve.server.backends import OrtOptions, onnx_runtime
from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
from lara_serve.server.preprocess import collate, text_item
from lara_serve.server.repository import read_config

SHIPPED = Path(__file__).resolve().parents[2] / "model_repository" / "lara-text-news-bytes"
pytestmark = pytest.mark.skipif(not (SHIPPED / "1" / "sliced").is_dir(), reason="shipped sliced program absent")


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    """The shipped lara-text-news-bytes (config.json, model.onnx, sliced/) in a repository of its own."""
    target = tmp_path / "repo" / SHIPPED.name
    (target / "1").mkdir(parents=True)
    shutil.copy(SHIPPED / "config.json", target / "config.json")
    shutil.copy(SHIPPED / "1" / "model.onnx", target / "1" / "model.onnx")
    shutil.copytree(SHIPPED / "1" / "sliced", target / "1" / "sliced")
    return target


def batch(model_dir: Path) -> dict[str, np.ndarray]:
    config = read_config(model_dir)
    text = (Path(__file__).resolve().parents[2] / "examples" / "long-document.txt").read_bytes()
    items = [text_item(text[:40], config.preprocessing, False), text_item(text[:3000], config.preprocessing, False)]
    return collate(items, config)


def backend(model_dir: Path, **kwargs: bool) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(
        model_dir, read_config(model_dir), "cpu", num_threads=1, ort_options=OrtOptions(long_via_torch=False), **kwargs
    )


def test_long_rows_run_on_the_sliced_program_and_agree_with_the_whole_graph(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onnx_runtime, "LONG_TOKENS", 1000)
    inputs = batch(model_dir)
    mixed, whole = backend(model_dir), backend(model_dir, sliced=False)
    program = mixed._sliced  # type: ignore[attr-defined]
    assert program is not None and whole._sliced is None  # type: ignore[attr-defined]
    seen: list[int] = []
    real_run = program.run
    monkeypatch.setattr(program, "run", lambda ids: (seen.append(len(ids)), real_run(ids))[1])
    out = mixed.run_outputs(inputs)
    assert seen == [3000]  # the long row alone, over its own ids; the 40-byte row never reached it
    reference = whole.run_outputs(inputs)  # the whole graph for both rows
    np.testing.assert_allclose(out.logits, reference.logits, atol=2e-5)
    assert out.ood_score is not None and reference.ood_score is not None
    np.testing.assert_allclose(out.ood_score, reference.ood_score, rtol=1e-4)
    assert (out.logits.argmax(1) == reference.logits.argmax(1)).all()
    np.testing.assert_array_equal(
        out.logits[0], whole.run_outputs({k: v[:1, :40] for k, v in inputs.items()}).logits[0]
    )
    alone = real_run(inputs["input_ids"][1][inputs["attention_mask"][1] > 0])
    np.testing.assert_array_equal(out.logits[1], alone["logits"][0])  # its answer does not depend on the batch


def test_a_program_of_another_model_onnx_is_not_used(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = model_dir / "1" / "sliced" / "manifest.json"
    spec = json.loads(manifest.read_text())
    manifest.write_text(json.dumps(spec | {"model_onnx_sha256": "0" * 64}))
    with pytest.warns(UserWarning, match="sliced is not used .*exported for another model.onnx.*export.sliced"):
        stale = backend(model_dir)
    assert stale._sliced is None  # type: ignore[attr-defined]
    monkeypatch.setattr(onnx_runtime, "LONG_TOKENS", 1000)
    inputs = batch(model_dir)
    np.testing.assert_array_equal(stale.run(inputs), backend(model_dir, sliced=False).run(inputs))


def test_a_model_without_a_program_loads_as_before(model_dir: Path) -> None:
    shutil.rmtree(model_dir / "1" / "sliced")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no folder is no problem: nothing to say
        plain = backend(model_dir)
    assert plain._sliced is None  # type: ignore[attr-defined]
