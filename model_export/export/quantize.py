"""int8 weights for an exported graph whose large weights are stored in float16 (the converted MiniLM).

    python -m lara_serve.model_export.export.quantize SRC.onnx DST.onnx [--per-tensor]

What changes: each MatMul whose weight the export stored as float16 behind a Cast (`exporter.half_storage`)
gets int8 weights with one scale per output channel (onnxruntime's `quantize_dynamic`; activations are
quantized per call, uint8 with one scale per tensor). What does not: the LaraAttention nodes and their
function body (checked byte for byte), the landmark projections, the head and the ood whitening (float32
in the file, so never behind a Cast). research/minilm_int8.py measured why per channel: the same speed as
per tensor, and the BBC test split unchanged whole (100% agreement) where per tensor lost 1.2 points.

A model with a serving head also needs its temperature and ood threshold refitted on what the int8 graph
computes: `lara_serve.model_export.pretrained.int8` does that for lara-text-news.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

QUANTIZED_OP = "MatMulInteger"  # what quantize_dynamic turns each chosen MatMul into
# Projections kept in float32: the query and key projections feed LARA's exponentials (the proposals'
# importance weights and the kernel), where an int8 error is multiplied rather than added. Chosen on the
# holdout only (research/minilm_int8_layers.py): with all 36 projections int8 the holdout's headlines lost
# 1.9 points (5 of 262); with q and k float 0.4, at 0.58 of the float graph's time instead of 0.46.
FLOAT_PROJECTIONS = ("attn.query.weight", "attn.key.weight")


class QuantizeError(RuntimeError):
    """The graph cannot be quantized as this module promises (nothing to quantize, or the custom op changed)."""


def fold_float16_casts(model: onnx.ModelProto, only: Collection[str] | None = None) -> list[str]:
    """Replace each Cast(float16 initializer -> float32) by a float32 initializer named as the Cast's output
    (exact: float16 widens to float32 without rounding), so the quantizer sees the weight as the MatMul's own
    initializer. The float16 source is dropped unless another node still reads it. only: fold just the Casts
    with these outputs (the rest, e.g. the embedding table, stays float16 in the file). Returns the folded names."""
    inits = {i.name: i for i in model.graph.initializer}
    folded, sources, kept = [], set(), []
    for node in model.graph.node:
        src = inits.get(node.input[0]) if node.op_type == "Cast" else None
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        wanted = only is None or node.output[0] in only
        if src is None or src.data_type != onnx.TensorProto.FLOAT16 or to != onnx.TensorProto.FLOAT or not wanted:
            kept.append(node)
            continue
        wide = numpy_helper.to_array(src).astype(np.float32)
        model.graph.initializer.append(numpy_helper.from_array(wide, node.output[0]))
        folded.append(node.output[0])
        sources.add(src.name)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    still_read = {i for node in kept for i in node.input}
    for init in [i for i in model.graph.initializer if i.name in sources and i.name not in still_read]:
        model.graph.initializer.remove(init)
    return folded


def custom_op_unchanged(before: onnx.ModelProto, after: onnx.ModelProto) -> bool:
    """The com.lara nodes (at least one) and the model-local function bodies, byte for byte."""

    def custom(model: onnx.ModelProto) -> list[bytes]:
        nodes = [n.SerializeToString() for n in model.graph.node if n.domain == "com.lara"]
        return nodes + [f.SerializeToString() for f in model.functions]

    return any(n.domain == "com.lara" for n in after.graph.node) and custom(before) == custom(after)


def quantize_file(src: Path, dst: Path, per_channel: bool = True, skip: Collection[str] = ()) -> dict[str, Any]:
    """src (a float export) -> dst with int8 weights on the float16-stored MatMuls, but those named in skip;
    what was done, for config.json. QuantizeError when src has no such MatMul (e.g. it is already quantized)
    or the custom op would change."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(src)
    before = onnx.ModelProto()
    before.CopyFrom(model)  # the custom op as it was, to check after quantization
    matmul_weights = {n.input[1] for n in model.graph.node if n.op_type == "MatMul" and n.name not in skip}
    folded = set(fold_float16_casts(model, only=matmul_weights))  # the embedding tables stay float16
    targets = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in folded]
    if not targets:
        raise QuantizeError(f"{src}: no MatMul reads a float16-stored weight (already quantized, or not a "
                            "half-storage export)")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="lara-int8-") as tmp:
        folded_path = Path(tmp) / "fp32.onnx"
        onnx.save(model, folded_path)
        quantize_dynamic(folded_path, dst, weight_type=QuantType.QInt8, per_channel=per_channel,
                         nodes_to_quantize=targets, op_types_to_quantize=["MatMul"])  # fmt: skip
    out = onnx.load(dst)
    quantized = sum(n.op_type == QUANTIZED_OP for n in out.graph.node)
    if quantized != len(targets) or not custom_op_unchanged(before, out):
        dst.unlink()
        raise QuantizeError(f"{src}: quantization missed a target MatMul ({quantized} of {len(targets)}) or "
                            "changed LaraAttention")  # fmt: skip
    return {
        "kind": "onnxruntime quantize_dynamic",
        "weights": "int8, one scale per output channel" if per_channel else "int8, one scale per tensor",
        "activations": "uint8, one scale per tensor, computed per call",
        "quantized_matmuls": len(targets),
        **({"float_matmuls": len(skip)} if skip else {}),
        "unchanged": "LaraAttention nodes and function body (checked byte for byte); float32 weights: landmark "
        "projections, head, ood whitening",
        "float_size_bytes": src.stat().st_size,
        "size_bytes": dst.stat().st_size,
    }


