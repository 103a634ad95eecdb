"""Issue 6: check and time the Triton LARA kernels on a GPU in ONE run (< 6 minutes on an H200).

Sections, each guarded so that one failure keeps the others' results (its traceback is recorded):
  env          device, versions, SM count
  correctness  Triton vs the float64 reference on random inputs (fp16/bf16/fp32, padded or not, awkward
               sizes); pass = error <= 2x the error of the reference run in the kernel's dtype + a floor
  ceilings     measured copy bandwidth (large tensor copy) and matmul rate (fp16, bf16)
  timing       LARA (Triton), LARA (PyTorch path), Performer, SDPA flash at N = 4K..256K (B=1, H=8, D=64,
               C=64; fp16/bf16): median of CUDA-event timings; achieved GB/s and FLOP/s vs the ceilings
  e2e          the text model end to end, if model_repository/lara-text-news-bytes exists
  sweep        a few Triton launch configurations at N = 64K (tuning leads)
  profile      per-kernel times of one LARA call (torch.profiler), if the profiler works there
Results are printed and written to <out>/gpu.json after every section (out = $OUT on the device,
else benchmarks/results). `--cpu-smoke` runs the same code with tiny sizes on the CPU under
TRITON_INTERPRET=1 (bf16 and SDPA flash swapped out) to check the script itself.

`--sm90-build` only compiles the kernels for sm_90 on a machine without a GPU and reports registers,
spills (stack) and shared memory per variant (writes <out>/sm90_build.json).

Usage: python benchmarks/gpu.py [--cpu-smoke | --sm90-build] [--out DIR] [--budget-s 330]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

from lara_serve import kernels

ROOT = Path(__file__).resolve().parents[1]
SMOKE = "--cpu-smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before lara_serve.kernels._triton is imported
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lara_serve.kernels._cpu import lara_forward_cpu  # noqa: E402
from lara_serve.kernels._triton import LaunchConfig, lara_forward_triton  # noqa: E402
from lara_serve.kernels.inputs import LaraInputs  # noqa: E402
from lara_serve.kernels.reference import lara_attention_ref, orthogonal_gaussian_projection  # noqa: E402

F64 = torch.float64
# One output rounding at the output's scale: half an ulp of the dtype (relative), times max|y|.
FLOOR_REL = {torch.float32: 2.0**-18, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


class Run:
    """Shared state: device, sizes, deadline, results and where they go."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.smoke = args.cpu_smoke
        self.device = torch.device("cpu" if self.smoke else "cuda")
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget_s
        self.results: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "smoke": self.smoke}
        on_device = bool(os.environ.get("OUT"))
        default_out = os.environ["OUT"] if on_device else str(ROOT / "benchmarks" / "results")
        self.out = Path(args.out or default_out)
        self.json_name = "gpu_smoke.json" if self.smoke else "gpu.json"
        self.dtypes = [torch.float16, torch.float32] if self.smoke else [torch.float16, torch.bfloat16]
        self.seq_lens = [64, 128] if self.smoke else [4096, 16384, 65536, 262144]
        self.model_dir = Path(args.model_dir)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / self.json_name).write_text(json.dumps(self.results, indent=1, default=str) + "\n")

    def section(self, name: str, fn, min_left_s: float = 0.0) -> None:
        start = time.monotonic()
        if self.left() < min_left_s:
            self.results[name] = {"skipped": f"time budget: {self.left():.0f} s left, needs {min_left_s:.0f}"}
        else:
            try:
                self.results[name] = fn(self)
            except Exception:  # one section's failure must not lose the others
                self.results[name] = {"error": traceback.format_exc(limit=8)}
        self.results.setdefault("section_s", {})[name] = round(time.monotonic() - start, 1)
        print(f"== {name} ({time.monotonic() - start:.1f} s)\n{json.dumps(self.results[name], indent=1, default=str)}")
        sys.stdout.flush()
        self.save()


