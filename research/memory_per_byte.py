"""Where a long document's memory goes: peak resident memory per input byte of one forward of the shipped
`lara-text-news-bytes`, by runtime and setting, and how much of the ONNX graph is live at once.

    .venv/bin/python -m research.memory_per_byte [--length 262144] [--threads 1]

Each configuration is a fresh child process (ru_maxrss is a per-process high-water mark): load the model,
run a 1,024-byte forward (one-time set-up), note the peak, run one batch-1 forward of `--length` random
printable bytes, report (peak after - peak before) / length. Below 256 KB glibc serves tensors of up to
32 MiB from its heap and fragmentation shows in the figures; measure at 262144 or more. Configurations: onnxruntime with the fused kernel under its session options (memory
arena, memory patterns, graph optimization level), onnxruntime on sub-graphs of model.onnx cut after the
embeddings and after each block (onnx.utils.Extractor; onnxruntime runs every node of a graph even when
an output is unused, so cutting the outputs alone is not enough), and PyTorch eager, plain and sliced
(lara_serve.model_export.models.long_forward). Beside them, the bound a runtime that frees each tensor after its last reader
would reach, from the tensors' sizes in the graph's node order. Writes research/results/memory_per_byte.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "model_repository" / "lara-text-news-bytes"
RESULTS = ROOT / "research" / "results" / "memory_per_byte.json"
ORT_CONFIGS: dict[str, dict[str, Any]] = {
    "onnxruntime defaults (arena, patterns, optimization all)": {},
    "arena off": {"arena": False},
    "arena off, patterns off": {"arena": False, "pattern": False},
    "optimization basic": {"opt": "basic"},
}


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _ort_session(threads: int, arena: bool = True, pattern: bool = True, opt: str = "all", cut: str = "") -> Any:
    import onnx
    import onnx.utils
    import onnxruntime as ort

    from lara_serve.kernels import ort_library

    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.enable_cpu_mem_arena, o.enable_mem_pattern = arena, pattern
    levels = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}
    o.graph_optimization_level = levels[opt]
    if not ort_library.register(o):
        raise RuntimeError(f"the fused kernel is unavailable: {ort_library.unavailable_reason()}")
    path = MODEL / "1" / "model.onnx"
    if not cut:
        return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])
    sub = onnx.utils.Extractor(onnx.load(str(path))).extract_model(["input_ids", "attention_mask"], [cut])
    return ort.InferenceSession(sub.SerializeToString(), o, providers=["CPUExecutionProvider"])


def child(spec: dict[str, Any], length: int, threads: int) -> float:
    """Bytes of peak RSS per input byte of one forward (run in a fresh process)."""
    import numpy as np

    ids = np.random.default_rng(0).integers(33, 127, size=(1, length)).astype(np.int64)
    mask = np.ones_like(ids)
    if spec["runtime"] == "onnxruntime":
        session = _ort_session(threads, **spec.get("options", {}))
        session.run(None, {"input_ids": ids[:, :1024], "attention_mask": mask[:, :1024]})  # one-time set-up
        before = _peak_kib()
        session.run(None, {"input_ids": ids, "attention_mask": mask})
    else:
        import torch

        from lara_serve.model_export import load_pretrained
        from lara_serve.model_export.models import long_forward

        torch.set_num_threads(threads)
        long_forward.LONG_FROM = 0 if spec["runtime"] == "torch sliced" else 1 << 40
        model = load_pretrained(MODEL, serving=True).eval()
        t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
        with torch.inference_mode():
            model(t_ids[:, :1024], t_mask[:, :1024])  # one-time set-up (thread pools, the kernel library)
            before = _peak_kib()
            model(t_ids, t_mask)
    return (_peak_kib() - before) * 1024 / length


def live_bound(threads: int) -> float:
    """Most bytes per token live at once when every tensor is freed after its last reader, in node order
    (sizes from one run at 4,096 tokens with every tensor made an output; they scale with the length)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from lara_serve.kernels import ort_library

    m = onnx.load(str(MODEL / "1" / "model.onnx"))
    names = [o for node in m.graph.node for o in node.output if o]
    finals = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names if n not in finals)
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    ort_library.register(o)
    n = 4096
    ids = np.random.default_rng(0).integers(33, 127, size=(1, n)).astype(np.int64)
    arrays = ort.InferenceSession(m.SerializeToString(), o).run(
        names, {"input_ids": ids, "attention_mask": ids * 0 + 1}
    )
    size = {name: a.nbytes / n for name, a in zip(names, arrays, strict=True)}
    last = {x: i for i, node in enumerate(m.graph.node) for x in node.input}
    live: dict[str, float] = {"input_ids": 8.0, "attention_mask": 8.0}
    peak = 0.0
    for i, node in enumerate(m.graph.node):
        live.update({x: size.get(x, 0.0) for x in node.output})
        peak = max(peak, sum(live.values()))
        live = {x: v for x, v in live.items() if last.get(x, -1) > i or x in finals}
    return peak


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=262144)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child), args.length, args.threads)))
        return
    specs = {name: {"runtime": "onnxruntime", "options": opts} for name, opts in ORT_CONFIGS.items()}
    # the residual stream after the embeddings + convolution, after block 0, after block 1 (this export's names)
    for stage, cut in (("embeddings", "add_162"), ("block 0", "add_502"), ("block 1", "add_835")):
        specs[f"onnxruntime, graph cut after {stage}"] = {"runtime": "onnxruntime", "options": {"cut": cut}}
    specs |= {"torch plain": {"runtime": "torch plain"}, "torch sliced": {"runtime": "torch sliced"}}
    rows = {}
    for name, spec in specs.items():
        cmd = [sys.executable, "-m", "research.memory_per_byte", "--length", str(args.length),
               "--threads", str(args.threads), "--child", json.dumps(spec)]  # fmt: skip
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=True).stdout
        rows[name] = round(float(out.strip().splitlines()[-1]))
        print(f"{name}: {rows[name]} bytes per input byte", flush=True)
    rows["bound: each tensor freed after its last reader"] = round(live_bound(args.threads))
    print(f"bound: {rows['bound: each tensor freed after its last reader']} bytes per token")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"length": args.length, "threads": args.threads, "bytes_per_byte": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