def scalar_initializer(path: Path, name: str) -> float:
    """The value of the graph's scalar initializer `name` (ValueError when it has none)."""
    init = next((i for i in onnx.load(path).graph.initializer if i.name == name), None)
    if init is None or list(init.dims):
        raise ValueError(f"{path}: no scalar initializer {name!r}")
    return float(numpy_helper.to_array(init))


def set_initializer(path: Path, name: str, value: float) -> None:
    """Rewrite one scalar float32 initializer of the graph at path, in place."""
    proto = onnx.load(path)
    init = next((i for i in proto.graph.initializer if i.name == name), None)
    if init is None or init.data_type != onnx.TensorProto.FLOAT or list(init.dims):
        raise ValueError(f"{path}: no scalar float32 initializer {name!r}")
    init.CopyFrom(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
    onnx.save(proto, path)


def ensure_temperature(path: Path, name: str = "temperature", output: str = "logits") -> bool:
    """Give back the division of `output` by a scalar initializer `name` (1.0) where the export folded it away
    (head.finalize keeps T = 1 when the holdout has no errors), so that set_initializer can set another; the
    graph computes the same. Returns whether it was added (False: the graph has one)."""
    proto = onnx.load(path)
    if any(i.name == name for i in proto.graph.initializer):
        return False
    before = f"{output}_before_{name}"
    producers = [n for n in proto.graph.node if output in n.output]
    if len(producers) != 1:
        raise ValueError(f"{path}: no single node computes {output!r}")
    for node in proto.graph.node:  # its producer and any reader inside the graph keep the undivided value
        for field in (node.output, node.input):
            for i, value in enumerate(field):
                if value == output:
                    field[i] = before
    proto.graph.initializer.append(numpy_helper.from_array(np.asarray(1.0, dtype=np.float32), name))
    proto.graph.node.append(onnx.helper.make_node("Div", [before, name], [output], name=f"divide_by_{name}"))
    onnx.save(proto, path)
    return True


def matmuls_of(graph_path: Path, weights_path: Path, suffixes: Sequence[str]) -> list[str]:
    """The MatMul nodes of the exported graph whose float16-stored weight is, value for value, the transpose
    of a weight in the safetensors file whose name ends with one of suffixes (the export names MatMul weights
    by number, not by module)."""
    from safetensors.numpy import load_file

    wanted = {
        np.ascontiguousarray(v.T).astype(np.float16).tobytes(): k
        for k, v in load_file(str(weights_path)).items()
        if k.endswith(tuple(suffixes)) and v.ndim == 2
    }
    model = onnx.load(graph_path)
    inits = {i.name: i for i in model.graph.initializer}
    cast_src = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Cast" and n.input[0] in inits}
    found = []
    for node in model.graph.node:
        src = cast_src.get(node.input[1]) if node.op_type == "MatMul" else None
        if src is not None and numpy_helper.to_array(inits[src]).tobytes() in wanted:
            found.append(node.name)
    if len(found) != len(wanted):
        raise ValueError(f"{graph_path}: found {len(found)} of the {len(wanted)} MatMuls of {list(suffixes)}")
    return found


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--per-tensor", action="store_true", help="one scale per weight tensor (default: per channel)")
    args = p.parse_args(argv)
    if args.src.resolve() == args.dst.resolve():
        raise SystemExit("DST must differ from SRC: the float graph is the input of any later refit")
    try:
        print(json.dumps(quantize_file(args.src, args.dst, per_channel=not args.per_tensor), indent=2))
    except QuantizeError as exc:
        raise SystemExit(str(exc)) from exc


if __name__ == "__main__":
    main()