# ----------------------------------------------------------------------------- helpers
def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_ms(run: Run, fn, budget_s: float = 1.0, min_reps: int = 3, max_reps: int = 50) -> dict:
    """Median wall time of fn() in ms: CUDA events on a GPU, perf_counter on the CPU. First call warms up."""
    dev = run.device
    fn()  # compile / autotune / allocator warm-up
    sync(dev)
    t = time.perf_counter()
    fn()
    sync(dev)
    est = time.perf_counter() - t
    reps = int(max(min_reps, min(max_reps, budget_s / max(est, 1e-6))))
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return {"median_ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4), "reps": reps}


def lara_inputs(b, h, n, d, c, dtype, dev, *, seed=0, pad_frac=0.0, noise=False, fully_padded_row=False):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    valid = None
    if pad_frac > 0 or fully_padded_row:
        lengths = [max(1, n - int(pad_frac * n) - i) for i in range(b)]
        if fully_padded_row:
            lengths[-1] = 0
        valid = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # [B, N]
    # Landmarks as the 1-D model builds them: chunk means over valid tokens (spec 5.2).
    ql = kernels.chunk_means_1d(q, c, None if valid is None else ~valid)
    kl = kernels.chunk_means_1d(k, c, None if valid is None else ~valid)
    z = torch.randn(1, h, c, d, generator=g) if noise else None
    mask = None if valid is None else (~valid).to(dev)
    cast = [t.to(device=dev, dtype=dtype) for t in (q, k, v, ql, kl)]
    return cast, mask, (None if z is None else z.to(device=dev, dtype=dtype))


def max_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.to(F64) - ref).abs().max().item()


# ----------------------------------------------------------------------------- sections
def section_env(run: Run) -> dict:
    import triton

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": str(run.device),
        "interpret": os.environ.get("TRITON_INTERPRET"),
    }
    if run.device.type == "cuda":
        p = torch.cuda.get_device_properties(run.device)
        info.update(
            name=p.name,
            sm_count=p.multi_processor_count,
            capability=f"{p.major}.{p.minor}",
            memory_gib=round(p.total_memory / 2**30, 1),
            l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
        )
    return info


def section_correctness(run: Run) -> dict:
    # (b, h, n, d, c, pad_frac, noise, fully padded row): awkward N, C > N, C over several blocks, D 16..128
    cases = [
        (1, 2, 1, 64, 8, 0.0, False, False),
        (2, 3, 97, 64, 49, 0.2, False, True),
        (2, 2, 1025, 32, 64, 0.1, True, False),
        (1, 4, 4099, 128, 70, 0.0, False, False),
        (1, 2, 2000, 16, 256, 0.3, True, False),
        (3, 2, 50, 64, 64, 0.0, True, False),
    ]
    if run.smoke:
        cases = [(1, 1, 5, 16, 8, 0.0, False, False), (2, 1, 37, 32, 20, 0.2, True, True)]
    dtypes = run.dtypes + ([] if run.smoke else [torch.float32])
    rows, ok = [], True
    for b, h, n, d, c, pad, noise, full in cases:
        for dt in dtypes:
            xs, mask, z = lara_inputs(b, h, n, d, c, dt, run.device, seed=n + d, pad_frac=pad, noise=noise,
                                      fully_padded_row=full)  # fmt: skip
            x64 = [t.to(F64) for t in xs]
            z64 = None if z is None else z.to(F64)
            ref = lara_attention_ref(*x64, mask, 1.0, z64)
            out = lara_forward_triton(LaraInputs(*xs, mask, 1.0, z))
            err = max_err(out, ref)
            naive = max_err(lara_attention_ref(*xs, mask, 1.0, z), ref)  # reference in the kernel's dtype
            torch_path = max_err(lara_forward_cpu(LaraInputs(*xs, mask, 1.0, z)), ref)  # fp32 compute, rounded output
            floor = FLOOR_REL[dt] * ref.abs().max().item()
            passed = bool(torch.isfinite(out).all()) and err <= 2 * naive + floor
            if mask is not None:
                passed = passed and bool((out.masked_select(mask[:, None, :, None]) == 0).all())
            ok &= passed
            rows.append(dict(b=b, h=h, n=n, d=d, c=c, pad=pad, noise=noise, fully_padded_row=full,
                             dtype=str(dt).removeprefix("torch."), err=err, err_ref_in_dtype=naive,
                             err_torch_path=torch_path, floor=floor, passed=passed))  # fmt: skip
    worst = {}
    for r in rows:
        worst[r["dtype"]] = max(worst.get(r["dtype"], 0.0), r["err"])
    return {"all_passed": ok, "max_err_by_dtype": worst, "cases": rows}


