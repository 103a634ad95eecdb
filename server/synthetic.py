"""Tiny models that follow the model repository contract, for tests, benchmarks and trying the server
before trained models exist. Built with onnx.helper (no export step), plus the same weights as
model.safetensors and a matching torch module, so both backends can be checked against each other.

Text: embedding -> optional per-token ReLU MLP (compute knob) -> mean over real tokens -> linear. The
output of a text depends only on its real tokens, so results must not depend on batching or padding.
Image: flatten -> linear.

`ood=True` adds the second output of the model contract, `ood_score` [batch]: the mean squared distance of
the pooled representation to a stored centre (text: the mean over a few English sentences; image: a plain
dark picture), with config.json's `ood.threshold` (text: passes 95% of those sentences). `trigger` bytes
(text) get embeddings that push towards one label, so a test knows which bytes decide.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TEXT_LABELS = ["business", "sci_tech", "sports", "world"]
# In-distribution text of the synthetic text model's ood_score (its "training data").
ENGLISH = [
    b"The company reported higher profits this quarter as sales grew in every region.",
    b"Shares fell sharply after the bank warned that lending would slow next year.",
    b"The team won the final after a late goal in the second half of the match.",
    b"Scientists say the new telescope will help them study planets around other stars.",
    b"The minister said the government would publish its plans for schools next week.",
    b"Voters in the city will choose a new mayor at the election in the spring.",
    b"The film was praised by critics and won several awards at the festival.",
    b"Engineers tested the software for months before it was released to customers.",
    b"The coach said his players were tired but happy with the result on Saturday.",
    b"Prices of oil and gas rose again, adding to the cost of living for families.",
    b"A new report says more people are working from home than ever before.",
    b"The museum will open a new gallery of modern art to the public in June.",
    b"Police said the road was closed for several hours after the accident.",
    b"The singer announced a tour of twenty cities across the country this summer.",
    b"Researchers found that the drug reduced the risk of heart disease in older patients.",
    b"The airline cancelled hundreds of flights because of the storm on Monday.",
    b"Farmers say the dry weather has cut the harvest of wheat and barley this year.",
    b"The president met leaders of other nations to talk about trade and security.",
    b"The striker scored twice as the club moved to the top of the league table.",
    b"The central bank kept interest rates unchanged for the third month in a row.",
]
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


def _ood_nodes(pooled: str) -> list[onnx.NodeProto]:
    n = helper.make_node
    return [
        n("Sub", [pooled, "ood_center"], ["ood_diff"]),  # [B, D]
        n("Mul", ["ood_diff", "ood_diff"], ["ood_sq"]),  # [B, D]
        n("ReduceMean", ["ood_sq", "axis1"], ["ood_score"], keepdims=0),  # [B]
    ]


def _ood_config(threshold: float) -> dict[str, Any]:
    return {
        "outputs": [{"name": "ood_score", "datatype": "FP32", "shape": [-1]}],
        "ood": {"method": "synthetic-distance", "threshold": threshold, "holdout_pass_rate": 0.95},
        "calibration": {"method": "temperature", "temperature": 1.0, "note": "synthetic: not fitted"},
    }


def _pooled_text(weights: dict[str, np.ndarray], text: bytes) -> np.ndarray:
    """The text model's pooled representation [D] in numpy (the MLP-free path)."""
    return weights["embedding"][np.frombuffer(text, np.uint8).astype(np.int64) + 1].mean(axis=0)


