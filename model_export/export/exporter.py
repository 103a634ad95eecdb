"""Export a model to ONNX with one `com.lara::LaraAttention` node per LARA layer, then check it.

    python -m lara_serve.model_export.export --model lara-text-news-bytes --out model_repository/

reads `model_repository/<name>/config.json` + `1/model.safetensors` (the PyTorch artifact written by
training, never rewritten here), writes `1/model.onnx` and adds an "export" section to config.json
(opset, versions, parity measured against PyTorch eager). `--random-init` builds the registered model
with random weights when no trained artifact exists (then it writes the PyTorch artifact too). A text model's
sliced program for long documents (`1/sliced/`) is written by `python -m lara_serve.model_export.export.sliced`.

Checks on every export: `onnx.checker` full check; exactly one LaraAttention node per LARA layer (the
export fails rather than ship a decomposed graph); onnxruntime vs PyTorch eager logits at several batch
sizes and at sequence lengths other than the export example's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import onnxscript
import torch
from torch import nn

from lara_serve.kernels import onnx_export
from lara_serve.model_export.models.bert_lara import LaraMixer
from lara_serve.model_export.models.config import BertTextConfig, ModelConfig, TextConfig, ViTConfig
from lara_serve.model_export.models.hub import (
    LIGHT_ON_BLACK,
    VERSION,
    WEIGHTS,
    load_config,
    load_pretrained,
    make_config_dict,
    save_pretrained,
)
from lara_serve.model_export.models.layers import Attention

OPSET = 20  # the exporter's default and the opset of the LaraAttention function body
ONNX_FILE = "model.onnx"
# max |onnxruntime - eager| on logits accepted at export, for logits up to 1 in size; above, relative to the
# largest: float32 rounding in the features reaches the logits multiplied by the head's weights, and a head
# fitted with little regularization (`lara train`'s frozen encoder: C up to 1,000 on 2,688 layer means) gives
# logits of tens, where 1e-4 is 1e-6 relative, float32's own rounding of a 2,688-term sum.
PARITY_ATOL = 1e-4
# ood_score is a squared distance (order 1e1-1e3) through a 128x128 whitening, which amplifies the ~1e-6
# float32 differences of the features along its narrow directions: 1.1e-4 relative was seen on a random
# tiny model at 4-8 KB. 1e-3 relative still catches a wrong graph (a wrong mean or mask moves it by >10%).
OOD_PARITY_RTOL = 1e-3
EXPORT_BATCH, EXPORT_SEQ = 2, 64  # example shapes traced at export; parity runs other shapes


class ExportError(RuntimeError):
    """The exported graph is not what we ship: wrong LaraAttention count, or parity out of tolerance."""


@dataclass(frozen=True)
class ParityCase:
    batch: int
    seq: int | None = None  # text only
    pad: bool = True  # text: shorter real lengths for all but the first row


def default_cases(cfg: ModelConfig) -> list[ParityCase]:
    """Batch sizes 1..8; text lengths short (1, 37), long (1000, 4096) and the longest accepted (max_length),
    none equal to EXPORT_SEQ: a graph that serves 64 KB is checked at 64 KB."""
    if isinstance(cfg, ViTConfig):
        return [ParityCase(1), ParityCase(3), ParityCase(8)]
    long = min(4096, cfg.max_length)
    cases = [ParityCase(1, 1), ParityCase(3, 37), ParityCase(8, 300), ParityCase(2, 1000), ParityCase(1, long)]
    return cases + ([ParityCase(1, cfg.max_length)] if cfg.max_length > long else [])


def lara_layer_count(model: nn.Module) -> int:
    """LARA attention layers in `model`: each must become exactly one LaraAttention node."""
    layers = sum(1 for m in model.modules() if isinstance(m, Attention) and m.cfg.kind == "lara")
    return layers + sum(1 for m in model.modules() if isinstance(m, LaraMixer))  # a converted BERT's layers


def input_names(cfg: ModelConfig) -> list[str]:
    return ["pixel_values"] if isinstance(cfg, ViTConfig) else ["input_ids", "attention_mask"]


def make_inputs(cfg: ModelConfig, case: ParityCase, seed: int = 0) -> dict[str, np.ndarray]:
    """Random valid inputs: normalized-looking pixels, or byte ids with right padding per row."""
    rng = np.random.default_rng(seed)
    if isinstance(cfg, ViTConfig):
        shape = (case.batch, cfg.in_chans, cfg.image_size, cfg.image_size)
        return {"pixel_values": rng.standard_normal(shape).astype(np.float32)}
    b, n = case.batch, case.seq or EXPORT_SEQ
    ids = rng.integers(1, cfg.vocab_size, size=(b, n), dtype=np.int64)
    lengths = np.full(b, n)
    if case.pad and b > 1:
        lengths[1:] = rng.integers(1, n + 1, size=b - 1)
    mask = (np.arange(n)[None, :] < lengths[:, None]).astype(np.int64)  # [B, N], 1 = real
    return {"input_ids": ids * mask, "attention_mask": mask}


def _dynamic_shapes(cfg: ModelConfig, max_length: int | None) -> dict[str, dict[int, Any]]:
    batch = torch.export.Dim("batch", min=1)
    if isinstance(cfg, ViTConfig):
        return {"pixel_values": {0: batch}}
    seq = torch.export.Dim("sequence", min=1, max=max_length or cfg.max_length)
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}


def export_onnx(model: nn.Module, cfg: ModelConfig, path: str | Path, max_length: int | None = None) -> onnx.ModelProto:
    """Export `model` (eval mode) to `path`; raises ExportError unless every LARA layer is one node.

    Dynamic axes: batch (any size) and, for text, sequence (1..max_length, default cfg.max_length).
    """
    if isinstance(cfg, TextConfig | BertTextConfig) and max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    model = model.eval()
    example = make_inputs(cfg, ParityCase(EXPORT_BATCH, EXPORT_SEQ))
    args = tuple(torch.from_numpy(example[n]) for n in input_names(cfg))
    with torch.no_grad():
        program = torch.onnx.export(
            model,
            args,
            dynamo=True,
            opset_version=OPSET,
            input_names=input_names(cfg),
            output_names=list(output_names(model)),
            dynamic_shapes=_dynamic_shapes(cfg, max_length),
            custom_translation_table=onnx_export.custom_translation_table(),
            verbose=False,
        )
    proto = half_storage(strip_debug_metadata(onnx_export.attach_lara_function(program.model_proto)))
    check_graph(proto, expected_lara_nodes=lara_layer_count(model))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(path))
    return proto


HALF_MIN_ELEMENTS = 1 << 16


def half_storage(proto: onnx.ModelProto, min_elements: int = HALF_MIN_ELEMENTS) -> onnx.ModelProto:
    """Float32 initializers of at least min_elements values that float16 holds exactly (a model whose weights
    were rounded to float16 before export, e.g. the converted MiniLM) are stored as float16 and widened by a
    Cast at the top of the graph: the file halves, the values the graph computes with are the same bits.
    Weights trained in float32 are almost never exact in float16 and stay as they are."""
    from onnx import helper, numpy_helper

    graph = proto.graph
    kept, casts = [], []
    for init in graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT or np.prod(init.dims, dtype=np.int64) < min_elements:
            kept.append(init)
            continue
        values = numpy_helper.to_array(init)
        half = values.astype(np.float16)
        if not np.array_equal(half.astype(np.float32), values):
            kept.append(init)
            continue
        kept.append(numpy_helper.from_array(half, init.name + "__float16"))
        casts.append(helper.make_node("Cast", [init.name + "__float16"], [init.name], to=onnx.TensorProto.FLOAT))
    if casts:
        del graph.initializer[:]
        graph.initializer.extend(kept)
        nodes = list(graph.node)
        del graph.node[:]
        graph.node.extend(casts + nodes)
    return proto


def strip_debug_metadata(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Drop the exporter's per-node/value debug metadata (stack traces with absolute paths and line
    numbers, FX node text): it changes with every source edit and checkout, so keeping it would make the
    shipped file differ between identical exports."""
    for node in proto.graph.node:
        del node.metadata_props[:]
    for value in [*proto.graph.value_info, *proto.graph.input, *proto.graph.output, *proto.graph.initializer]:
        del value.metadata_props[:]
    return proto


