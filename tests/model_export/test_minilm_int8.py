"""research.minilm_int8 (export.quantize tested in test_quantize)'s graph surgery on a tiny model shaped like the shipped one: a float16-stored weight
behind a Cast, a com.lara::LaraAttention node with its function body, a float32 weight that must stay as is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from research.minilm_int8 import main, quantize

DIM = 16


def tiny_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w16 = numpy_helper.from_array(rng.standard_normal((DIM, DIM)).astype(np.float16), "w__float16")
    w2 = numpy_helper.from_array(rng.standard_normal((DIM, 4)).astype(np.float32), "head")
    nodes = [
        helper.make_node("Cast", ["w__float16"], ["w"], to=TensorProto.FLOAT, name="cast_w"),
        helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
        helper.make_node("LaraAttention", ["h"], ["a"], domain="com.lara", name="lara"),
        helper.make_node("MatMul", ["a", "head"], ["y0"], name="head_mm"),
        helper.make_node("Cast", ["y0"], ["y"], to=TensorProto.FLOAT, name="cast_act"),  # an activation's Cast
        helper.make_node("Identity", ["w__float16"], ["w_half"], name="reads_half"),  # the float16 weight read again
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", DIM])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", 4]),
            helper.make_tensor_value_info("w_half", TensorProto.FLOAT16, [DIM, DIM]),
        ],
        [w16, w2],
    )
    body = helper.make_function(
        "com.lara", "LaraAttention", ["q"], ["o"], [helper.make_node("Relu", ["q"], ["o"])],
        [helper.make_opsetid("", 20)],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.lara", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[body], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


def run(model: onnx.ModelProto | Path, x: np.ndarray) -> np.ndarray:
    src = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]


X = np.random.default_rng(1).standard_normal((1, 37, DIM)).astype(np.float32)


def test_quantize_touches_only_the_folded_matmuls_and_keeps_the_custom_op(tmp_path: Path) -> None:
    src = tmp_path / "model.onnx"
    onnx.save(tiny_model(), src)
    info = quantize(src, tmp_path / "work")
    assert info["folded_casts"] == 1 and info["quantized_matmuls"] == 1
    reference = run(src, X)
    for name in ("int8", "int8_per_channel"):
        q = onnx.load(tmp_path / "work" / f"{name}.onnx")
        ops = [n.op_type for n in q.graph.node]
        assert ops.count("MatMulInteger") == 1 and ops.count("MatMul") == 1 and ops.count("LaraAttention") == 1
        assert next(n for n in q.graph.node if n.op_type == "MatMul").input[1] == "head"
        got = run(tmp_path / "work" / f"{name}.onnx", X)
        err = np.abs(got - reference).max() / np.abs(reference).max()
        assert 0 < err < 0.05, (name, err)  # quantized (not bit-equal), and close


def test_refuses_to_work_inside_the_model_repository() -> None:
    from benchmarks.pretrained_cost import REPOSITORY

    with pytest.raises(SystemExit, match="model_repository"):
        main(["--work", str(REPOSITORY / "lara-news-minilm" / "int8")])
    assert not (REPOSITORY / "lara-news-minilm" / "int8").exists()