def make_text_model(
    repository: Path,
    name: str = "tiny-text",
    max_length: int = 256,
    dim: int = 16,
    hidden: int = 0,
    seed: int = 0,
    ood: bool = False,
    trigger: bytes = b"",
    trigger_label: int = 2,
    trigger_strength: float = 40.0,
) -> Path:
    """hidden > 0 adds a per-token [dim -> hidden -> dim] ReLU MLP: compute that grows with tokens.
    ood: add the ood_score output and ood.threshold. trigger: these bytes push towards trigger_label."""
    vocab, n_labels = 257, len(TEXT_LABELS)
    shapes = {"embedding": (vocab, dim), "head_w": (dim, n_labels), "head_b": (1, n_labels)}
    if hidden:
        shapes |= {"mlp_w1": (dim, hidden), "mlp_w2": (hidden, dim)}
    weights = _weights(shapes, seed)
    column = weights["head_w"][:, trigger_label]  # [D]
    for byte in set(trigger):  # embedding . head_w[:, label] = strength: a clear vote for the label
        weights["embedding"][byte + 1] = trigger_strength * column / float(column @ column)
    threshold = 0.0
    if ood:
        if hidden:
            raise ValueError("ood=True is built for hidden=0 (the centre is computed without the MLP)")
        pooled = np.stack([_pooled_text(weights, t) for t in ENGLISH])  # [n, D]
        weights["ood_center"] = pooled.mean(axis=0, keepdims=True).astype(np.float32)  # [1, D]
        scores = ((pooled - weights["ood_center"]) ** 2).mean(axis=1)
        threshold = float(np.quantile(scores, 0.95))
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
        *(_ood_nodes("pooled") if ood else []),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_labels])]
    if ood:
        outputs.append(helper.make_tensor_value_info("ood_score", TensorProto.FLOAT, ["batch"]))
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "axis1"),
              numpy_helper.from_array(np.array([2], np.int64), "axis2")]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        outputs,
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
    if ood:
        extra = _ood_config(threshold)
        config |= {**extra, "outputs": config["outputs"] + extra["outputs"]}
    return _save(repository / name, config, graph, weights)


_IMAGE_MEAN, _IMAGE_STD = 0.286, 0.353


def make_image_model(
    repository: Path, name: str = "tiny-image", size: int = 28, seed: int = 0, ood: bool = False,
    ood_threshold: float = 1.0,
) -> Path:  # fmt: skip
    """ood: ood_score = mean squared distance (in normalized pixels) to a plain dark picture; noise scores
    about 2.7, a dark picture 0."""
    n_labels = len(IMAGE_LABELS)
    weights = _weights({"head_w": (size * size, n_labels), "head_b": (1, n_labels)}, seed)
    if ood:
        weights["ood_center"] = np.full((1, size * size), -_IMAGE_MEAN / _IMAGE_STD, np.float32)  # [1, H*W]
    n = helper.make_node
    nodes = [
        n("Flatten", ["pixel_values"], ["flat"], axis=1),  # [B, H*W]
        n("MatMul", ["flat", "head_w"], ["proj"]),  # [B, n_labels]
        n("Add", ["proj", "head_b"], ["logits"]),
        *(_ood_nodes("flat") if ood else []),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_labels])]
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    if ood:
        outputs.append(helper.make_tensor_value_info("ood_score", TensorProto.FLOAT, ["batch"]))
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 1, size, size])],
        outputs,
        inits,
    )
    config = {
        "name": name, "version": "1", "task": "image", "labels": IMAGE_LABELS,
        "inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [-1, 1, size, size]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, n_labels]}],
        "preprocessing": {"kind": "image", "height": size, "width": size, "channels": 1,
                          "mean": _IMAGE_MEAN, "std": _IMAGE_STD},
        "model": {"arch": "synthetic-image"}, "seed": seed,
    }  # fmt: skip
    if ood:
        extra = _ood_config(ood_threshold)
        config |= {**extra, "outputs": config["outputs"] + extra["outputs"]}
    return _save(repository / name, config, graph, weights)


def load_synthetic(model_dir: Path) -> Any:
    """The torch twin of a synthetic model (same weights): a stand-in for lara_serve.model_export.load_pretrained."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text())
    w = load_file(str(model_dir / config["version"] / "model.safetensors"))

    def heads(pooled: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        logits = pooled @ w["head_w"] + w["head_b"]  # [B, n_labels]
        if "ood_center" not in w:
            return logits
        return logits, ((pooled - w["ood_center"]) ** 2).mean(1)  # [B, n_labels], [B]

    class SyntheticText(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
            tokens = w["embedding"][input_ids]  # [B, L, D]
            if "mlp_w1" in w:
                tokens = tokens + torch.relu(tokens @ w["mlp_w1"]) @ w["mlp_w2"]
            mask = attention_mask.float()[..., None]  # [B, L, 1]
            return heads((tokens * mask).sum(1) / mask.sum(1))  # pooled [B, D]

    class SyntheticImage(torch.nn.Module):
        def forward(self, pixel_values: torch.Tensor) -> Any:
            return heads(pixel_values.flatten(1))  # [B, H*W]

    return SyntheticText() if config["task"] == "text" else SyntheticImage()
