"""ONNX export: the LaraAttention node and its body, graph checks, parity with PyTorch, determinism.

The shipped models (`model_repository/<name>/1/model.onnx`) are checked when they exist; otherwise a
tiny registered model is exported into a temporary folder, so the suite runs before training is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import onnx.inliner
import pytest
import torch
from onnx import TensorProto, helper

from lara_serve import kernels
from lara_serve.kernels import onnx_export
from lara_serve.kernels._cpu import lara_forward_cpu
from lara_serve.kernels.inputs import LaraInputs
from lara_serve.kernels.reference import lara_attention_ref
from lara_serve.model_export import create_model, load_pretrained
from lara_serve.model_export.export import exporter as ex
from lara_serve.model_export.models.registry import LABELS
from lara_serve.model_export.training.data import encode_bytes, normalize_images, pad_batch
from tests.digests import sha256

REPO = Path(__file__).resolve().parents[2] / "model_repository"
SHIPPED = {"text": "lara-text-news-bytes", "image": "lara-vit-fashion"}
TINY = {"text": "tiny-text", "image": "tiny-vit"}


@dataclass
class Artifact:
    model: torch.nn.Module
    path: Path  # <model_dir>/1/model.onnx
    shipped: bool
    before: dict | None = None  # tiny only: config.json and weights bytes before the export


@pytest.fixture(scope="module", params=["text", "image"])
def artifact(request, tmp_path_factory) -> Artifact:
    """The shipped model if exported, else a tiny one saved and exported with export_model_dir.

    The tiny text model uses fixed eval noise (an initializer feeding the node's noise input); the tiny
    image model has no mask and no noise (the translation's neutral constants).
    """
    shipped = REPO / SHIPPED[request.param]
    if (shipped / "1" / ex.ONNX_FILE).is_file():
        # as served: the calibrated logits and ood_score the graph computes (lara_serve.model_export.models.ood)
        return Artifact(load_pretrained(shipped, serving=True), shipped / "1" / ex.ONNX_FILE, True)
    name = TINY[request.param]
    noise = "fixed" if request.param == "text" else "mean"
    model = create_model(name, depth=2, attention={"eval_noise": noise}).eval()
    model_dir = tmp_path_factory.mktemp(request.param) / name
    conf = ex.make_config_dict(name, model.cfg, LABELS[name], seed=0, metrics={"test_accuracy": 0.5})
    ex.save_pretrained(model, conf, model_dir)
    weights = (model_dir / "1" / ex.WEIGHTS).read_bytes()
    ex.export_model_dir(model_dir)
    return Artifact(
        load_pretrained(model_dir), model_dir / "1" / ex.ONNX_FILE, False, {"conf": conf, "weights": weights}
    )


@pytest.fixture(scope="module")
def session(artifact):
    return ex.make_session(artifact.path)


# ----------------------------------------------------------------------------- the function body alone
def _single_node_model(alpha_coeff: float, noise_shape: tuple[int, ...]) -> onnx.ModelProto:
    names = ["q", "k", "v", "q_landmarks", "k_landmarks"]
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "H", "N" if n in "qkv" else "C", "D"]) for n in names
    ]
    inputs.append(helper.make_tensor_value_info("key_padding_mask", TensorProto.BOOL, ["MB", "MN"]))
    inputs.append(helper.make_tensor_value_info("noise", TensorProto.FLOAT, list(noise_shape)))
    node = helper.make_node(
        onnx_export.OP_NAME, [i.name for i in inputs], ["out"], domain=onnx_export.DOMAIN, alpha_coeff=alpha_coeff
    )
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", "H", "N", "D"])
    graph = helper.make_graph([node], "lara", inputs, [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ex.OPSET)])
    return onnx_export.attach_lara_function(model)


@pytest.mark.parametrize(
    ("n", "c", "masked", "noisy", "alpha"),
    [(97, 8, True, False, 1.0), (1, 4, False, False, 2.0), (64, 16, True, True, 2.0), (33, 5, False, True, 0.5)],
)
def test_function_body_matches_reference(n, c, masked, noisy, alpha):
    """The body of com.lara::LaraAttention run by onnxruntime equals the float64 reference and _cpu.py."""
    b, h, d = 3, 2, 16
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    ql, kl = (torch.randn(b, h, c, d, generator=g) for _ in range(2))
    mask = None
    if masked:
        mask = torch.arange(n)[None, :] >= torch.tensor([n, n // 2, 0])[:, None]  # full, half, fully padded
    noise = torch.randn(1, h, c, d, generator=g) if noisy else None
    model = _single_node_model(alpha, (1, h, c, d) if noisy else (1, 1, 1, 1))
    onnx.checker.check_model(model, full_check=True)
    feeds = {
        "q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "q_landmarks": ql.numpy(), "k_landmarks": kl.numpy(),
        "key_padding_mask": np.zeros((1, 1), bool) if mask is None else mask.numpy(),
        "noise": np.zeros((1, 1, 1, 1), np.float32) if noise is None else noise.numpy(),
    }  # fmt: skip
    got = ex.ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ref64 = lara_attention_ref(
        *(t.double() for t in (q, k, v, ql, kl)), mask, alpha, None if noise is None else noise.double()
    )
    ref32 = lara_forward_cpu(LaraInputs(q, k, v, ql, kl, mask, alpha, noise))
    err_torch = (ref32.double() - ref64).abs().max().item()
    err_onnx = np.abs(got - ref64.numpy()).max()
    assert err_onnx <= max(2 * err_torch, 1e-5), (err_onnx, err_torch)
    if masked:
        assert np.all(got[2] == 0) and np.all(np.isfinite(got))  # fully padded row: zeros, no NaN


def test_stock_onnxruntime_needs_the_body():
    model = _single_node_model(1.0, (1, 1, 1, 1))
    ex.ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    del model.functions[:]
    with pytest.raises(Exception, match="LaraAttention"):
        ex.ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


class OneLayer(torch.nn.Module):
    """The smallest caller of lara_serve.kernels.lara_attention (no mask, no noise), quick to export."""

    def forward(self, x):
        q, k, v = x, x * 0.5, x + 1.0  # [B, H, N, D]
        ql, kl = kernels.chunk_means_1d(q, 4), kernels.chunk_means_1d(k, 4)  # [B, H, C, D]
        return kernels.lara_attention(q, k, v, ql, kl, alpha_coeff=2.0)


def _export_one_layer(x: torch.Tensor) -> onnx.ModelProto:
    table = onnx_export.custom_translation_table()
    prog = torch.onnx.export(OneLayer().eval(), (x,), dynamo=True, custom_translation_table=table, verbose=False)
    return onnx_export.attach_lara_function(prog.model_proto)


def test_silent_fallback_is_caught():
    """The node is there when the op is called; a model that stops calling it fails the export check."""
    x = torch.randn(2, 2, 24, 8)
    proto = _export_one_layer(x)
    ex.check_graph(proto, expected_lara_nodes=1)
    (node,) = [n for n in proto.graph.node if n.op_type == onnx_export.OP_NAME]
    assert len(node.input) == 7 and all(node.input)  # omitted mask/noise became neutral constants
    session = ex.ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], OneLayer()(x).numpy(), atol=1e-5)

    decompose = lambda *a: lara_forward_cpu(LaraInputs(*a[:5], a[5], a[7], a[6]))  # noqa: E731 - op args -> _cpu args
    with mock.patch("lara_serve.kernels.api.lara_attention_op", side_effect=decompose):
        decomposed = _export_one_layer(x)
    assert onnx_export.count_lara_nodes(decomposed) == 0
    with pytest.raises(ex.ExportError, match="decomposed"):
        ex.check_graph(decomposed, expected_lara_nodes=1)


# ----------------------------------------------------------------------------- exported models
def test_graph_holds_one_lara_node_per_layer(artifact):
    model = artifact.model
    proto = onnx.load(str(artifact.path))
    layers = ex.lara_layer_count(model)
    assert layers >= 1
    ex.check_graph(proto, expected_lara_nodes=layers)  # includes onnx.checker full_check
    assert onnx_export.count_lara_nodes(proto) == layers
    bodies = [f for f in proto.functions if (f.domain, f.name) == (onnx_export.DOMAIN, onnx_export.OP_NAME)]
    assert len(bodies) == 1 and len(bodies[0].node) > 20
    assert [i.name for i in proto.graph.input] == ex.input_names(model.cfg)
    assert [o.name for o in proto.graph.output] == list(ex.output_names(model))
    assert artifact.shipped is False or ex.output_names(model) == ("logits", "ood_score")  # shipped: served head


def test_decomposed_graph_is_rejected(artifact):
    """A graph where the attention was inlined into standard ops must fail the export check."""
    proto = onnx.inliner.inline_local_functions(onnx.load(str(artifact.path)))
    assert onnx_export.count_lara_nodes(proto) == 0
    with pytest.raises(ex.ExportError, match="decomposed"):
        ex.check_graph(proto, expected_lara_nodes=ex.lara_layer_count(artifact.model))


def test_parity_with_eager(artifact, session):
    """Batch sizes 1..8 and lengths never traced at export (1, 37, 300, 1000, 4096)."""
    model = artifact.model
    rows = ex.measure_parity(model, model.cfg, session)
    assert len(rows) >= 3
    for row in rows:
        assert row["max_abs_diff"] <= ex.PARITY_ATOL, row
        assert row["argmax_equal"], row


def test_padding_and_batch_invariance(artifact, session):
    """A document's logits do not depend on the padding or the other members of its batch."""
    model = artifact.model
    cfg = model.cfg
    if isinstance(cfg, ex.ViTConfig):
        x = ex.make_inputs(cfg, ex.ParityCase(4))["pixel_values"]
        alone = session.run(["logits"], {"pixel_values": x[:1]})[0]
        batched = session.run(["logits"], {"pixel_values": x})[0][:1]
    else:
        rng = np.random.default_rng(7)
        doc = rng.integers(1, cfg.vocab_size, size=50, dtype=np.int64)
        alone = session.run(["logits"], {"input_ids": doc[None], "attention_mask": np.ones((1, 50), np.int64)})[0]
        ids = np.zeros((2, 333), np.int64)
        ids[0, :50] = doc
        ids[1] = rng.integers(1, cfg.vocab_size, size=333)
        mask = (ids > 0).astype(np.int64)
        ids[0, 50:] = 99  # whatever padded positions hold must not matter
        batched = session.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0][:1]
    np.testing.assert_allclose(batched, alone, atol=1e-5)


def test_export_keeps_the_torch_artifact(artifact):
    """Export adds model.onnx and config.json's "export" section, and leaves everything else alone."""
    model_dir = artifact.path.parent.parent
    conf = ex.load_config(model_dir)
    assert (artifact.path.parent / ex.WEIGHTS).is_file(), "export must not remove the PyTorch artifact"
    section = conf["export"]
    assert section["opset"] == ex.OPSET and section["lara_nodes"] == ex.lara_layer_count(artifact.model)
    assert section["parity"]["max_abs_diff"] <= ex.PARITY_ATOL
    assert artifact.path.stat().st_size < 20 * 2**20
    if artifact.before is not None:
        assert sha256(artifact.path.parent / ex.WEIGHTS) == sha256(artifact.before["weights"])
        assert {k: v for k, v in conf.items() if k != "export"} == artifact.before["conf"]


def test_shipped_parity_on_real_data(artifact, session, request):
    """Trained logits on real inputs (64 images, or 24 BBC documents up to their full length)."""
    if not artifact.shipped:
        pytest.skip("no shipped model.onnx yet: random-weight parity is covered above")
    conf = ex.load_config(artifact.path.parent.parent)
    if conf["task"] == "image":
        images, _ = request.getfixturevalue("fashion_test")
        pre = conf["preprocessing"]
        batches = [
            {"pixel_values": normalize_images(images[i : i + 32], pre["mean"], pre["std"]).numpy()} for i in (0, 32)
        ]
    else:
        docs = sorted(request.getfixturevalue("news_test"), key=lambda d: len(d.text))
        docs = docs[:8] + docs[len(docs) // 2 : len(docs) // 2 + 8] + docs[-8:]
        batches = []
        for i in range(0, len(docs), 8):
            ids, mask = pad_batch([encode_bytes(d.text, conf["preprocessing"]["max_length"]) for d in docs[i : i + 8]])
            batches.append({"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    for feeds in batches:
        ref = ex.eager_logits(artifact.model, feeds)
        got = session.run(["logits"], feeds)[0]
        assert np.abs(got - ref).max() <= ex.PARITY_ATOL
        assert np.array_equal(got.argmax(-1), ref.argmax(-1))


# ----------------------------------------------------------------------------- export behaviour
def test_eval_noise_is_an_initializer(tmp_path):
    """Fixed-noise eval (spec 7): the stored noise becomes an initializer feeding each node, no Random op.
    The shipped models evaluate at the proposal means, so a tiny fixed-noise model is exported here."""
    model = create_model("tiny-text", attention={"kind": "lara", "num_landmarks": 4, "eval_noise": "fixed"}).eval()
    buffers = [m.eval_noise for m in model.modules() if hasattr(m, "eval_noise")]
    assert buffers, "eval_noise='fixed' must register a noise buffer"
    proto = ex.export_onnx(model, model.cfg, tmp_path / "m.onnx")
    assert not [n for n in proto.graph.node if n.op_type.startswith("Random")]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    nodes = [n for n in proto.graph.node if n.op_type == onnx_export.OP_NAME]
    for node, noise in zip(nodes, buffers, strict=True):
        assert node.input[6] in inits and np.array_equal(inits[node.input[6]], noise.numpy())
    rows = ex.measure_parity(model, model.cfg, ex.make_session(tmp_path / "m.onnx"), [ex.ParityCase(2, 37)])
    assert rows[0]["max_abs_diff"] <= ex.PARITY_ATOL and rows[0]["argmax_equal"], rows


def test_export_is_deterministic(artifact, tmp_path):
    again = tmp_path / ex.ONNX_FILE
    ex.export_onnx(artifact.model, artifact.model.cfg, again)
    assert sha256(again) == sha256(artifact.path)


def test_parity_tolerance_is_absolute_for_small_logits_and_relative_for_large_ones():
    """1e-4 absolute up to |logit| 1; above, 1e-4 of the largest |logit| (a large head multiplies float32's
    rounding in the features); the ood score relative, and every argmax equal, as before."""
    row = {"max_abs_diff": 5e-4, "logit_scale": 1.0, "ood_max_rel_diff": 0.0, "argmax_equal": True}
    assert not ex.parity_ok([row])
    assert ex.parity_ok([{**row, "logit_scale": 10.0}])  # 5e-5 relative to logits of 10
    assert not ex.parity_ok([{**row, "logit_scale": 4.0}])  # 1.25e-4 relative
    assert not ex.parity_ok([{**row, "logit_scale": 10.0, "argmax_equal": False}])
    assert not ex.parity_ok([{**row, "logit_scale": 10.0, "ood_max_rel_diff": 2e-3}])
    assert ex.parity_ok([{"max_abs_diff": 5e-5, "argmax_equal": True}])  # a row without a scale: absolute


@pytest.mark.parametrize("kind", ["performer", "softmax"])
def test_baselines_export_with_standard_ops(tmp_path, kind):
    model = create_model("tiny-text", attention=kind).eval()
    proto = ex.export_onnx(model, model.cfg, tmp_path / "m.onnx")
    assert onnx_export.count_lara_nodes(proto) == 0
    rows = ex.measure_parity(model, model.cfg, ex.make_session(tmp_path / "m.onnx"), [ex.ParityCase(3, 45)])
    assert rows[0]["max_abs_diff"] <= ex.PARITY_ATOL and rows[0]["argmax_equal"], rows