def check_graph(proto: onnx.ModelProto, expected_lara_nodes: int) -> None:
    """Full ONNX check, one LaraAttention node per LARA layer with its function body, no random ops."""
    found = onnx_export.count_lara_nodes(proto)
    if found != expected_lara_nodes:
        raise ExportError(
            f"expected {expected_lara_nodes} {onnx_export.DOMAIN}::{onnx_export.OP_NAME} nodes (one per LARA "
            f"layer), found {found}: the export fell back to a decomposed graph or lost a layer"
        )
    has_body = any((f.domain, f.name) == (onnx_export.DOMAIN, onnx_export.OP_NAME) for f in proto.functions)
    if expected_lara_nodes and not has_body:
        raise ExportError("LaraAttention nodes without the function body: stock onnxruntime cannot load this")
    random_ops = sorted({n.op_type for n in proto.graph.node if n.op_type.startswith("Random")})
    if random_ops:
        raise ExportError(f"graph holds random ops {random_ops}: eval noise must be an initializer")
    onnx.checker.check_model(proto, full_check=True)


def make_session(path: str | Path, threads: int = 0, level: str = "all", fused: bool = False) -> ort.InferenceSession:
    """A CPU onnxruntime session; level: "disable" | "basic" | "extended" | "all" graph optimizations.

    fused: LaraAttention runs as the fused kernel (`lara_serve.kernels.ort_library`) instead of its function body;
    RuntimeError when that kernel is unavailable here."""
    opts = ort.SessionOptions()
    if fused:
        from lara_serve.kernels import ort_library

        if not ort_library.register(opts):
            raise RuntimeError(f"the fused LaraAttention kernel is unavailable: {ort_library.unavailable_reason()}")
    opts.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def output_names(model: nn.Module) -> tuple[str, ...]:
    """("logits",), or ("logits", "ood_score") for a model with its serving head (lara_serve.model_export.models.ood)."""
    return tuple(getattr(model, "output_names", ("logits",)))