def section_ceilings(run: Run) -> dict:
    dev = run.device
    numel = (1 << 14) if run.smoke else (1 << 29)  # 2 GiB fp32 each way on a GPU: well past the L2
    src = torch.randn(numel, device=dev)
    dst = torch.empty_like(src)
    nbytes = 2 * src.nbytes  # read + write
    t = time_ms(run, lambda: dst.copy_(src), budget_s=0.5)
    res = {"copy_bytes": nbytes, "copy": t, "copy_GBps": round(nbytes / t["median_ms"] / 1e6, 1)}
    src = dst = None  # free 4 GiB before the matmuls
    m = 256 if run.smoke else 8192
    for dt in run.dtypes:
        a, b_ = torch.randn(m, m, device=dev, dtype=dt), torch.randn(m, m, device=dev, dtype=dt)
        t = time_ms(run, lambda a=a, b_=b_: a @ b_, budget_s=0.5)
        res[f"matmul_{str(dt).removeprefix('torch.')}_TFLOPs"] = round(2 * m**3 / t["median_ms"] / 1e9, 4)
    return res


def lara_traffic(n: int, h: int, d: int, c: int, elt: int, block_c: int = 64) -> tuple[int, float, float]:
    """(bytes, nominal FLOPs, executed FLOPs) of one Triton call with B = 1.

    Kernel 1 reads q, k, v once per block of C; kernel 3 reads q and writes the output once. The brief's
    nominal FLOP count is 10 C N D H; the kernels execute six C x N x D products (12 C N D H) when
    C <= block_c (two more per extra block).
    """
    c_blocks = math.ceil(c / block_c)
    nbytes = (3 * c_blocks + 2) * n * h * d * elt
    executed = (12 + (2 if c_blocks > 1 else 0)) * c * n * d * h
    return nbytes, 10.0 * c * n * d * h, float(executed)


