"""A windowed word-piece model (`lara-text-news`, `lara train`'s frozen-encoder models) as a sliced program:
documents past its whole graph's length read in groups of windows, in memory that does not grow with them.

    python -m lara_serve.model_export.export.sliced_windows --model model_repository/lara-text-news

Why: the model reads its text in windows of W pieces, each its own [CLS] + pieces + [SEP], and pools every
window's vectors with one softmax over all of them (bert_lara.AttentionPool, gated per window by WindowGate) or
with means (readout "layers"). Nothing but those sums, the ood score's mean and the wide path's gram counts
crosses a window's edge, so a document of any length is a sequence of independent window groups plus a few
running sums. The whole graph holds every piece's activations at once (its onnxruntime arena: 564 MiB after one
64 KB document for lara-text-news); here one group's temporaries and the sums are all there is, and the
document's length is bounded by time, not memory (1 MiB of English, about 220 K pieces: 420 MiB at the peak).

The program (lara_serve.sliced_program's format, run by the server's onnxruntime backend) has two passes:
1. `windows.onnx`, over slices of `chunk` = k x W pieces of the stream (the slice's ids with one piece of halo on
   the right, because the document's ids are [CLS] + pieces + [SEP] and the pieces start at position 1): the
   slice's windows through the encoder (one LaraAttention node per layer), each window's gate, then an online
   softmax update of the pool (`pmax`, `psum`, `pacc`: the running max score, sum of exponentials and
   exponential-weighted sum of vectors) and the ood score's running sum of read rows (`osum`); for readout
   "layers" every hidden state's sum (`lsum`) instead of the pool, for a wide path the gram counts (`counts`);
2. `readout.onnx`, once: the pooled vector at unit length, the head, the wide path's tf-idf from the counts, the
   temperature, the ood score and its outlier probe, exactly as the serving model computes them.
The manifest's `long_from` tells the server to run documents longer than the whole graph's `max_length` on it.

The windows graph is exported with the whole graph's float16 storage and, for an int8 model (lara-text-news;
`lara train --int8`), then given the whole graph's int8 weights (export.quantize, the query and key projections float: FLOAT_PROJECTIONS), so both
paths compute with the same numbers, and the readout divides by the whole graph's temperature (an int8 graph's is
refitted on its own logits; the weights keep the float head's); the float program's parity with the torch serving model is checked first
(exactness of the slicing), then the int8 program's agreement with the float one (the quantization's cost).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lara_serve.model_export.export.sliced import MIN, Stage, export_stage, file_sha256, stage_proto
from lara_serve.model_export.models.bert_lara import LaraBertClassifier, window_layout
from lara_serve.model_export.models.ood import SHORT_TEXT_SCORE, ServingModel
from lara_serve.model_export.models.text import TFIDF_GAIN
from lara_serve.sliced_program import FOLDER, FORMAT, MANIFEST, SlicedProgram, ort_runners

WINDOWS_PER_SLICE = 8  # 8 x 512 slots per call: the int8 graph's temporaries stay near 100 MB


def not_supported_reasons(serving: nn.Module) -> list[str]:
    """Why `serving` cannot be exported as a windowed sliced program ([] when it can)."""
    model = getattr(serving, "model", None)
    if not isinstance(serving, ServingModel) or not isinstance(model, LaraBertClassifier):
        return ["not a word-piece classifier with its serving head (bert_lara.LaraBertClassifier in a ServingModel)"]
    reasons = []
    if not model.cfg.window:
        reasons.append("no windows (model.window 0): the document is one attention, not independent windows")
    if serving.input_score is not None:
        reasons.append("an input-space ood score, which reads byte ids")
    return reasons


STATE = ("pmax", "psum", "pacc", "osum", "lsum", "counts")  # the graphs' fixed signature (torch.export takes no *args)


def state_spec(model: LaraBertClassifier) -> dict[str, dict[str, Any]]:
    """The running state of `model`'s program, by name (initial value, shape, dtype), in STATE's order: the
    attention pool's online softmax, the sum of the last hidden state's read rows (the ood score; the mean
    readout), every hidden state's sum (readout "layers"), the wide path's gram counts. What the model does not
    use is one zero that the graphs pass on unchanged."""
    d, unused = model.cfg.dim, {"shape": [1], "fill": 0.0, "dtype": "float32"}
    pool, layers, wide = model.pool is not None, model.blocks > 1, model.tfidf is not None
    return {
        "pmax": {"shape": [1], "fill": MIN, "dtype": "float32"} if pool else unused,
        "psum": {"shape": [1], "fill": 0.0, "dtype": "float32"} if pool else unused,
        "pacc": {"shape": [1, d], "fill": 0.0, "dtype": "float32"} if pool else unused,
        "osum": {"shape": [1, d], "fill": 0.0, "dtype": "float32"},
        "lsum": {"shape": [1, d * model.blocks], "fill": 0.0, "dtype": "float32"} if layers else unused,
        # float32 counts are exact up to 2**24 occurrences of one gram
        "counts": {"shape": [1, model.tfidf.buckets], "fill": 0.0, "dtype": "float32"} if wide else unused,
    }


class WindowsStage(nn.Module):
    """(ids [1, w] the slice's ids and one more, start [] its first piece, n [] the document's ids, then the
    state in STATE's order) -> the next state, in the same order. The slice's pieces are ids[1 : 1 + count], count =
    min(w - 1, n - 2 - start) clamped at 0 (the last ids of the document are [SEP], then nothing); ids[0] is
    the piece before them (or [CLS]), which the wide path's first bigram reads."""

    def __init__(self, serving: ServingModel) -> None:
        super().__init__()
        self.model: LaraBertClassifier = serving.model  # type: ignore[assignment]
        self.pad_id = int(self.model.encoder.cfg.pad_id)

    def forward(
        self, ids: Tensor, start: Tensor, n: Tensor, pmax: Tensor, psum: Tensor, pacc: Tensor, osum: Tensor,
        lsum: Tensor, counts: Tensor,
    ) -> tuple[Tensor, ...]:  # fmt: skip
        model, cfg = self.model, self.model.cfg
        old = {"pmax": pmax, "psum": psum, "pacc": pacc, "osum": osum, "lsum": lsum, "counts": counts}
        w = ids.shape[1]
        count = torch.clamp(torch.minimum(n - 2 - start, torch.full_like(n, w - 1)), min=0)  # [] pieces here
        # one row [CLS] + the slice's pieces + [SEP], as the server would send them for this slice alone
        row = torch.cat([ids, torch.full_like(ids[:, :1], self.pad_id)], 1)  # [1, w + 1]
        slot = torch.arange(w + 1)[None]
        pieces = (slot >= 1) & (slot <= count)  # [1, w + 1]
        row = torch.where(slot == 0, torch.full_like(row, cfg.cls_id), row)
        row = torch.where(slot == count + 1, torch.full_like(row, cfg.sep_id), row)
        mask = (slot <= count + 1).long()
        wids, wmask, read = window_layout(row, mask, cfg.window, cfg.cls_id, cfg.sep_id, self.pad_id)
        read = read * (count > 0).long()  # a slice past the last piece reads nothing (the whole graph has none)
        x = model.encoder(wids, wmask, all_layers=model.blocks > 1).reshape(1, -1, cfg.dim * model.blocks)
        r = read.unsqueeze(-1).to(x.dtype)  # [1, rows, 1]
        new = {**old, "osum": osum + (model.last_state(x) * r).sum(1)}
        if model.pool is not None:
            bias = model.window_bias(x, read, mask)
            s = model.pool.score(x).squeeze(-1)  # [1, J * (W + 2)]
            if bias is not None:
                s = s + bias
            s = s.masked_fill(read == 0, MIN)
            top = torch.maximum(old["pmax"], s.max(-1).values)  # [1]
            e = torch.exp(s - top[:, None]) * read.to(s.dtype)  # [1, rows]; unread rows exactly 0
            keep = torch.exp(old["pmax"] - top)  # [1]: the old sums' scale
            new |= {"pmax": top, "psum": old["psum"] * keep + e.sum(-1),
                    "pacc": old["pacc"] * keep[:, None] + (e.unsqueeze(1) @ x).squeeze(1)}  # fmt: skip
        if model.blocks > 1:
            new["lsum"] = old["lsum"] + (x * r).sum(1)
        if model.tfidf is not None:  # the piece before the slice, then its pieces; the first unigram is not ours
            g = torch.where(slot == 0, ids[:, :1], torch.where(pieces, row, torch.zeros_like(row)))
            bucket, real = model.tfidf.grams(g)  # [1, 2 (w + 1)] each
            real = real & (torch.arange(real.shape[1])[None] != 0)
            new["counts"] = old["counts"].scatter_add(1, bucket, real.to(old["counts"].dtype))
        return tuple(new[k] for k in STATE)


class WindowsReadout(nn.Module):
    """(n [], the state in STATE's order) -> (logits / temperature [1, C], ood_score [1]), as
    TextServingModel.forward computes them from the same sums: the pool's weighted sum, the read rows' sums,
    the gram counts (TfidfHead's tf-idf from counts: (1 + ln c) idf per distinct bucket, at unit length)."""

    def __init__(self, serving: ServingModel) -> None:
        super().__init__()
        self.serving = serving

    def forward(
        self, n: Tensor, pmax: Tensor, psum: Tensor, pacc: Tensor, osum: Tensor, lsum: Tensor, counts: Tensor
    ) -> tuple[Tensor, Tensor]:
        del pmax  # the pool's running max: its scale cancels in pacc / psum
        serving, model = self.serving, self.serving.model
        st = {"psum": psum, "pacc": pacc, "osum": osum, "lsum": lsum, "counts": counts}
        unit = nn.functional.normalize
        pooled = unit(st["osum"], p=2, dim=-1)  # mean_pool: the unit mean of the last hidden state's read rows
        if model.pool is not None:
            read = unit(st["pacc"] / st["psum"][:, None], p=2, dim=-1)  # AttentionPool's output
        elif model.blocks > 1:  # layer_means: each hidden state's unit mean, scaled to unit length together
            sums = st["lsum"].reshape(1, model.blocks, -1)
            read = (unit(sums, p=2, dim=-1) / model.blocks**0.5).reshape(1, -1)
        else:
            read = pooled
        logits = model.head(read)
        if model.tfidf is not None:
            c = st["counts"]
            tf = torch.where(c > 0, 1.0 + torch.log(c.clamp_min(1.0)), torch.zeros_like(c)) * model.tfidf.idf
            logits = logits + TFIDF_GAIN * unit(tf, p=2, dim=-1, eps=1e-12) @ model.tfidf.weight
        score = serving.combine(serving.ood(pooled), None, None if serving.probe is None else serving.probe(pooled))
        min_pieces = getattr(model.cfg, "min_pieces", 0)
        if min_pieces:
            score = torch.where(n - 2 < min_pieces, torch.full_like(score, SHORT_TEXT_SCORE), score)
        return logits / serving.temperature, score


def _word_ids(vocab: int) -> tuple[int, int]:
    """A range of ordinary piece ids: past BERT's special and unused ones (the first 1,000) when there are more."""
    return (1000 if vocab > 2000 else vocab // 2), vocab


def build_stages(serving: ServingModel, chunk: int) -> tuple[list[Stage], dict[str, dict[str, Any]]]:
    reasons = not_supported_reasons(serving)
    if reasons:
        raise ValueError("cannot slice this model by windows: " + "; ".join(reasons))
    model: LaraBertClassifier = serving.model  # type: ignore[assignment]
    state = state_spec(model)
    init = {k: torch.full(v["shape"], v["fill"]) for k, v in state.items()}
    w = 3 * model.cfg.window + 7  # example: several windows, a short last one (any size traces the same)
    feeds = {"ids": torch.randint(*_word_ids(model.cfg.vocab_size), (1, w)), "start": torch.tensor(0),
             "n": torch.tensor(10 * w), **init}  # fmt: skip
    windows = Stage("windows.onnx", "slices", WindowsStage(serving), list(feeds), [f"next_{k}" for k in state],
                    feeds, {"ids": {1: torch.export.Dim("window", min=2)}})  # fmt: skip
    read_in = {"n": feeds["n"], **{k: v + 1.0 for k, v in init.items()}}  # any positive sums
    readout = Stage("readout.onnx", "once", WindowsReadout(serving), list(read_in), ["logits", "ood_score"],
                    read_in, {})  # fmt: skip
    return [windows, readout], state


def _export_windows(stage: Stage, path: Path) -> None:
    """The windows stage with the whole graph's LaraAttention nodes (custom translation, function body) and
    float16 storage of the weights float16 holds exactly (the converted encoder's)."""
    import onnx

    from lara_serve.kernels import onnx_export
    from lara_serve.model_export.export.exporter import (
        check_graph,
        half_storage,
        lara_layer_count,
        strip_debug_metadata,
    )

    proto = stage_proto(stage, custom_translation_table=onnx_export.custom_translation_table())
    proto = half_storage(strip_debug_metadata(onnx_export.attach_lara_function(proto)))
    check_graph(proto, expected_lara_nodes=lara_layer_count(stage.module))
    onnx.save(proto, str(path))


def manifest(stages: list[Stage], state: dict[str, Any], chunk: int, long_from: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "chunk": chunk,
        "halo": [0, 1],  # the pieces of slice [s, e) are ids[s + 1 : e + 1]
        "dim": 1,  # no residual stream crosses passes: the state carries everything
        "long_from": long_from,  # longer documents run here, shorter ones on the whole graph
        "state": state,
        "passes": [{"file": s.file, "over": s.over} for s in stages],
        "outputs": ["logits", "ood_score"],
    }


def parity_lengths(chunk: int, window: int) -> list[int]:
    """Documents of one slice, of several with a short last window, and ones ending exactly at a slice's end or
    one piece past it (a slice with no pieces, then one with one)."""
    return [window + 5, chunk + 3, 2 * chunk + 2, 2 * chunk + 1, 3 * chunk + window // 2]


def run_program(folder: Path, spec: dict[str, Any], threads: int = 0) -> SlicedProgram:
    from lara_serve.model_export.export.exporter import make_session

    return SlicedProgram(spec, ort_runners(folder, spec, lambda p: make_session(p, threads=threads, fused=True)))


def measure(
    serving: ServingModel, program: SlicedProgram, lengths: list[int], vocab: int, ref: SlicedProgram | None = None
) -> list[dict[str, Any]]:
    """The program against the torch serving model reading the whole document (or against `ref`, another
    program, when given), one random document of each length."""
    rows = []
    for n in lengths:
        g = torch.Generator().manual_seed(n)
        ids = torch.randint(*_word_ids(vocab), (1, n), generator=g)
        ids[0, 0], ids[0, -1] = serving.model.cfg.cls_id, serving.model.cfg.sep_id
        if ref is None:
            with torch.inference_mode():
                logits_t, ood_t = serving(ids, torch.ones_like(ids))
            want = {"logits": logits_t.numpy(), "ood_score": ood_t.numpy()}
        else:
            want = ref.run(ids[0].numpy())
        got = program.run(ids[0].numpy())
        rows.append({
            "seq": n,
            "max_abs_diff": float(np.abs(got["logits"] - want["logits"]).max()),
            "argmax_equal": bool(got["logits"].argmax() == want["logits"].argmax()),
            "ood_max_rel_diff": float(np.abs(got["ood_score"] - want["ood_score"]).max()
                                      / max(abs(float(want["ood_score"][0])), 1.0)),
        })  # fmt: skip
    return rows


# The float program against torch eager (fp32), as the whole graph's export checks (exporter.PARITY_ATOL).
PARITY_ATOL = 1e-4
OOD_PARITY_RTOL = 1e-3


def export_windows(
    serving: ServingModel, folder: Path, onnx_file: Path | None, windows_per_slice: int = WINDOWS_PER_SLICE,
    quantize: bool = True, weights: Path | None = None, check_lengths: list[int] | None = None,
    long_from: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Write the program of `serving` into `folder` (replaced): export, float parity against torch (ValueError
    when it fails), then with `quantize` the int8 windows graph (its MatMuls of the query and key projections
    kept float, found by value in `weights`) and its agreement with the float program. long_from: the whole
    graph's longest document (default the model's max_length). Returns the manifest."""
    chunk = windows_per_slice * serving.model.cfg.window
    stages, state = build_stages(serving, chunk)
    vocab = serving.model.cfg.vocab_size
    lengths = check_lengths or parity_lengths(chunk, serving.model.cfg.window)
    with tempfile.TemporaryDirectory(prefix="lara-windows-") as tmp:
        staging = Path(tmp) / FOLDER
        staging.mkdir()
        _export_windows(stages[0], staging / stages[0].file)
        export_stage(stages[1], staging / stages[1].file)
        spec = manifest(stages, state, chunk, long_from or serving.model.cfg.max_length)
        parity = measure(serving, run_program(staging, spec), lengths, vocab)
        worst = max(r["max_abs_diff"] for r in parity)
        if (
            worst > PARITY_ATOL
            or max(r["ood_max_rel_diff"] for r in parity) > OOD_PARITY_RTOL
            or not all(r["argmax_equal"] for r in parity)
        ):
            raise ValueError(f"sliced windows vs PyTorch parity failed (atol {PARITY_ATOL}): {parity}")
        spec["parity"] = {"reference": "pytorch eager (fp32, CPU), the whole document, float graphs",
                          "atol": PARITY_ATOL, "cases": parity}  # fmt: skip
        if quantize:
            spec["quantization"] = _quantize(staging, spec, weights, serving, lengths, vocab)
        if onnx_file is not None:
            spec["model_onnx_sha256"] = file_sha256(onnx_file)
        (staging / MANIFEST).write_text(json.dumps(spec, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(staging, folder)
    return spec


def _quantize(
    staging: Path, spec: dict[str, Any], weights: Path | None, serving: ServingModel, lengths: list[int], vocab: int
) -> dict[str, Any]:
    from lara_serve.model_export.export.quantize import FLOAT_PROJECTIONS, matmuls_of, quantize_file

    floats = staging.parent / "float"
    shutil.copytree(staging, floats)
    src, dst = floats / "windows.onnx", staging / "windows.onnx"
    skip = matmuls_of(src, weights, FLOAT_PROJECTIONS) if weights is not None else []
    notes = quantize_file(src, dst, skip=skip)
    agreement = measure(serving, run_program(staging, spec), lengths, vocab, ref=run_program(floats, spec))
    return notes | {"float_projections": ", ".join(FLOAT_PROJECTIONS) if skip else "none",
                    "against_float_program": agreement}  # fmt: skip


# What the server accepts once the program is there (config.json preprocessing.max_length, in pieces): about
# 1 MiB of English (examples/long-document.txt: 218,994 pieces in its first MiB), as the byte models' 1 MiB.
READ_MAX_LENGTH = 262144


def graph_temperature(path: Path) -> float | None:
    """The temperature the exported graph divides its logits by, None where the export folded a division by 1
    away (head.finalize keeps T = 1 when the holdout has no errors)."""
    from lara_serve.model_export.export.quantize import scalar_initializer

    try:
        return scalar_initializer(path, "temperature")
    except ValueError:
        return None


def export_windows_dir(model_dir: Path, quantize: bool | None = None, max_length: int = READ_MAX_LENGTH) -> dict[str, Any]:  # fmt: skip
    """`<model_dir>/1/sliced/` from the artifact beside its 1/model.onnx (never rewritten), taking over past the
    whole graph's export.max_length, and config.json's preprocessing.max_length raised to `max_length` (the
    model's own max_length stays the whole graph's). quantize: default, as the whole graph is (config.json
    export.quantization)."""
    from lara_serve.model_export.models.hub import VERSION, WEIGHTS, load_config, load_pretrained

    serving = load_pretrained(model_dir, serving=True)
    conf = load_config(model_dir)
    export = conf.get("export") or {}
    whole = int(export.get("max_length") or serving.model.cfg.max_length)
    if max_length <= whole:
        raise ValueError(f"--max-length {max_length} must exceed the whole graph's {whole} pieces: nothing to slice")
    if quantize is None:
        quantize = isinstance(export.get("quantization"), dict)
    graph_t = graph_temperature(Path(model_dir) / VERSION / "model.onnx")
    if graph_t is not None:  # an int8 graph's temperature is refitted on its own logits (pretrained.int8,
        # your_data.quantized) and the weights keep the float head's: the program continues the whole graph
        with torch.no_grad():
            serving.temperature.fill_(graph_t)
    spec = export_windows(serving, Path(model_dir) / VERSION / FOLDER, Path(model_dir) / VERSION / "model.onnx",
                          quantize=quantize, weights=Path(model_dir) / VERSION / WEIGHTS, long_from=whole)  # fmt: skip
    conf["preprocessing"]["max_length"] = max_length
    conf["export"] = export | {"sliced": {
        "folder": f"{VERSION}/{FOLDER}", "long_from": whole, "chunk": spec["chunk"], "int8": quantize,
        "command": f"python -m lara_serve.model_export.export.sliced_windows --model DIR --max-length {max_length}",
    }}  # fmt: skip
    (Path(model_dir) / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    return spec


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="a windowed word-piece model folder")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--int8", dest="quantize", action="store_true", default=None, help="int8 windows graph")
    g.add_argument("--float", dest="quantize", action="store_false", help="float windows graph")
    p.add_argument("--max-length", type=int, default=READ_MAX_LENGTH, help="pieces the server accepts after")
    args = p.parse_args(argv)
    spec = export_windows_dir(args.model, args.quantize, args.max_length)
    summary = {"model": str(args.model), "chunk": spec["chunk"], "long_from": spec["long_from"],
               "float_parity_max_abs_diff": max(r["max_abs_diff"] for r in spec["parity"]["cases"])}  # fmt: skip
    if "quantization" in spec:
        summary["int8_vs_float"] = spec["quantization"]["against_float_program"]
    print(json.dumps(summary, indent=2), flush=True)


if __name__ == "__main__":
    main()
