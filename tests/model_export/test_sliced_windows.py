"""A windowed word-piece model's sliced program (export.sliced_windows): the same answers as the whole model
reading the whole document, in float64 (the program's arithmetic) and through onnxruntime (the exported graphs),
at lengths that end a slice exactly, leave a slice with no pieces, or end with a short window; and which
models it refuses."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_bert_lara_classifier import TINY_GATE, TINY_LAYERS, TINY_POOL, TINY_WIDE, tiny_model

from lara_serve.model_export.export.sliced import torch_runners
from lara_serve.model_export.export.sliced_windows import (
    build_stages,
    export_windows,
    manifest,
    not_supported_reasons,
    parity_lengths,
)
from lara_serve.model_export.models.ood import MahalanobisScore, OutlierProbe, ServingModel
from lara_serve.sliced_program import SlicedProgram

WINDOWS = 2  # windows per slice: a slice is 2 x 14 pieces, so short documents cross several slices


def serving(cfg=TINY_GATE, probe: bool = True, max_length: int = 40) -> ServingModel:  # noqa: ANN001
    """A serving head as lara-text-news's: Mahalanobis score and, with `probe`, an outlier probe (which computes
    in float32 whatever its input: the float64 tests leave it out, the onnxruntime test has it)."""
    model = tiny_model(cfg=dataclasses.replace(cfg, max_length=max_length))
    g = torch.Generator().manual_seed(1)
    d = cfg.dim
    ood = MahalanobisScore(torch.randn(cfg.num_classes, d, generator=g), torch.eye(d) * 3.0)
    if not probe:
        return ServingModel.wrap(model, 1.3, ood).eval()
    out = OutlierProbe(torch.randn(d, generator=g), torch.tensor([0.1]))
    return ServingModel.wrap(model, 1.3, ood, probe=out, probe_scales=(0.5, 2.0, 1.0)).eval()


def document(n: int, cfg=TINY_GATE) -> torch.Tensor:  # noqa: ANN001
    ids = torch.randint(cfg.sep_id + 1, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
    ids[0, 0], ids[0, -1] = cfg.cls_id, cfg.sep_id
    return ids


LENGTHS = [3, 17, *parity_lengths(WINDOWS * TINY_GATE.window, TINY_GATE.window), 200]
# lara train --init's frozen readout, read in windows: every hidden state's mean and a word-piece wide path
TINY_LAYERS_WIN = dataclasses.replace(TINY_LAYERS, window=14, cls_id=2, sep_id=3)
SLICEABLE = pytest.mark.parametrize(
    "cfg", [TINY_GATE, TINY_WIDE, TINY_LAYERS_WIN], ids=["pool+gate", "pool+wide", "layers+wide"]
)


@SLICEABLE
def test_the_program_is_the_whole_model_in_float64(cfg) -> None:  # noqa: ANN001
    """The program's own arithmetic (each stage eager, float64 state) against the serving model reading the
    whole document in float64: only summation order differs, so 1e-10 holds (float64 eps 2e-16 times a few
    thousand terms of order 1). The whole model's wide path returns float32 (text.wide_logits), so with one the
    logits hold to float32 rounding of logits of order 10: 2e-6."""
    model = serving(cfg, probe=False).double()
    atol = 2e-6 if cfg.tfidf_buckets else 1e-10
    stages, state = build_stages(model, WINDOWS * cfg.window)
    spec = manifest(stages, state, WINDOWS * cfg.window, long_from=40)
    program = SlicedProgram(spec, torch_runners(stages))
    seen = set()
    for n in LENGTHS:
        ids = document(n, cfg)
        with torch.inference_mode():
            logits, ood = model(ids, torch.ones_like(ids))
        got = program.run(ids[0].numpy(), float_dtype=np.float64)
        np.testing.assert_allclose(got["logits"], logits.numpy(), rtol=0, atol=atol)
        np.testing.assert_allclose(got["ood_score"], ood.numpy(), rtol=1e-10, atol=1e-10)
        seen.add(round(float(ood[0]), 6))
    assert len(seen) == len(LENGTHS)  # documents that differ score differently: the check can fail


def test_every_document_reads_every_piece() -> None:
    """A piece changed anywhere, in the last window of a slice or in the last slice, changes the answer (by more
    than float64 rounding, ~1e-15 here: a gated window's say can be small, but never nothing)."""
    model = serving(probe=False).double()
    stages, state = build_stages(model, WINDOWS * TINY_GATE.window)
    program = SlicedProgram(manifest(stages, state, WINDOWS * TINY_GATE.window, 40), torch_runners(stages))
    ids = document(2 * WINDOWS * TINY_GATE.window + 9)
    base = program.run(ids[0].numpy(), float_dtype=np.float64)["logits"]
    for at in (1, WINDOWS * TINY_GATE.window, WINDOWS * TINY_GATE.window + 1, ids.shape[1] - 2):
        other = ids.clone()
        other[0, at] = TINY_GATE.sep_id + 1 if int(ids[0, at]) != TINY_GATE.sep_id + 1 else TINY_GATE.sep_id + 2
        assert np.abs(program.run(other[0].numpy(), float_dtype=np.float64)["logits"] - base).max() > 1e-12


@pytest.mark.parametrize("cfg", [TINY_GATE, TINY_LAYERS_WIN], ids=["pool+gate", "layers+wide"])
def test_onnx_program_against_torch(tmp_path: Path, cfg) -> None:  # noqa: ANN001
    """The exported graphs (LaraAttention nodes, onnxruntime, float32) within the whole graph's export tolerance
    of the serving model; export_windows raises when they are not, and writes the manifest and both graphs."""
    model = serving(cfg)
    spec = export_windows(model, tmp_path / "sliced", None, windows_per_slice=WINDOWS, quantize=False,
                          check_lengths=LENGTHS)  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "sliced").iterdir()) == ["manifest.json", "readout.onnx", "windows.onnx"]
    assert spec["long_from"] == 40 and spec["chunk"] == WINDOWS * TINY_GATE.window
    assert [r["seq"] for r in spec["parity"]["cases"]] == LENGTHS
    assert max(r["max_abs_diff"] for r in spec["parity"]["cases"]) < 1e-4


