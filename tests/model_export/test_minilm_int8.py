"""research.minilm_int8's two variants (one scale per tensor, per channel) on test_quantize's tiny graph
(export.quantize itself is tested there), and its refusal to write inside model_repository/."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from research.minilm_int8 import main, quantize
from tests.model_export.test_quantize import run, tiny_model


def test_both_variants_quantize_the_float16_matmul_and_keep_the_rest(tmp_path: Path) -> None:
    src = tmp_path / "model.onnx"
    onnx.save(tiny_model(), src)
    info = quantize(src, tmp_path / "work")
    assert info["folded_casts"] == 2 and info["quantized_matmuls"] == 1  # fp32.onnx: the embedding folded too
    reference = run(src)
    np.testing.assert_array_equal(run(tmp_path / "work" / "fp32.onnx"), reference)
    errors = {}
    for name in ("int8", "int8_per_channel"):
        q = onnx.load(tmp_path / "work" / f"{name}.onnx")
        ops = [n.op_type for n in q.graph.node]
        assert ops.count("MatMulInteger") == 1 and ops.count("MatMul") == 1 and ops.count("LaraAttention") == 1
        got = run(tmp_path / "work" / f"{name}.onnx")
        errors[name] = np.abs(got - reference).max() / np.abs(reference).max()
        assert 0 < errors[name] < 0.05, (name, errors[name])  # quantized (not bit-equal), and close
    assert errors["int8"] != errors["int8_per_channel"]  # two different quantizations


def test_refuses_to_work_inside_the_model_repository() -> None:
    from benchmarks.pretrained_cost import REPOSITORY

    with pytest.raises(SystemExit, match="model_repository"):
        main(["--work", str(REPOSITORY / "lara-text-news" / "int8")])
    assert not (REPOSITORY / "lara-text-news" / "int8").exists()
