"""The fused kernel as onnxruntime's `com.lara::LaraAttention` (`kernels/ort_library.py`,
`kernels/csrc/lara_ort_op.cpp`) and the server's choice between it and the ONNX function body.

Tolerances: as tests/kernels/test_cpu_fused.py, float32 only (the custom op registers float32): at
most 2x as far from the float64 reference as the plain reference run in float32, floor 1e-6. Against
the torch op's compiled kernel (OpenMP threads) the output must be BITWISE equal: the same code and the
same tasks, only the thread pool differs (onnxruntime's own); equality also proves onnxruntime ran the
kernel and not the body, whose float32 arithmetic differs in the last bits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from lara_serve.kernels import _cpu_fused, ort_library
from lara_serve.kernels.inputs import LaraInputs
from lara_serve.kernels.reference import lara_attention_ref
from lara_serve.server.backends import BackendUnavailable, OrtOptions
from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
from lara_serve.server.repository import read_config
from tests.kernels.conftest import make_inputs, tail_padding
from tests.model_export.test_export import _single_node_model

NEWS = Path(__file__).resolve().parents[2] / "model_repository" / "lara-text-news-bytes"


@pytest.fixture(scope="module", autouse=True)
def built():
    """The library must build wherever `make setup` ran (it installs the headers; CI has g++)."""
    ort_library.reset()
    assert ort_library.library() is not None, ort_library.unavailable_reason()


def _session(model, fused: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    if fused:
        assert ort_library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _feeds(q, k, v, ql, kl, mask, noise) -> dict[str, np.ndarray]:
    f32 = [t.float().numpy() for t in (q, k, v, ql, kl)]
    return {
        **dict(zip(["q", "k", "v", "q_landmarks", "k_landmarks"], f32, strict=True)),
        "key_padding_mask": np.zeros((1, 1), bool) if mask is None else mask.numpy(),
        "noise": np.zeros((1, 1, 1, 1), np.float32) if noise is None else noise.float().numpy(),
    }


@pytest.mark.parametrize("n,c,d", [(1, 4, 32), (97, 16, 64), (97, 130, 32), (1025, 49, 64), (2100, 16, 32)])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("noise_batch", [None, 1, 3])
def test_matches_float64_reference_and_the_torch_kernel(n, c, d, padded, noise_batch):
    b, h, alpha = 3, 2, 1.5
    q, k, v, ql, kl = make_inputs(b, h, n, d, c, seed=n + c + d)
    mask = None
    if padded:
        mask = tail_padding([n, max(n // 2, 1), 0], n)  # full, half, fully padded
        if n > 4:
            mask[0, 1:3] = True  # a hole, not only tail padding
    gen = torch.Generator().manual_seed(7)
    noise = None if noise_batch is None else torch.randn(noise_batch, h, c, d, dtype=torch.float64, generator=gen)
    model = _single_node_model(alpha, (1, 1, 1, 1) if noise is None else tuple(noise.shape))
    got = _session(model, fused=True).run(None, _feeds(q, k, v, ql, kl, mask, noise))[0]

    ref = lara_attention_ref(q, k, v, ql, kl, mask, alpha, noise)
    f32 = [t.float() for t in (q, k, v, ql, kl)]
    plain = lara_attention_ref(*f32, mask, alpha, None if noise is None else noise.float())
    err = np.abs(got - ref.numpy()).max()
    assert err <= max(2 * (plain.double() - ref).abs().max().item(), 1e-6), err
    omp = _cpu_fused.lara_forward_fused(LaraInputs(*f32, mask, alpha, None if noise is None else noise.float()))
    assert np.array_equal(got, omp.numpy())
    if padded:
        assert np.all(got[2] == 0)  # the fully padded document: zeros, no NaN


def test_a_document_alone_and_in_a_padded_batch_are_bitwise_equal():
    n, c, d, h = 700, 16, 32, 2
    q, k, v, ql, kl = make_inputs(3, h, n, d, c, seed=3)
    mask = tail_padding([n, 300, 5], n)
    session = _session(_single_node_model(1.0, (1, 1, 1, 1)), fused=True)
    batched = session.run(None, _feeds(q, k, v, ql, kl, mask, None))[0]
    for i, length in enumerate([n, 300, 5]):
        one = [t[i : i + 1, :, :length] if t.shape[2] == n else t[i : i + 1] for t in (q, k, v, ql, kl)]
        alone = session.run(None, _feeds(*one, None, None))[0]
        assert np.array_equal(alone[0], batched[i, :, :length])


def test_bad_shapes_get_a_clear_error():
    q, k, v, ql, kl = make_inputs(2, 2, 10, 16, 4)
    session = _session(_single_node_model(1.0, (1, 1, 1, 1)), fused=True)
    feeds = _feeds(q, k, v, ql, kl, tail_padding([10, 10], 10), None)
    feeds["key_padding_mask"] = np.zeros((2, 11), bool)
    with pytest.raises(Exception, match=r"key_padding_mask must be \[B, N\] = \[2, 10\] or \[1, 1\]; got \[2, 11\]"):
        session.run(None, feeds)


def test_the_shipped_text_model_gives_the_same_logits_fused_and_body():
    """Whole model: the two attention implementations differ by float32 rounding (observed <= 4e-6 at 4K
    tokens, 1.3e-5 at 64K: benchmarks/ort_kernel.py); 1e-4 on logits of size ~10 leaves room for the
    other CPUs CI may run on, and is far below any change of the predicted label."""
    options = [ort.SessionOptions() for _ in range(2)]
    assert ort_library.register(options[0])
    path = str(NEWS / "1" / "model.onnx")
    fused, body = (ort.InferenceSession(path, o, providers=["CPUExecutionProvider"]) for o in options)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 256, size=(3, 4096)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 1500:] = 0
    mask[2, 7:] = 0
    feeds = {"input_ids": ids * mask, "attention_mask": mask}
    a, b = fused.run(None, feeds)[0], body.run(None, feeds)[0]
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    assert (a.argmax(1) == b.argmax(1)).all()


def test_the_server_backend_uses_the_fused_kernel_by_default():
    config = read_config(NEWS)
    assert OnnxRuntimeBackend(NEWS, config, "cpu").attention_kernel == "fused"
    assert OnnxRuntimeBackend(NEWS, config, "cpu", ort_options=OrtOptions(attention="body")).attention_kernel == "body"


def test_without_headers_auto_falls_back_and_fused_refuses(tmp_path, monkeypatch):
    monkeypatch.setenv("LARA_ORT_HEADERS", str(tmp_path))
    monkeypatch.setenv("LARA_KERNEL_CACHE", str(tmp_path / "cache"))  # no cached library to find either
    ort_library.reset()
    try:
        with pytest.warns(UserWarning, match="onnxruntime_c_api.h not found"):
            assert ort_library.library() is None
        assert "make setup" in (ort_library.unavailable_reason() or "")
        assert not ort_library.register(ort.SessionOptions())
        config = read_config(NEWS)
        assert OnnxRuntimeBackend(NEWS, config, "cpu").attention_kernel == "body"
        with pytest.raises(BackendUnavailable, match="ort_attention=fused but the fused kernel is unavailable"):
            OnnxRuntimeBackend(NEWS, config, "cpu", ort_options=OrtOptions(attention="fused"))
    finally:
        monkeypatch.undo()
        ort_library.reset()


def test_a_prebuilt_library_is_used_without_compiling(tmp_path, monkeypatch):
    """LARA_ORT_LIBRARY (the container image: built in its build stage, no compiler at run time)."""
    built_path = ort_library.library()
    monkeypatch.setenv("LARA_ORT_HEADERS", str(tmp_path))  # no headers: building would fail
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler"))
    try:
        monkeypatch.setenv("LARA_ORT_LIBRARY", str(built_path))
        ort_library.reset()
        assert ort_library.library() == built_path
        monkeypatch.setenv("LARA_ORT_LIBRARY", str(tmp_path / "missing.so"))
        ort_library.reset()
        with pytest.warns(UserWarning, match="missing.so cannot be used"):
            assert ort_library.library() is None
    finally:
        monkeypatch.undo()
        ort_library.reset()
