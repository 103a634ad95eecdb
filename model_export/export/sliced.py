"""A text model as a program of small ONNX graphs that runs a document in slices of rows, beside model.onnx.

    python -m lara_serve.model_export.export.sliced --model lara-text-news-bytes   (model.onnx left as it is)

Why: the whole graph holds every layer's full-length activations at once, ~7.5 KB per token (7.5 GB for
a 1 MiB document, benchmarks/results/memory_one_mib.json). Here the only full-length tensor is the
residual stream x [n, D] (512 B per token at D = 128), which the server keeps and updates in place; every
graph sees one slice of rows and a few small running statistics. LARA needs three passes per layer,
because each of its global quantities depends on the previous one (spec 5.2-5.4, kernels/reference.py):

1. `sums_<l>`: the chunk sums of q and k (the landmarks are chunk means over the whole document);
2. `keys_<l>`: with the landmarks, the samples' online softmax over keys (F_c, lse_c as a running max,
   sum of exponentials and exp-weighted sum of v) and the online logsumexp over queries of rho;
3. `block_<l>`: per query, the SNIS weights over samples from those statistics, the output projection,
   the residual and the MLP: the slice's rows of the block's output.

Before them `embed` (byte and n-gram embeddings, convolutional or sinusoidal positions; a window with a
halo of context rows, as lara_serve.model_export.models.long_forward cuts it) and the input score's
running sums; after them `tail` (final norm, then the slice's passage means or the running row sum) and
`readout` (logits / temperature and ood_score of the whole document). Each graph maps (slice, state) to
the next state; `manifest.json` lists the passes and the state's initial values, and the server runs
them with no arithmetic of its own (lara_serve.sliced_program). The result is the whole graph's
up to float32 rounding (summation orders differ), tested against a float64 reference
(tests/model_export/test_sliced_export.py).

Supported: text models with LARA attention (1-D chunk-mean landmarks), mean or passage readout, no wide
path; `not_supported_reasons` says why another model is not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import Tensor, nn

from lara_serve.model_export.export.sliced_stages import (
    MIN,
    BlockStage,
    EmbedStage,
    KeysStage,
    ReadoutStage,
    SumsStage,
    TailStage,
)
from lara_serve.model_export.models import long_forward
from lara_serve.model_export.models.ood import ServingModel
from lara_serve.model_export.models.ood_input import VOCAB
from lara_serve.sliced_program import FOLDER, FORMAT, MANIFEST, SlicedProgram, ort_runners

OPSET = 20
# Rows per slice: the per-slice GEMMs run at full speed and a slice's temporaries (the [H, C, m] sample
# logits, the MLP's [m, 2D]) stay near 10 MB. A multiple of every passage size in use (512).
CHUNK = 16384


def not_supported_reasons(model: nn.Module) -> list[str]:
    """Why the serving text model `model` cannot be exported as a sliced program ([] when it can)."""
    base = getattr(model, "model", model)
    cfg = getattr(base, "cfg", None)
    if cfg is None or not hasattr(cfg, "vocab_size"):
        return ["not a text model"]
    reasons = []
    if cfg.attention.kind != "lara":
        reasons.append(f"attention {cfg.attention.kind!r} (only LARA has the sliced statistics here)")
    if cfg.pooling not in ("mean", "passages"):
        reasons.append(f"pooling {cfg.pooling!r} (mean and passages are supported)")
    if cfg.pooling == "passages" and CHUNK % cfg.passage_bytes:
        reasons.append(f"passage_bytes {cfg.passage_bytes} does not divide the slice size {CHUNK}")
    if getattr(base, "tfidf", None) is not None:
        reasons.append("a wide (tf-idf) path, which counts grams over the whole document")
    if not isinstance(model, ServingModel):
        reasons.append("no serving head (temperature, ood_score): the program's readout is the served one")
    return reasons


# ----------------------------------------------------------------------------- stage modules
# ----------------------------------------------------------------------------- the program
@dataclass
class Stage:
    """One graph: its file, whether it runs per slice or once, its module, names and example inputs."""

    file: str
    over: str  # "slices" | "once"
    module: nn.Module
    inputs: list[str]
    outputs: list[str]
    example: dict[str, Tensor]
    dynamic: dict[str, dict[int, Any]]


def build_stages(serving: ServingModel, chunk: int = CHUNK) -> tuple[list[Stage], dict[str, dict[str, Any]]]:
    """The sliced program of `serving`: its stages in order and its state (name -> shape, fill, dtype)."""
    reasons = not_supported_reasons(serving)
    if reasons:
        raise ValueError("cannot slice this model: " + "; ".join(reasons))
    text = serving.model
    cfg = text.cfg
    h, d, c = cfg.heads, cfg.dim // cfg.heads, cfg.attention.num_landmarks
    m, w, n = 37, 48, 1000  # example sizes (any; none 0 or 1, which export would specialize)
    rows, ids = Dim("rows"), Dim("window")
    x = torch.randn(1, m, cfg.dim)
    i64 = {"start": torch.tensor(0), "n": torch.tensor(n)}
    state: dict[str, dict[str, Any]] = {}

    def declare(name: str, shape: list[int], fill: float = 0.0, dtype: str = "float32") -> Tensor:
        state[name] = {"shape": shape, "fill": fill, "dtype": dtype}
        return torch.full(shape, fill, dtype=getattr(torch, dtype))

    emb_in = {"ids": torch.randint(1, VOCAB, (1, w)), "rows": torch.arange(5, 5 + m), "offset": torch.tensor(3)}
    emb_out = ["next_x"]
    if serving.input_score is not None:
        emb_in |= {"nll": declare("nll", [1], dtype="float64"), "pairs": declare("pairs", [1], dtype="float64")}
        emb_out += ["next_nll", "next_pairs"]
    stages = [Stage("embed.onnx", "slices", EmbedStage(serving), list(emb_in), emb_out, emb_in,
                    {"ids": {1: ids}, "rows": {0: rows}})]  # fmt: skip
    for i, block in enumerate(text.blocks):
        sums = {f"qsum_{i}": declare(f"qsum_{i}", [1, h, c, d]), f"ksum_{i}": declare(f"ksum_{i}", [1, h, c, d])}
        stats = {
            f"kmax_{i}": declare(f"kmax_{i}", [1, h, c], MIN),
            f"ksumexp_{i}": declare(f"ksumexp_{i}", [1, h, c]),
            f"kv_{i}": declare(f"kv_{i}", [1, h, c, d]),
            f"qmax_{i}": declare(f"qmax_{i}", [1, h, c], MIN),
            f"qsumexp_{i}": declare(f"qsumexp_{i}", [1, h, c]),
        }
        feeds = {"x": x, **i64, **sums}
        stages.append(Stage(f"sums_{i}.onnx", "slices", SumsStage(block, serving), list(feeds),
                            [f"next_{k}" for k in sums], feeds, {"x": {1: rows}}))  # fmt: skip
        feeds = {"x": x, "n": i64["n"], **sums, **stats}
        stages.append(Stage(f"keys_{i}.onnx", "slices", KeysStage(block, serving), list(feeds),
                            [f"next_{k}" for k in stats], feeds, {"x": {1: rows}}))  # fmt: skip
        stages.append(Stage(f"block_{i}.onnx", "slices", BlockStage(block, serving), list(feeds), ["next_x"],
                            feeds, {"x": {1: rows}}))  # fmt: skip
    tail_in: dict[str, Tensor] = {"x": x}
    if text.passages is not None:
        if chunk % text.passages.size:
            raise ValueError(f"chunk {chunk} must be a multiple of passage_bytes {text.passages.size}")
        parts, tail_out, parts_dyn = torch.randn(1, 5, cfg.dim), ["append_passages"], {1: Dim("passages")}
        state["passages"] = {"shape": [1, 0, cfg.dim], "fill": 0.0, "dtype": "float32"}
    else:
        tail_in["rowsum"] = parts = declare("rowsum", [1, cfg.dim])
        tail_out, parts_dyn = ["next_rowsum"], {}
    stages.append(Stage("tail.onnx", "slices", TailStage(serving), list(tail_in), tail_out, tail_in, {"x": {1: rows}}))
    part_name = "passages" if text.passages is not None else "rowsum"
    read_in = {"n": i64["n"], part_name: parts}
    if serving.input_score is not None:
        read_in |= {
            "nll": torch.tensor([700.0], dtype=torch.float64),
            "pairs": torch.tensor([999.0], dtype=torch.float64),
        }
    stages.append(Stage("readout.onnx", "once", ReadoutStage(serving), list(read_in), ["logits", "ood_score"], read_in,
                        {part_name: parts_dyn} if parts_dyn else {}))  # fmt: skip
    return stages, state


def Dim(name: str) -> Any:  # noqa: N802 - torch.export.Dim's spelling
    return torch.export.Dim(name, min=2)


def halo(serving: ServingModel) -> tuple[int, int]:
    """Context rows left and right of a slice that its embedding rows (and its input score's first pair) read."""
    left, right = long_forward._halo(serving.model)
    return max(left, 1 if serving.input_score is not None else 0), right


def manifest(serving: ServingModel, stages: list[Stage], state: dict[str, Any], chunk: int) -> dict[str, Any]:
    left, right = halo(serving)
    return {
        "format": FORMAT,
        "chunk": chunk,
        "halo": [left, right],
        "dim": serving.model.cfg.dim,
        "state": state,
        "passes": [{"file": s.file, "over": s.over} for s in stages],
        "outputs": ["logits", "ood_score"],
    }


def stage_proto(stage: Stage, **options: Any) -> onnx.ModelProto:
    """One stage's dynamo export with its named dynamic axes (options: more torch.onnx.export keywords, e.g. a
    custom translation table)."""
    args = tuple(stage.example[k] for k in stage.inputs)
    dynamic = tuple(stage.dynamic.get(k) for k in stage.inputs)
    with torch.no_grad():
        program = torch.onnx.export(
            stage.module.eval(), args, dynamo=True, opset_version=OPSET, input_names=stage.inputs,
            output_names=stage.outputs, dynamic_shapes=dynamic, verbose=False, **options,
        )  # fmt: skip
    return program.model_proto


def export_stage(stage: Stage, path: Path) -> None:
    """One stage to `path`: dynamo export with named dynamic axes, then onnx.checker's full check."""
    from lara_serve.model_export.export.exporter import strip_debug_metadata

    proto = strip_debug_metadata(stage_proto(stage))
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(path))


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def export_sliced(serving: ServingModel, folder: Path, onnx_file: Path | None, chunk: int = CHUNK) -> dict[str, Any]:
    """Write the program of `serving` to `folder` (manifest.json and one graph per stage); the manifest
    names the sha256 of `onnx_file`, the whole graph it stands in for (the server checks it)."""
    stages, state = build_stages(serving, chunk)
    folder.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        export_stage(stage, folder / stage.file)
    spec = manifest(serving, stages, state, chunk)
    if onnx_file is not None:
        spec["model_onnx_sha256"] = file_sha256(onnx_file)
    (folder / MANIFEST).write_text(json.dumps(spec, indent=2) + "\n")
    return spec


