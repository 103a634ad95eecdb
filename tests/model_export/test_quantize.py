"""export.quantize's graph surgery on a tiny graph shaped like the converted MiniLM's: float16-stored weights
behind Casts (a projection read by a MatMul, an embedding table read by a Gather), a com.lara::LaraAttention
node with its function body, a float32 weight that must stay as it is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lara_serve.model_export.export.quantize import (
    QuantizeError,
    custom_op_unchanged,
    ensure_temperature,
    fold_float16_casts,
    main,
    quantize_file,
    scalar_initializer,
    set_initializer,
)

DIM, VOCAB = 16, 64


def tiny_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w16 = numpy_helper.from_array(rng.standard_normal((DIM, DIM)).astype(np.float16), "w__float16")
    emb16 = numpy_helper.from_array(rng.standard_normal((VOCAB, DIM)).astype(np.float16), "emb__float16")
    head = numpy_helper.from_array(rng.standard_normal((DIM, 4)).astype(np.float32), "head")
    nodes = [
        helper.make_node("Cast", ["w__float16"], ["w"], to=TensorProto.FLOAT, name="cast_w"),
        helper.make_node("Cast", ["emb__float16"], ["emb"], to=TensorProto.FLOAT, name="cast_emb"),
        helper.make_node("Gather", ["emb", "ids"], ["x"], name="embed"),
        helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
        helper.make_node("LaraAttention", ["h"], ["a"], domain="com.lara", name="lara"),
        helper.make_node("MatMul", ["a", "head"], ["y"], name="head_mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", 4])],
        [w16, emb16, head],
    )
    body = helper.make_function(
        "com.lara", "LaraAttention", ["q"], ["o"], [helper.make_node("Relu", ["q"], ["o"])],
        [helper.make_opsetid("", 20)],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.lara", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[body], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


IDS = np.random.default_rng(1).integers(0, VOCAB, size=(1, 37), dtype=np.int64)


def run(model: onnx.ModelProto | Path) -> np.ndarray:
    src = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(["y"], {"ids": IDS})[0]


def test_fold_all_or_only_the_named_casts_with_the_same_outputs() -> None:
    model, reference = tiny_model(), run(tiny_model())
    assert sorted(fold_float16_casts(model)) == ["emb", "w"]
    assert not [n for n in model.graph.node if n.op_type == "Cast"]
    assert {i.name: i.data_type for i in model.graph.initializer}["w"] == TensorProto.FLOAT
    np.testing.assert_array_equal(run(model), reference)  # float16 -> float32 is exact

    only = tiny_model()
    assert fold_float16_casts(only, only={"w"}) == ["w"]
    inits = {i.name: i.data_type for i in only.graph.initializer}
    assert inits["emb__float16"] == TensorProto.FLOAT16 and "w__float16" not in inits
    np.testing.assert_array_equal(run(only), reference)


def test_quantize_touches_only_the_float16_matmuls_and_keeps_the_rest(tmp_path: Path) -> None:
    src, dst = tmp_path / "model.onnx", tmp_path / "int8.onnx"
    onnx.save(tiny_model(), src)
    notes = quantize_file(src, dst)
    assert notes["quantized_matmuls"] == 1 and "per output channel" in notes["weights"]
    q = onnx.load(dst)
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("MatMulInteger") == 1 and ops.count("LaraAttention") == 1
    assert next(n for n in q.graph.node if n.op_type == "MatMul").input[1] == "head"  # float32: untouched
    assert {i.name: i.data_type for i in q.graph.initializer}["emb__float16"] == TensorProto.FLOAT16
    reference, got = run(src), run(dst)
    err = np.abs(got - reference).max() / np.abs(reference).max()
    assert 0 < err < 0.05, err  # quantized (not bit-equal), and close
    with pytest.raises(QuantizeError, match="already quantized"):
        quantize_file(dst, tmp_path / "again.onnx")
    assert not (tmp_path / "again.onnx").exists()


def test_custom_op_check_notices_a_changed_body_or_node() -> None:
    shipped = tiny_model()
    assert custom_op_unchanged(shipped, tiny_model())
    body = tiny_model()
    body.functions[0].node[0].op_type = "Sigmoid"
    assert not custom_op_unchanged(shipped, body)
    node = tiny_model()
    next(n for n in node.graph.node if n.domain == "com.lara").input[0] = "x"
    assert not custom_op_unchanged(shipped, node)


def test_command_refuses_to_overwrite_its_source(tmp_path: Path) -> None:
    src = tmp_path / "model.onnx"
    onnx.save(tiny_model(), src)
    with pytest.raises(SystemExit, match="DST must differ"):
        main([str(src), str(src)])
    main([str(src), str(tmp_path / "out.onnx")])
    assert (tmp_path / "out.onnx").is_file()


def test_a_folded_temperature_is_given_back_as_a_division_by_one(tmp_path: Path) -> None:
    """export.quantize.ensure_temperature: a graph whose export folded logits / 1.0 away gets the division back
    (same outputs), after which set_initializer rescales the output; a graph that has it is left alone."""
    path = tmp_path / "model.onnx"
    model = tiny_model()
    model.graph.output[0].name = "logits"
    model.graph.node[-1].output[0] = "logits"
    onnx.save(model, path)
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], {"ids": IDS})[0]
    assert ensure_temperature(path) and not ensure_temperature(path)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    assert scalar_initializer(path, "temperature") == 1.0

    def logits() -> np.ndarray:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], {"ids": IDS})[0]

    np.testing.assert_array_equal(logits(), reference)
    set_initializer(path, "temperature", 4.0)
    np.testing.assert_allclose(logits(), reference / 4.0, rtol=1e-6)