@pytest.mark.parametrize("cfg", [TINY_POOL, TINY_LAYERS], ids=["attention", "layers"])
def test_models_it_cannot_slice(cfg) -> None:  # noqa: ANN001
    """A model that reads the whole document in one attention (no windows) has no independent windows to cut."""
    reasons = not_supported_reasons(serving(cfg))
    assert any("no windows" in r for r in reasons), reasons
    with pytest.raises(ValueError, match="cannot slice"):
        build_stages(serving(cfg), 28)
    assert not_supported_reasons(serving()) == []
    assert not_supported_reasons(tiny_model(cfg=TINY_GATE)) != []  # no serving head


def test_eager_torch_reads_windows_in_groups_with_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """bert_lara.WINDOW_GROUP: eager torch (the torch backend) encodes a long document's windows a group at a
    time; windows are independent, so the answer is the one-call answer (float64, 1e-12)."""
    from lara_serve.model_export.models import bert_lara

    model = serving(probe=False).double()
    ids = document(5 * TINY_GATE.window + 3)  # 6 windows
    with torch.inference_mode():
        whole = model(ids, torch.ones_like(ids))
        monkeypatch.setattr(bert_lara, "WINDOW_GROUP", 4)
        grouped = model(ids, torch.ones_like(ids))
    for a, b in zip(whole, grouped, strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-12)


def test_the_int8_step_re_exports_a_program_made_for_another_graph(tmp_path: Path) -> None:
    """pretrained.int8.refresh_sliced_program: after model.onnx changed (the int8 step rewrites it), the program is
    exported again for the new graph (the server checks that sha256; int8 when the graph is, float here: a tiny
    model's weights are under export.half_storage's size, so nothing is quantized), and the accepted length stays."""
    from lara_serve.model_export.export.exporter import export_model_dir
    from lara_serve.model_export.export.quantize import scalar_initializer, set_initializer
    from lara_serve.model_export.export.sliced_windows import export_windows_dir
    from lara_serve.model_export.models.hub import make_config_dict
    from lara_serve.model_export.pretrained.classifier import save_half
    from lara_serve.model_export.pretrained.int8 import refresh_sliced_program
    from lara_serve.server.backends.pytorch import file_digests

    model = serving(max_length=128)  # the whole graph's export traces 64 pieces
    folder = tmp_path / "tiny"
    save_half(model.model, make_config_dict("tiny", model.model.cfg, ["a", "b", "c"]), folder, model)
    assert not refresh_sliced_program(folder)  # no program: nothing to do
    export_model_dir(folder)
    export_windows_dir(folder, quantize=False, max_length=400)
    graph = folder / "1" / "model.onnx"
    set_initializer(graph, "temperature", 2.0)  # another model.onnx
    manifest_path = folder / "1" / "sliced" / "manifest.json"
    assert json.loads(manifest_path.read_text())["model_onnx_sha256"] != file_digests([graph])[graph]
    assert refresh_sliced_program(folder)
    spec = json.loads(manifest_path.read_text())
    assert spec["model_onnx_sha256"] == file_digests([graph])[graph]
    assert "quantization" not in spec and spec["long_from"] == 128
    assert json.loads((folder / "config.json").read_text())["preprocessing"]["max_length"] == 400
    # the program divides by the whole graph's temperature (an int8 graph's is refitted), not the weights' own
    assert scalar_initializer(folder / "1" / "sliced" / "readout.onnx", "serving.temperature") == 2.0