def torch_runners(stages: list[Stage]) -> dict[str, Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]]:
    """Each stage as a function of numpy feeds, run eagerly in torch (tests: the program in float64)."""

    def runner(stage: Stage) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            with torch.inference_mode():
                out = stage.module(*(torch.from_numpy(np.asarray(feeds[k])) for k in stage.inputs))
            out = out if isinstance(out, tuple) else (out,)
            return {name: t.numpy() for name, t in zip(stage.outputs, out, strict=True)}

        return run

    return {stage.file: runner(stage) for stage in stages}


# Accepted |sliced - eager| at export, as the whole graph's (exporter.PARITY_ATOL, OOD_PARITY_RTOL).
PARITY_ATOL = 1e-4
OOD_PARITY_RTOL = 1e-3


def parity_lengths(chunk: int) -> list[int]:
    """Short documents (one slice, shorter than the halo), and ones of two and three slices with a short last."""
    return [1, 37, 5000, chunk + 1000, 2 * chunk + 3]


def measure_parity(serving: ServingModel, folder: Path, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """onnxruntime over the exported graphs vs the torch serving model (eager, fp32) per document length."""
    import onnxruntime as ort

    def session(path: Path) -> Any:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    program = SlicedProgram(spec, ort_runners(folder, spec, session))
    rows = []
    for n in parity_lengths(int(spec["chunk"])):
        ids = torch.randint(1, VOCAB, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.inference_mode():
            logits, ood = serving(ids, torch.ones_like(ids))
        got = program.run(ids[0].numpy())
        rows.append({
            "seq": n,
            "max_abs_diff": float(np.abs(got["logits"] - logits.numpy()).max()),
            "argmax_equal": bool(got["logits"].argmax() == logits.numpy().argmax()),
            "ood_max_rel_diff": float(np.abs(got["ood_score"] - ood.numpy()).max() / max(abs(float(ood[0])), 1.0)),
        })  # fmt: skip
    return rows


def export_sliced_dir(model_dir: Path, chunk: int = CHUNK) -> dict[str, Any]:
    """`<model_dir>/1/sliced/` from the trained artifact, beside the existing 1/model.onnx (never rewritten);
    parity against torch eager is measured and written into the manifest, or ValueError."""
    from lara_serve.model_export.models.hub import VERSION, load_pretrained

    serving = load_pretrained(model_dir, serving=True)
    if not isinstance(serving, ServingModel):
        raise ValueError(f"{model_dir}: no serving head (temperature, ood_score) in its weights: nothing to slice")
    folder = Path(model_dir) / VERSION / FOLDER
    spec = export_sliced(serving, folder, Path(model_dir) / VERSION / "model.onnx", chunk)
    parity = measure_parity(serving, folder, spec)
    worst = max(r["max_abs_diff"] for r in parity)
    ood_worst = max(r["ood_max_rel_diff"] for r in parity)
    if worst > PARITY_ATOL or ood_worst > OOD_PARITY_RTOL or not all(r["argmax_equal"] for r in parity):
        raise ValueError(f"sliced onnxruntime vs PyTorch parity failed (atol {PARITY_ATOL}): {parity}")
    spec["parity"] = {"reference": "pytorch eager (fp32, CPU), the whole document", "atol": PARITY_ATOL,
                      "cases": parity}  # fmt: skip
    (folder / MANIFEST).write_text(json.dumps(spec, indent=2) + "\n")
    return spec


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, action="append", help="text model name (a folder of --out); repeatable")
    p.add_argument("--out", default="model_repository", help="model repository root")
    args = p.parse_args(argv)
    for name in args.model:
        spec = export_sliced_dir(Path(args.out) / name)
        worst = max(r["max_abs_diff"] for r in spec["parity"]["cases"])
        print(json.dumps({"model": name, "graphs": len(spec["passes"]), "max_abs_diff": worst}), flush=True)


if __name__ == "__main__":
    main()
