"""The sliced program for long documents (lara_serve.model_export.export.sliced, run by
lara_serve.sliced_program): the algorithm in float64 against the float64 plain forward, the shipped
graphs in onnxruntime against a float64 reference (at most 2x the whole graph's float32 error), and an
export of the other embedding and readout paths.

Slices are made small (7-512 rows) so that a few hundred or thousand tokens exercise what a 1 MiB document
does: many slices, slices shorter than the embedding halo, a last slice of a few rows, N = 1.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from lara_serve.model_export import create_model
from lara_serve.model_export.export import sliced
from lara_serve.model_export.models.ood import MahalanobisScore, ServingModel
from lara_serve.model_export.models.ood_input import VOCAB, ByteBigramNLL
from lara_serve.sliced_program import SlicedProgram, ort_runners, read_manifest

REPO = Path(__file__).resolve().parents[2] / "model_repository"
CONFIGS = {
    # the shipped text models' kind: conv positions, byte n-grams, case folding, passage readout, input score
    "conv-passages-bigram": (
        {"case_fold": True, "depth": 2, "conv_kernel": 5, "pooling": "passages", "passage_bytes": 8},
        True,
    ),
    # the other paths: absolute positions, hashed words (16-byte halo), fixed noise, mixed landmarks, mean readout
    "sinusoidal-words-mean": (
        {
            "positions": "sinusoidal",
            "word_buckets": 31,
            "ngram_orders": (2, 3, 4, 5),
            "attention": {"kind": "lara", "num_landmarks": 4, "eval_noise": "fixed", "mixed": True},
        },
        False,
    ),
}


def tiny_serving(name: str) -> ServingModel:
    overrides, bigram = CONFIGS[name]
    torch.manual_seed(0)
    model = create_model("tiny-text", **overrides).eval()
    with torch.no_grad():  # larger weights than init's 0.02, so that a wrong statistic would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    dim, classes = model.cfg.dim, model.cfg.num_classes
    ood = MahalanobisScore(torch.randn(classes, dim), torch.randn(dim, dim) * 0.3)
    score = ByteBigramNLL(torch.rand(VOCAB, VOCAB) * 5, model.cfg.case_fold) if bigram else None
    return ServingModel.wrap(model, 0.7, ood, score, (50.0, 3.0, 2.0) if bigram else None).eval()


def reference(serving: torch.nn.Module, ids: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    with torch.inference_mode():
        logits, ood = serving(ids, torch.ones_like(ids))
    return logits.double().numpy(), ood.double().numpy()


def document(n: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (1, n), generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize(("n", "chunk"), [(1, 8), (97, 16), (1025, 56)])
def test_the_program_in_float64_is_the_plain_forward(name: str, n: int, chunk: int) -> None:
    """Run in float64, the program's statistics (chunk sums, online softmaxes over keys and queries, passage
    means) give the plain float64 forward's outputs up to the float32 rounding that forward applies to its
    logits and ood_score: an algorithmic slip (a wrong chunk edge, a halo short by one row) is ~1e-2."""
    serving = tiny_serving(name).double()
    ids = document(n)
    stages, state = sliced.build_stages(serving, chunk)
    program = SlicedProgram(sliced.manifest(serving, stages, state, chunk), sliced.torch_runners(stages))
    got = program.run(ids[0].numpy(), float_dtype=np.float64)
    logits, ood = reference(serving, ids)
    np.testing.assert_allclose(got["logits"], logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["ood_score"], ood, rtol=1e-5)


def shipped_program(model: str, chunk: int) -> tuple[SlicedProgram, dict]:
    folder = REPO / model / "1" / sliced.FOLDER
    if not folder.is_dir():
        pytest.skip(f"{folder} absent")
    spec = read_manifest(folder) | {"chunk": chunk}  # any multiple of the passage size: the graphs take any rows

    def session(path: Path) -> ort.InferenceSession:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    return SlicedProgram(spec, ort_runners(folder, spec, session)), spec


@pytest.mark.parametrize("model", ["lara-text-news-bytes", "lara-text-genre"])
def test_shipped_graphs_are_within_twice_the_whole_graphs_float32_error(model: str) -> None:
    from lara_serve.model_export.models.hub import load_pretrained

    program, spec = shipped_program(model, chunk=512)
    assert spec["model_onnx_sha256"] == sliced.file_sha256(REPO / model / "1" / "model.onnx")
    serving = load_pretrained(REPO / model, serving=True)
    ref64 = copy.deepcopy(serving).double()
    whole = ort.InferenceSession(str(REPO / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    for n in (1, 97, 1025, 2600):
        ids = document(n)
        logits, ood = reference(ref64, ids)
        feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones((1, n), dtype=np.int64)}
        w_logits, w_ood = whole.run(["logits", "ood_score"], feeds)
        got = program.run(ids[0].numpy())
        assert got["logits"].dtype == np.float32 and got["logits"].shape == w_logits.shape
        whole_err = max(np.abs(w_logits - logits).max(), np.abs(w_ood - ood).max() / abs(ood[0]))
        sliced_err = max(np.abs(got["logits"] - logits).max(), np.abs(got["ood_score"] - ood).max() / abs(ood[0]))
        assert sliced_err <= 2 * whole_err + 2e-6, (n, sliced_err, whole_err)
        assert got["logits"].argmax() == logits.argmax()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[ServingModel, Path]:
    serving = tiny_serving("sinusoidal-words-mean")
    folder = tmp_path_factory.mktemp("sliced")
    onnx_file = folder / "model.onnx"
    onnx_file.write_bytes(b"the whole graph it stands in for")
    sliced.export_sliced(serving, folder / sliced.FOLDER, onnx_file, chunk=64)
    return serving, folder


@pytest.mark.slow
def test_an_export_runs_in_onnxruntime_as_in_torch(exported: tuple[ServingModel, Path]) -> None:
    serving, folder = exported
    spec = json.loads((folder / sliced.FOLDER / sliced.MANIFEST).read_text())
    assert spec["model_onnx_sha256"] == sliced.file_sha256(folder / "model.onnx")
    assert [p["file"] for p in spec["passes"]] == ["embed.onnx", "sums_0.onnx", "keys_0.onnx", "block_0.onnx",
                                                   "tail.onnx", "readout.onnx"]  # fmt: skip
    program = SlicedProgram(spec, ort_runners(folder / sliced.FOLDER, spec, lambda p: ort.InferenceSession(str(p))))
    ref64 = copy.deepcopy(serving).double()
    for n in (3, 200):
        ids = document(n)
        logits, ood = reference(ref64, ids)
        plain_logits, plain_ood = reference(serving, ids)  # the torch fp32 forward
        got = program.run(ids[0].numpy())
        plain_err = np.abs(plain_logits - logits).max()
        assert np.abs(got["logits"] - logits).max() <= 2 * plain_err + 1e-5
        np.testing.assert_allclose(got["ood_score"], ood, rtol=1e-4)


def test_models_the_program_cannot_express_are_refused_with_reasons() -> None:
    model = create_model("tiny-text", attention="softmax", pooling="attention").eval()
    reasons = sliced.not_supported_reasons(model)
    assert any("softmax" in r for r in reasons) and any("pooling 'attention'" in r for r in reasons)
    assert any("serving head" in r for r in reasons)
    with pytest.raises(ValueError, match="cannot slice this model"):
        sliced.build_stages(model)  # type: ignore[arg-type]