def time_one_size(run: Run, dt: torch.dtype, n: int, h: int, d: int, c: int, proj: torch.Tensor) -> dict:
    """One row of the timing table: every method at one (dtype, N), plus achieved rates of the kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    (q, k, v, ql, kl), _, _ = lara_inputs(1, h, n, d, c, dt, run.device, seed=n)
    mask = torch.zeros(1, n, dtype=torch.bool, device=run.device)
    mask[:, int(0.9 * n) :] = True  # 10% padding
    backend = SDPBackend.MATH if run.smoke else SDPBackend.FLASH_ATTENTION  # no flash on a CPU

    def sdpa():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)

    methods = {
        "lara_triton": lambda: lara_forward_triton(LaraInputs(q, k, v, ql, kl, None, 1.0, None)),
        "lara_triton_padded10": lambda: lara_forward_triton(LaraInputs(q, k, v, ql, kl, mask, 1.0, None)),
        "lara_torch": lambda: lara_forward_cpu(LaraInputs(q, k, v, ql, kl, None, 1.0, None)),
        "performer": lambda: kernels.performer_attention(q, k, v, proj),
        "sdpa_flash": sdpa,
    }
    row: dict = {"n": n, "dtype": str(dt).removeprefix("torch."), "b": 1, "h": h, "d": d, "c": c}
    for name, fn in methods.items():
        try:
            row[name] = time_ms(run, fn, budget_s=0.6 if n < 65536 else 1.2)["median_ms"]
        except Exception as exc:
            row[name] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
    try:  # large-N sanity: Triton vs the fp32 PyTorch path on the same inputs
        ref = lara_forward_cpu(LaraInputs(q, k, v, ql, kl, None, 1.0, None)).to(F64)
        row["max_abs_diff_vs_torch_path"] = max_err(methods["lara_triton"](), ref)
    except Exception as exc:
        row["max_abs_diff_vs_torch_path"] = f"error: {exc}"
    t = row.get("lara_triton")
    if not isinstance(t, float):
        return row
    ceil = run.results.get("ceilings", {})
    nbytes, nominal, executed = lara_traffic(n, h, d, c, q.element_size())
    row["lara_triton_GBps"] = round(nbytes / t / 1e6, 1)
    row["lara_triton_TFLOPs_nominal"] = round(nominal / t / 1e9, 3)
    row["lara_triton_TFLOPs_executed"] = round(executed / t / 1e9, 3)
    if isinstance(ceil.get("copy_GBps"), float) and ceil["copy_GBps"] > 0:
        row["frac_of_copy_bw"] = round(row["lara_triton_GBps"] / ceil["copy_GBps"], 3)
    mm = ceil.get(f"matmul_{row['dtype']}_TFLOPs")
    if isinstance(mm, float) and mm > 0:
        row["frac_of_matmul_rate_executed"] = round(row["lara_triton_TFLOPs_executed"] / mm, 3)
    for other in ("lara_torch", "performer", "sdpa_flash"):
        if isinstance(row.get(other), float):
            row[f"speedup_vs_{other}"] = round(row[other] / t, 2)
    return row


def section_timing(run: Run) -> dict:
    h, d, c = (2, 16, 8) if run.smoke else (8, 64, 64)
    proj = orthogonal_gaussian_projection(h, 64, d, torch.Generator().manual_seed(0)).to(run.device)
    rows = []
    for dt in run.dtypes:
        for n in run.seq_lens:
            if run.left() < 40:
                rows.append({"n": n, "dtype": str(dt), "skipped": "time budget"})
                continue
            try:
                rows.append(time_one_size(run, dt, n, h, d, c, proj))
            except Exception as exc:
                rows.append({"n": n, "dtype": str(dt), "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return {"rows": rows}


def tiny_text_model(model_dir: Path) -> Path:
    """A randomly initialized tiny text model saved like a shipped one (for --cpu-smoke only)."""
    from lara_serve.model_export import build_model, get_config, make_config_dict, save_pretrained
    from lara_serve.model_export.models.registry import LABELS

    cfg = get_config("tiny-text")
    save_pretrained(build_model(cfg, seed=0), make_config_dict("tiny-text", cfg, LABELS["tiny-text"]), model_dir)
    return model_dir


def section_e2e(run: Run) -> dict:
    model_dir = run.model_dir
    try:
        from lara_serve.model_export import load_pretrained
    except Exception as exc:
        return {"skipped": f"lara_serve.model_export.load_pretrained unavailable: {exc}"}
    if run.smoke and not (model_dir / "config.json").is_file():
        model_dir = tiny_text_model(Path(run.out) / "tiny-text")  # exercise this section's code
    if not (model_dir / "config.json").is_file():
        return {"skipped": f"{model_dir} not found"}
    conf = json.loads((model_dir / "config.json").read_text())
    heads, dim = conf["model"].get("heads"), conf["model"].get("dim")
    max_len = int(conf.get("preprocessing", {}).get("max_length", 1024))
    n = min(max_len, 256 if run.smoke else max_len)
    b = 2 if run.smoke else 8
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 257, (b, n), generator=g)
    lengths = torch.linspace(n, max(1, n // 8), b).long()
    attn = (torch.arange(n)[None, :] < lengths[:, None]).long()
    ids = ids * attn
    cpu_model = load_pretrained(model_dir, map_location="cpu")
    with torch.inference_mode():
        ref = cpu_model(ids[:2], attn[:2])
    res: dict = {"model_dir": str(model_dir), "batch": b, "seq_len": n, "attention": conf.get("attention")}
    if heads and dim:  # which LARA backend the model's attention gets on this device, and why
        for dt in (torch.float32, *run.dtypes):
            x = torch.zeros(1, heads, 8, dim // heads, device=run.device, dtype=dt)
            res[f"backend_{str(dt).removeprefix('torch.')}"] = kernels.describe_backends(
                x, x, x, x[:, :, :2], x[:, :, :2]
            )
    dev_model = load_pretrained(model_dir, map_location=run.device)
    ids_d, attn_d = ids.to(run.device), attn.to(run.device)
    variants = {"fp32": None} if run.smoke else {"fp32": None, "autocast_bf16": torch.bfloat16,
                                                   "autocast_fp16": torch.float16}  # fmt: skip
    for name, amp in variants.items():

        def call(amp=amp):
            with torch.inference_mode(), torch.autocast(run.device.type, dtype=amp or torch.float32,
                                                        enabled=amp is not None):  # fmt: skip
                return dev_model(ids_d, attn_d)

        try:
            out = call()
            res[name] = {
                "max_abs_logit_diff_vs_cpu": max_err(out[:2].float().cpu(), ref.to(F64)),
                "same_argmax_as_cpu": bool((out[:2].float().cpu().argmax(-1) == ref.argmax(-1)).all()),
                **time_ms(run, call, budget_s=1.0),
            }
            res[name]["sequences_per_s"] = round(b / res[name]["median_ms"] * 1e3, 1)
        except Exception as exc:
            res[name] = f"error: {type(exc).__name__}: {str(exc)[:300]}"
    return res


def section_sweep(run: Run) -> dict:
    n, h, d, c = (128, 2, 16, 8) if run.smoke else (65536, 8, 64, 64)
    (q, k, v, ql, kl), _, _ = lara_inputs(1, h, n, d, c, run.dtypes[0], run.device, seed=1)
    configs = [LaunchConfig()] + [
        LaunchConfig(block_n_keys=bk, block_n_queries=bq, warps_keys=wk, warps_queries=wq, stages=st)
        for bk, bq, wk, wq, st in [
            (128, 64, 8, 4, 2),
            (64, 128, 4, 8, 2),
            (32, 64, 4, 4, 3),
            (64, 64, 4, 4, 3),
            (128, 128, 8, 8, 3),
            (64, 32, 4, 4, 2),
        ]
    ]
    configs += [LaunchConfig(num_splits=1), LaunchConfig(num_splits=64)]
    rows = []
    for cfg in configs[: 2 if run.smoke else None]:
        if run.left() < 15:
            rows.append({"config": repr(cfg), "skipped": "time budget"})
            continue
        try:
            t = time_ms(
                run, lambda cfg=cfg: lara_forward_triton(LaraInputs(q, k, v, ql, kl, None, 1.0, None), config=cfg)
            )
            rows.append({"config": repr(cfg), **t})
        except Exception as exc:
            rows.append({"config": repr(cfg), "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    timed = [r for r in rows if "median_ms" in r]
    return {"n": n, "dtype": str(run.dtypes[0]), "rows": rows,
            "best": min(timed, key=lambda r: r["median_ms"]) if timed else None}  # fmt: skip


def section_profile(run: Run) -> dict:
    if run.device.type != "cuda":
        return {"skipped": "GPU only"}
    from torch.profiler import ProfilerActivity, profile

    n, h, d, c = 65536, 8, 64, 64
    (q, k, v, ql, kl), _, _ = lara_inputs(1, h, n, d, c, torch.float16, run.device, seed=2)
    lara_forward_triton(LaraInputs(q, k, v, ql, kl, None, 1.0, None))
    sync(run.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            lara_forward_triton(LaraInputs(q, k, v, ql, kl, None, 1.0, None))
        sync(run.device)
    kern = {}
    for evt in prof.key_averages():
        dev_us = getattr(evt, "device_time", None) or getattr(evt, "cuda_time", 0)
        if dev_us:
            kern[evt.key[:80]] = round(dev_us, 2)  # mean us per call
    return {"n": n, "mean_us_per_call": kern}


def sm90_build() -> dict:
    """Compile every kernel for sm_90 on this machine (no GPU needed: Triton's bundled ptxas) and report
    registers, stack (spills) and shared memory per variant. Uses Triton's internal ASTSource API."""
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lara_serve.kernels._triton import lara as lk

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    f32_ptrs = {"F", "BIAS", "RLSE", "BH"}
    rows = []
    for dt, d in [("fp16", 64), ("bf16", 64), ("fp16", 16), ("fp16", 32), ("fp16", 128), ("fp32", 64)]:
        tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dt]
        for c in (64, 256):
            cfg = lk._default_config(LaunchConfig(num_splits=1), 8, 1 << 16, c, d, tdt, torch.device("cuda"))
            prec = "tf32x3" if dt == "fp32" else "tf32"
            c_blocks = math.ceil(c / cfg.block_c)
            kernels_ = [
                (lk._lara_keys_kernel, cfg.warps_keys, dict(D=d, BLOCK_C=cfg.block_c, BLOCK_N=cfg.block_n_keys,
                 HAS_MASK=True, HAS_NOISE=True, DOT_PRECISION=prec)),
                (lk._lara_combine_kernel, 4, dict(D=d, BLOCK_C=32 if d <= 64 else 16, HAS_NOISE=True)),
                (lk._lara_queries_kernel, cfg.warps_queries, dict(D=d, BLOCK_C=cfg.block_c,
                 BLOCK_N=cfg.block_n_queries, NUM_C_BLOCKS=c_blocks, HAS_MASK=True, HAS_NOISE=True,
                 DOT_PRECISION=prec, OUT_PRECISION=prec, ALPHA_MIN=1e-8)),
            ]  # fmt: skip
            for fn, warps, consts in kernels_:

                def arg_type(name, consts=consts, dt=dt):
                    if name in consts:
                        return "constexpr"
                    if name == "MASK":
                        return "*u8"
                    if name.startswith("PART") or name in f32_ptrs:
                        return "*fp32"
                    if name[0].isupper() and name not in ("H", "N", "C"):  # tensors are UPPER_CASE
                        return "*" + dt
                    return "fp32" if name in ("qk_scale2", "alpha_coeff") else "i32"

                row = {"kernel": fn.__name__, "dtype": dt, "d": d, "c": c, "warps": warps, **consts}
                try:
                    src = ASTSource(fn, {a: arg_type(a) for a in fn.arg_names}, consts)
                    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                       options=dict(num_warps=warps, num_stages=cfg.stages))  # fmt: skip
                    with tempfile.NamedTemporaryFile(suffix=".cubin") as tmp:
                        tmp.write(k.asm["cubin"])
                        tmp.flush()
                        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", tmp.name],
                                               capture_output=True, text=True).stdout  # fmt: skip
                    line = next((ln for ln in usage.splitlines() if "REG:" in ln), "")
                    row.update({kv.split(":")[0].lower(): int(kv.split(":")[1]) for kv in line.split()
                                if kv.split(":")[0] in ("REG", "STACK")})  # fmt: skip
                    row["shared_bytes"] = k.metadata.shared
                    row["wgmma"] = "wgmma" in k.asm["ptx"]
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                rows.append(row)
                print(row, flush=True)
    return {"rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    ap.add_argument("--out", default=None, help="output folder (default $OUT, else benchmarks/results)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting new work after this")
    ap.add_argument("--sm90-build", action="store_true", help="only compile the kernels for sm_90 (no GPU)")
    ap.add_argument("--model-dir", default=str(ROOT / "model_repository" / "lara-text-news-bytes"), help="for e2e")
    args = ap.parse_args()
    if args.sm90_build:
        res = sm90_build()
        out = Path(args.out or ROOT / "benchmarks" / "results")
        out.mkdir(parents=True, exist_ok=True)
        (out / "sm90_build.json").write_text(json.dumps(res, indent=1) + "\n")
        return
    run = Run(args)
    if not run.smoke and not torch.cuda.is_available():
        print("no CUDA device: use --cpu-smoke to check the script on a CPU", file=sys.stderr)
        sys.exit(2)
    run.section("env", section_env)
    run.section("correctness", section_correctness)
    run.section("ceilings", section_ceilings)
    run.section("timing", section_timing, min_left_s=60)
    run.section("e2e", section_e2e, min_left_s=30)
    run.section("sweep", section_sweep, min_left_s=30)
    run.section("profile", section_profile, min_left_s=15)
    print(f"wrote {run.out / run.json_name} in {time.monotonic() - run.t0:.0f} s")


if __name__ == "__main__":
    main()
