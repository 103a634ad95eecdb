"""Tiny models that follow the model repository contract, for tests, benchmarks and trying the server
before trained models exist. Built with onnx.helper (no export step), plus the same weights as
model.safetensors and a matching torch module, so both backends can be checked against each other.

Text: embedding -> optional per-token ReLU MLP (compute knob) -> mean over real tokens -> linear. The
output of a text depends only on its real tokens, so results must not depend on batching or padding.
Image: flatten -> linear.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TEXT_LABELS = ["business", "sci_tech", "sports", "world"]
IMAGE_LABELS = ["tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]
_OPSET = 18


def _weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for k, s in shapes.items()}


def _save(model_dir: Path, config: dict[str, Any], graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    version_dir = model_dir / config["version"]
    version_dir.mkdir(parents=True, exist_ok=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, version_dir / "model.onnx")
    save_file(weights, str(version_dir / "model.safetensors"))
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return model_dir


def make_text_model(
    repository: Path,
    name: str = "tiny-text",
    max_length: int = 256,
    dim: int = 16,
    hidden: int = 0,
    seed: int = 0,
) -> Path:
    """hidden > 0 adds a per-token [dim -> hidden -> dim] ReLU MLP: compute that grows with tokens."""
    vocab, n_labels = 257, len(TEXT_LABELS)
    shapes = {"embedding": (vocab, dim), "head_w": (dim, n_labels), "head_b": (1, n_labels)}
    if hidden:
        shapes |= {"mlp_w1": (dim, hidden), "mlp_w2": (hidden, dim)}
    weights = _weights(shapes, seed)
    n = helper.make_node
    nodes = [
        n("Gather", ["embedding", "input_ids"], ["emb"]),  # [B, L, D]
        n("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),  # [B, L]
        n("Unsqueeze", ["mask_f", "axis2"], ["mask3"]),  # [B, L, 1]
    ]
    tokens = "emb"
    if hidden:
        nodes += [
            n("MatMul", ["emb", "mlp_w1"], ["h1"]),  # [B, L, H]
            n("Relu", ["h1"], ["h1r"]),
            n("MatMul", ["h1r", "mlp_w2"], ["h2"]),  # [B, L, D]
            n("Add", ["emb", "h2"], ["tokens"]),
        ]
        tokens = "tokens"
    nodes += [
        n("Mul", [tokens, "mask3"], ["masked"]),  # padding contributes exact zeros
        n("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),  # [B, D]
        n("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),  # [B, 1]
        n("Div", ["summed", "count"], ["pooled"]),  # [B, D]
        n("MatMul", ["pooled", "head_w"], ["proj"]),  # [B, n_labels]
        n("Add", ["proj", "head_b"], ["logits"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "axis1"),
              numpy_helper.from_array(np.array([2], np.int64), "axis2")]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_labels])],
        inits,
    )  # fmt: skip
    config = {
        "name": name, "version": "1", "task": "text", "labels": TEXT_LABELS,
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                   {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, n_labels]}],
        "preprocessing": {"kind": "bytes", "max_length": max_length, "pad_id": 0, "byte_offset": 1},
        "model": {"arch": "synthetic-text", "vocab_size": vocab, "dim": dim, "hidden": hidden}, "seed": seed,
    }  # fmt: skip
    return _save(repository / name, config, graph, weights)


def make_image_model(repository: Path, name: str = "tiny-image", size: int = 28, seed: int = 0) -> Path:
    n_labels = len(IMAGE_LABELS)
    weights = _weights({"head_w": (size * size, n_labels), "head_b": (1, n_labels)}, seed)
    n = helper.make_node
    nodes = [
        n("Flatten", ["pixel_values"], ["flat"], axis=1),  # [B, H*W]
        n("MatMul", ["flat", "head_w"], ["proj"]),  # [B, n_labels]
        n("Add", ["proj", "head_b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 1, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_labels])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    config = {
        "name": name, "version": "1", "task": "image", "labels": IMAGE_LABELS,
        "inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [-1, 1, size, size]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, n_labels]}],
        "preprocessing": {"kind": "image", "height": size, "width": size, "channels": 1,
                          "mean": 0.286, "std": 0.353},
        "model": {"arch": "synthetic-image"}, "seed": seed,
    }  # fmt: skip
    return _save(repository / name, config, graph, weights)


def load_synthetic(model_dir: Path) -> Any:
    """The torch twin of a synthetic model (same weights): a stand-in for model_export.load_pretrained."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text())
    w = load_file(str(model_dir / config["version"] / "model.safetensors"))

    class SyntheticText(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            tokens = w["embedding"][input_ids]  # [B, L, D]
            if "mlp_w1" in w:
                tokens = tokens + torch.relu(tokens @ w["mlp_w1"]) @ w["mlp_w2"]
            mask = attention_mask.float()[..., None]  # [B, L, 1]
            pooled = (tokens * mask).sum(1) / mask.sum(1)  # [B, D]
            return pooled @ w["head_w"] + w["head_b"]  # [B, n_labels]

    class SyntheticImage(torch.nn.Module):
        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return pixel_values.flatten(1) @ w["head_w"] + w["head_b"]  # [B, n_labels]

    return SyntheticText() if config["task"] == "text" else SyntheticImage()
