"""Backends alone (no HTTP), start-up refusals, and the real model_export torch artifact if present."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from server_helpers import IMAGE, TEXT

from lara_serve.server.backends import BackendUnavailable, OrtOptions, create_backend
from lara_serve.server.backends.onnx_runtime import SPIN_KEYS
from lara_serve.server.backends.pytorch import TorchBackend
from lara_serve.server.models import load_models
from lara_serve.server.preprocess import collate, softmax, text_item
from lara_serve.server.repository import RepositoryError, read_config
from lara_serve.server.settings import DEFAULT_MODEL_REPOSITORY, Settings
from lara_serve.server.synthetic import load_synthetic


def test_onnxruntime_runs_text_and_image(repo: Path) -> None:
    for name, inputs in ((TEXT, None), (IMAGE, {"pixel_values": np.zeros((3, 1, 28, 28), np.float32)})):
        config = read_config(repo / name)
        backend = create_backend("onnxruntime", repo / name, config, "cpu", num_threads=1)
        if inputs is None:
            inputs = collate([text_item(b"hi", config.preprocessing, False)] * 3, config)  # type: ignore[arg-type]
        logits = backend.run(inputs)
        assert logits.shape == (3, len(config.labels)) and logits.dtype == np.float32


@pytest.mark.parametrize("spinning", [False, True])
def test_ort_spinning_setting_reaches_every_session(repo: Path, spinning: bool) -> None:
    """Spinning intra-op threads doubled a request's CPU time (docs/performance.md): off unless asked for, and
    the setting must reach the session that serves, not only the options object."""
    models = load_models(Settings(model_repository=repo, warmup=False, ort_spinning=spinning))
    try:
        assert len(models) == 2
        for model in models.values():
            options = model.backend.session.get_session_options()  # type: ignore[attr-defined]
            for key in SPIN_KEYS:
                assert options.get_session_config_entry(key) == ("1" if spinning else "0"), (model.name, key)
    finally:
        for model in models.values():
            model.backend.close()


@pytest.mark.parametrize("shared", [True, False])
def test_ort_shared_arena_setting_reaches_every_session(repo: Path, shared: bool) -> None:
    """settings.ort_shared_arena (on unless turned off) reaches the sessions that serve; what it saves is
    measured in tests/server/test_shared_arena.py and benchmarks/memory_one_mib.py."""
    models = load_models(Settings(model_repository=repo, warmup=False, ort_shared_arena=shared))
    try:
        for model in models.values():
            options = model.backend.session.get_session_options()  # type: ignore[attr-defined]
            entries = {"session.use_env_allocators": "1"} if shared else {}
            found = {k: options.get_session_config_entry(k) for k in entries}  # absent: raises, as it should not
            assert found == entries, model.name
            if not shared:
                with pytest.raises(RuntimeError, match="use_env_allocators"):  # never set: each its own arena
                    options.get_session_config_entry("session.use_env_allocators")
    finally:
        for model in models.values():
            model.backend.close()


def test_torch_backend_matches_onnxruntime(repo: Path) -> None:
    config = read_config(repo / TEXT)
    inputs = collate([text_item(b"hello", config.preprocessing, False),  # type: ignore[arg-type]
                      text_item(b"a longer text", config.preprocessing, False)], config)  # type: ignore[arg-type]  # fmt: skip
    ort_logits = create_backend("onnxruntime", repo / TEXT, config, "cpu").run(inputs)
    torch_logits = TorchBackend(repo / TEXT, config, "cpu", loader=load_synthetic).run(inputs)
    np.testing.assert_allclose(torch_logits, ort_logits, atol=1e-5)


def test_cuda_without_gpu_is_refused_at_start_up(repo: Path) -> None:
    import onnxruntime
    import torch

    config = read_config(repo / TEXT)
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        with pytest.raises(BackendUnavailable, match="onnxruntime-gpu"):
            create_backend("onnxruntime", repo / TEXT, config, "cuda")
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailable, match="CUDA"):
            create_backend("torch", repo / TEXT, config, "cuda")


def test_bad_repositories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="no model"):
        load_models(Settings(model_repository=tmp_path))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"name": "broken", "task": "text"}')
    with pytest.raises(RepositoryError, match="unusable model config"):
        load_models(Settings(model_repository=tmp_path))


def test_missing_onnx_file_is_explained(repo: Path, tmp_path: Path) -> None:
    config = read_config(repo / TEXT)
    with pytest.raises(BackendUnavailable, match="does not exist"):
        create_backend("onnxruntime", tmp_path, config, "cpu")


def _real_models() -> list[Path]:
    return sorted(p.parent for p in DEFAULT_MODEL_REPOSITORY.glob("*/config.json"))


@pytest.mark.skipif(not _real_models(), reason="no trained model in model_repository/ yet (model_export)")
@pytest.mark.parametrize("model_dir", _real_models(), ids=lambda p: p.name)
def test_real_models_both_backends_agree(model_dir: Path) -> None:
    pytest.importorskip("lara_serve.model_export", reason="lara_serve.model_export.load_pretrained not written yet")
    config = read_config(model_dir)
    onnx_backend = create_backend("onnxruntime", model_dir, config, "cpu")
    torch_backend = create_backend("torch", model_dir, config, "cpu")
    # An int8 graph (lara-text-news, export.quantization) serves int8 weights where torch reads the float ones:
    # the same answer on an article, probabilities within 0.05 (its build: mean |dp| 0.010 on the test forms;
    # short texts move most, tests/model_export/test_shipped_minilm.py); float graphs agree to 1e-3 on logits.
    quantized = "quantization" in json.loads((model_dir / "config.json").read_text()).get("export", {})
    if config.task == "text":
        text = ARTICLE if quantized else b"a test document"
        inputs = collate([text_item(text, config.preprocessing, False)], config)  # type: ignore[arg-type]
    else:
        p = config.preprocessing
        inputs = {"pixel_values": np.zeros((1, 1, p.height, p.width), np.float32)}  # type: ignore[union-attr]
    if not quantized:
        np.testing.assert_allclose(torch_backend.run(inputs), onnx_backend.run(inputs), atol=1e-3)
        return
    p_torch, p_onnx = (softmax(np.asarray(b.run(inputs), np.float64)) for b in (torch_backend, onnx_backend))
    assert p_torch.argmax() == p_onnx.argmax()
    np.testing.assert_allclose(p_torch, p_onnx, atol=0.05)


ARTICLE = (
    b"Shares in the bank rose 5% on Monday after it reported annual profits well ahead of analysts' forecasts. "
    b"The chief executive said lending had grown in every region and that the dividend would be raised."
)


@pytest.mark.skipif(len(_real_models()) < 2, reason="needs two trained models in model_repository/")
def test_model_backends_choose_per_model() -> None:
    pytest.importorskip("lara_serve.model_export", reason="the torch backend needs model_export")
    torch_name, ort_name = _real_models()[0].name, _real_models()[1].name
    settings = Settings(
        models=[torch_name, ort_name], backend="onnxruntime", model_backends={torch_name: "torch"}, warmup=False
    )
    models = load_models(settings)
    try:
        assert {n: m.backend.name for n, m in models.items()} == {torch_name: "torch", ort_name: "onnxruntime"}
        assert models[torch_name].v2_metadata()["platform"] == "pytorch_libtorch"
    finally:
        for m in models.values():
            m.backend.close()


# -- onnxruntime hands documents longer than LONG_TOKENS to the torch sliced forward --------------------------


def _two_lengths(config) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    items = [text_item(b"short", config.preprocessing, False),  # type: ignore[arg-type]
             text_item(b"a text longer than sixteen bytes", config.preprocessing, False)]  # type: ignore[arg-type]  # fmt: skip
    return collate(items, config)


def test_long_rows_run_on_torch_and_short_rows_on_onnxruntime(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lara_serve.server.backends import onnx_runtime

    monkeypatch.setattr(onnx_runtime, "LONG_TOKENS", 16)  # the synthetic model's texts are short
    config = read_config(repo / TEXT)
    inputs = _two_lengths(config)
    plain = create_backend("onnxruntime", repo / TEXT, config, "cpu", ort_options=OrtOptions(long_via_torch=False))
    mixed = create_backend("onnxruntime", repo / TEXT, config, "cpu")
    seen: list[tuple[int, int]] = []
    torch_backend = TorchBackend(repo / TEXT, config, "cpu", loader=load_synthetic)
    real_run = torch_backend.run_outputs
    torch_backend.run_outputs = lambda x: (seen.append(x["input_ids"].shape), real_run(x))[1]  # type: ignore[method-assign]
    mixed._long = onnx_runtime._TorchForLong(repo / TEXT, config, 0, loader=load_synthetic)  # type: ignore[attr-defined]
    mixed._long._backend = torch_backend  # type: ignore[attr-defined]
    out = mixed.run(inputs)
    assert seen == [(1, 32)]  # the long row alone, cut to its own length; the short row never reached torch
    long_alone = {k: v[1:, :32] for k, v in inputs.items()}
    short_alone = {k: v[:1, :5] for k, v in inputs.items()}
    np.testing.assert_array_equal(out[1], real_run(long_alone).logits[0])
    np.testing.assert_array_equal(out[0], plain.run(short_alone)[0])
    np.testing.assert_allclose(out, plain.run(inputs), atol=1e-5)  # the two paths agree on what they compute


def test_without_torch_weights_long_rows_stay_on_onnxruntime(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lara_serve.server.backends import onnx_runtime

    monkeypatch.setattr(onnx_runtime, "LONG_TOKENS", 16)
    config = read_config(repo / TEXT)  # a synthetic model: its model.safetensors is not model_export's
    inputs = _two_lengths(config)
    backend = create_backend("onnxruntime", repo / TEXT, config, "cpu")
    with pytest.warns(UserWarning, match="longer than 16 tokens run on onnxruntime.*could not be loaded \\(KeyError"):
        first = backend.run(inputs)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        second = backend.run(inputs)
    assert not again  # said once
    plain = create_backend("onnxruntime", repo / TEXT, config, "cpu", ort_options=OrtOptions(long_via_torch=False))
    assert plain._long is None  # type: ignore[attr-defined]
    np.testing.assert_array_equal(first, plain.run(inputs))
    np.testing.assert_array_equal(second, first)


def test_the_hand_off_length_is_where_the_torch_forward_slices(repo: Path, tmp_path: Path) -> None:
    from lara_serve.model_export.models import long_forward
    from lara_serve.server.backends import onnx_runtime

    assert onnx_runtime.LONG_TOKENS == long_forward.LONG_FROM
    missing = onnx_runtime._TorchForLong(tmp_path, read_config(repo / TEXT), 0)
    assert missing.unavailable is not None and "model.safetensors does not exist" in missing.unavailable


@pytest.mark.skipif(
    not (DEFAULT_MODEL_REPOSITORY / "lara-text-news" / "config.json").is_file(), reason="lara-text-news not here"
)
def test_an_int8_graph_gives_a_row_the_answer_it_gets_alone() -> None:
    """lara-text-news's int8 graph quantizes activations with one scale per call: batched naively, an article's
    ood_score moved 5% with another document beside it. Its backend runs each row alone, at its own length:
    the same bits batched, padded or not."""
    model_dir = DEFAULT_MODEL_REPOSITORY / "lara-text-news"
    config = read_config(model_dir)
    assert config.rows_alone and not read_config(DEFAULT_MODEL_REPOSITORY / "lara-text-news-bytes").rows_alone
    backend = create_backend("onnxruntime", model_dir, config, "cpu", num_threads=1)
    texts = [ARTICLE, b"The striker scored twice as the home side won the cup final. " * 12, b"a"]
    items = [text_item(t, config.preprocessing, False) for t in texts]  # type: ignore[arg-type]
    together = backend.run_outputs(collate(items, config))
    for i, item in enumerate(items):
        alone = backend.run_outputs(collate([item], config))
        np.testing.assert_array_equal(together.logits[i], alone.logits[0])
        np.testing.assert_array_equal(together.ood_score[i], alone.ood_score[0])  # type: ignore[index]
    backend.close()