@torch.no_grad()
def eager_outputs(model: nn.Module, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    out = model.eval()(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def eager_logits(model: nn.Module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return eager_outputs(model, inputs)[0]


def measure_parity(
    model: nn.Module, cfg: ModelConfig, session: ort.InferenceSession, cases: list[ParityCase] | None = None
) -> list[dict[str, Any]]:
    """onnxruntime vs PyTorch eager per case: max |diff| of logits and whether every argmax agrees."""
    rows = []
    names = [o.name for o in session.get_outputs()]
    for i, case in enumerate(cases or default_cases(cfg)):
        inputs = make_inputs(cfg, case, seed=100 + i)
        refs = eager_outputs(model, inputs)
        got = session.run(names[: len(refs)], inputs)
        row: dict[str, Any] = {"batch": case.batch}
        if case.seq is not None:
            row["seq"] = case.seq
        row["max_abs_diff"] = float(np.abs(got[0] - refs[0]).max())
        row["logit_scale"] = float(max(np.abs(refs[0]).max(), 1.0))  # what the tolerance scales with (parity_ok)
        row["argmax_equal"] = bool((got[0].argmax(-1) == refs[0].argmax(-1)).all())
        if len(refs) > 1:  # the ood score: a squared distance of order 1e2, compared relative to its size
            row["ood_max_rel_diff"] = float((np.abs(got[1] - refs[1]) / np.maximum(np.abs(refs[1]), 1.0)).max())
        rows.append(row)
    return rows


def parity_ok(rows: list[dict[str, Any]]) -> bool:
    """Every case's logits within PARITY_ATOL x max(1, its largest |logit|), its ood score within OOD_PARITY_RTOL,
    and every argmax equal."""
    return all(
        r["max_abs_diff"] <= PARITY_ATOL * r.get("logit_scale", 1.0)
        and r.get("ood_max_rel_diff", 0.0) <= OOD_PARITY_RTOL
        and r["argmax_equal"]
        for r in rows
    )


def _versions() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxscript": onnxscript.__version__,
        "onnxruntime": ort.__version__,
    }


def export_model_dir(
    model_dir: str | Path, name: str | None = None, random_init: bool = False, max_length: int | None = None
) -> dict[str, Any]:
    """Export `<model_dir>/1/model.onnx` from the artifact in model_dir; returns the "export" section.

    The trained artifact (config.json + 1/model.safetensors) is read, never rewritten: only config.json's
    "export" key changes. With random_init and no artifact, the registered model `name` is built with
    random weights and saved first, so the directory holds a consistent torch + ONNX pair.
    """
    from lara_serve.model_export.models.registry import DATASETS, LABELS, get_config
    from lara_serve.model_export.models.registry import build_model as build

    model_dir = Path(model_dir)
    weights = model_dir / VERSION / WEIGHTS
    if not weights.is_file():
        if not random_init:
            raise FileNotFoundError(f"{weights} not found: train first, or pass --random-init")
        cfg0 = get_config(name or model_dir.name)
        prep = LIGHT_ON_BLACK if DATASETS[name or model_dir.name] == "fashion" else None  # as training writes it
        save_pretrained(
            build(cfg0, seed=0).eval(),
            make_config_dict(model_dir.name, cfg0, LABELS[name or model_dir.name], preparation=prep, seed=0),
            model_dir,
        )
    model = load_pretrained(model_dir, serving=True)
    cfg: ModelConfig = model.cfg
    path = model_dir / VERSION / ONNX_FILE
    proto = export_onnx(model, cfg, path, max_length=max_length)
    parity = measure_parity(model, cfg, make_session(path))
    worst = max(r["max_abs_diff"] for r in parity)
    if not parity_ok(parity):
        raise ExportError(f"onnxruntime vs PyTorch parity failed (tolerance {PARITY_ATOL} x max(1, |logit|)): {parity}")
    section: dict[str, Any] = {
        "format": "onnx",
        "file": f"{VERSION}/{ONNX_FILE}",
        "opset": OPSET,
        "custom_opsets": {onnx_export.DOMAIN: onnx_export.DOMAIN_VERSION},
        "lara_nodes": onnx_export.count_lara_nodes(proto),
        "input_names": input_names(cfg),
        "output_names": list(output_names(model)),
        "dynamic_axes": {n: (["batch"] if n == "pixel_values" else ["batch", "sequence"]) for n in input_names(cfg)},
        "max_length": (max_length or cfg.max_length) if isinstance(cfg, TextConfig | BertTextConfig) else None,
        "size_bytes": path.stat().st_size,
        "versions": _versions(),
        "parity": {
            "reference": "pytorch eager (fp32, CPU)",
            "atol": PARITY_ATOL,
            "relative_above": 1.0,  # logits larger than 1: the tolerance is atol x the largest |logit|
            "max_abs_diff": worst,
            "cases": parity,
        },
    }
    conf = load_config(model_dir)
    conf["export"] = section
    (model_dir / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    return section


def export_to_tmp(model: nn.Module, max_length: int | None = None) -> tuple[Path, tempfile.TemporaryDirectory]:
    """Export an in-memory model to a temporary model.onnx (benchmarks, tests); keep the handle alive."""
    tmp = tempfile.TemporaryDirectory(prefix="lara-onnx-")
    path = Path(tmp.name) / ONNX_FILE
    export_onnx(model, model.cfg, path, max_length=max_length)
    return path, tmp


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, action="append", help="model name (a folder of --out); repeatable")
    p.add_argument("--out", default="model_repository", help="model repository root")
    p.add_argument("--max-length", type=int, default=None, help="text: longest sequence the graph accepts")
    p.add_argument("--random-init", action="store_true", help="no trained artifact: export random weights")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for name in args.model:
        section = export_model_dir(Path(args.out) / name, name, args.random_init, args.max_length)
        print(
            json.dumps(
                {
                    "model": name,
                    **{k: section[k] for k in ("file", "lara_nodes", "size_bytes")},
                    "max_abs_diff": section["parity"]["max_abs_diff"],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
