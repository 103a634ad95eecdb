"""Attention benchmark: speed, memory and approximation error of softmax, Performer, RA and LARA.

    python -m benchmarks.attention            # CPU sweep N = 1K..64K, writes results/attention.{json,png}
    python -m benchmarks.attention --quick    # N = 1K..8K only, fewer repeats
    python -m benchmarks.attention --sizes 8192 32768 --out attention_targets.json   # the issue's targets

lara_op is the public function with the automatic backend (on CPU the compiled kernel of
kernels/csrc/ when it builds); lara_torch is the blocked PyTorch path it falls back to.

Shapes follow the issue: B=1, H=4, D=64, C=64 landmarks (chunk means), fp32. Softmax is torch SDPA.
Speed targets are read as ratios within one run (these machines are shared and noisy).

Memory allocation: by default the process allocates as the server's torch backend does
(`lara_serve.server.backends.allocator.keep_freed_memory`: glibc serves large blocks from its heap and keeps them),
so a method's output buffer is reused between calls as it is in serving; with glibc's default, each call's
32 MiB output at N = 32K (and anything of 32 MiB or more) is a fresh mmap whose pages the kernel faults in
and zeroes on every call. `--malloc default` measures that instead. The memory probe runs in a fresh child
process either way.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import torch
from tqdm import tqdm

from benchmarks.common import (
    RESULTS,
    environment,
    markdown_table,
    matmul_gflops,
    median_time,
    peak_extra_memory_mib,
    write_json,
)
from lara_serve import kernels
from lara_serve.kernels.reference import lara_attention_ref, orthogonal_gaussian_projection, softmax_attention_ref

B, H, D, C = 1, 4, 64, 64
SOFTMAX_MAX_N = 16384  # quadratic: beyond this one SDPA call takes tens of seconds on 2 cores


def _inputs(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for _ in range(3))
    return q, k, v, kernels.chunk_means_1d(q, C), kernels.chunk_means_1d(k, C)


def _methods(n: int):
    q, k, v, ql, kl = _inputs(n)
    proj = orthogonal_gaussian_projection(H, C, D, torch.Generator().manual_seed(1)).float()
    methods = {
        # lara_op: the public function, automatic backend (the compiled kernel on CPU when it builds)
        "lara_op": lambda: kernels.lara_attention(q, k, v, ql, kl),
        # lara_torch: the blocked PyTorch path it replaced (and still falls back to)
        "lara_torch": lambda: kernels.lara_attention(q, k, v, ql, kl, backend="torch"),
        "lara_reference": lambda: lara_attention_ref(q, k, v, ql, kl),
        "performer": lambda: kernels.performer_attention(q, k, v, proj),
    }
    if n <= SOFTMAX_MAX_N:
        methods["softmax_sdpa"] = lambda: kernels.softmax_attention(q, k, v)
    return methods


@torch.no_grad()
def _memory_probe(method: str, n: int, threads: int) -> float | None:
    """Runs in a fresh process: there the first call's resident high-water mark is the method's own
    peak (a warm process reuses freed heap, which hides it)."""
    torch.set_num_threads(threads)
    _methods(256)[method]()  # first-call set-up (thread pools, dispatch caches) is not the method's memory
    fn = _methods(n)[method]
    return peak_extra_memory_mib(fn)


def peak_memory(method: str, n: int) -> float | None:
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_memory_probe, method, n, torch.get_num_threads()).result()


@torch.no_grad()
def speed_sweep(sizes: list[int], budget_s: float, only: list[str] | None = None) -> list[dict]:
    rows = []
    for n in tqdm(sizes, desc="speed sweep", unit="N"):
        for name, fn in _methods(n).items():
            if only and name not in only:
                continue
            t = median_time(fn, budget_s=budget_s)
            rows.append({"method": name, "n": n, "seconds": t, "peak_extra_mib": peak_memory(name, n)})
    return rows


# ----------------------------------------------------------------------------- approximation error
def _clustered(n: int, d: int, clusters: int, seed: int):
    """Queries and keys that sit in contiguous runs around a few centres (like regions of an image or
    paragraphs of a document), values independent: the structure LARA's pooled proposals exploit."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(clusters, d, generator=g, dtype=torch.float64) * 1.5
    run = torch.arange(n) * clusters // n  # contiguous cluster runs
    base = centres[run]
    q = base + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64)
    k = base + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64)
    v = torch.randn(n, d, generator=g, dtype=torch.float64)
    return (t.reshape(1, 1, n, d) for t in (q, k, v))


def _gaussian(n: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 1, n, d, generator=g, dtype=torch.float64) for _ in range(3))


@torch.no_grad()
def approximation(n: int = 1024, d: int = 64, c: int = 64, seeds: int = 3) -> list[dict]:
    """Relative error ||y - y_softmax|| / ||y_softmax|| at an equal budget: LARA with C proposals (eval,
    one sample each) vs Performer with C random features vs RA (eval mixture mean, and one sample)."""
    rows = []
    for kind, make in (("clustered", lambda s: _clustered(n, d, 16, s)), ("gaussian", lambda s: _gaussian(n, d, s))):
        errs: dict[str, list[float]] = {}
        for seed in range(seeds):
            q, k, v = make(seed)
            exact = softmax_attention_ref(q, k, v)
            proj = orthogonal_gaussian_projection(1, c, d, torch.Generator().manual_seed(100 + seed))
            g = torch.Generator().manual_seed(200 + seed)
            est = {
                "lara_eval": kernels.lara_attention(
                    q, k, v, kernels.chunk_means_1d(q, c), kernels.chunk_means_1d(k, c)
                ),
                "performer": kernels.performer_attention(q, k, v, proj),
                "ra_eval": kernels.randomized_attention(q, k, v),
                "ra_sample": kernels.randomized_attention(
                    q,
                    k,
                    v,
                    noise=torch.randn(1, 1, n, d, generator=g, dtype=torch.float64) * d**0.25,
                    uniforms=torch.rand(1, 1, n, generator=g, dtype=torch.float64),
                ),
            }
            for name, y in est.items():
                errs.setdefault(name, []).append(((y - exact).norm() / exact.norm()).item())
        for name, e in errs.items():
            rows.append({"inputs": kind, "method": name, "n": n, "budget": c, "relative_error": sum(e) / len(e)})
    return rows


# ----------------------------------------------------------------------------- report
def _lookup(rows: list[dict], method: str, n: int, key: str = "seconds") -> float | None:
    for r in rows:
        if r["method"] == method and r["n"] == n:
            return r[key]
    return None


def targets(rows: list[dict], gflops: float) -> dict:
    t8, t32 = _lookup(rows, "lara_op", 8192), _lookup(rows, "lara_op", 32768)
    sdpa8 = _lookup(rows, "softmax_sdpa", 8192)
    out: dict = {"matmul_gflops": gflops, "lara_op_backend": _lara_backend()}
    for n in (8192, 32768):
        torch_t, op_t = _lookup(rows, "lara_torch", n), _lookup(rows, "lara_op", n)
        if torch_t and op_t:
            out[f"speedup_vs_lara_torch_at_{n}"] = torch_t / op_t
        mem = _lookup(rows, "lara_op", n, "peak_extra_mib")
        if mem is not None:
            out[f"lara_op_extra_mib_at_{n}"] = mem
            out[f"size_of_q_mib_at_{n}"] = B * H * n * D * 4 / 2**20
    if t8 and sdpa8:
        out["speedup_vs_sdpa_at_8192"] = sdpa8 / t8
    if t8 and t32:
        out["time_ratio_32768_over_8192"] = t32 / t8
    if t8:
        achieved = 10 * C * 8192 * D * H / t8 / 1e9
        out["lara_gflops_at_8192"] = achieved
        out["fraction_of_matmul_rate_at_8192"] = achieved / gflops
    mems = [(r["n"], r["peak_extra_mib"]) for r in rows if r["method"] == "lara_op" and r["peak_extra_mib"]]
    if len(mems) >= 2:
        (n0, m0), (n1, m1) = mems[-2], mems[-1]
        out["lara_memory_mib_per_doubling"] = {"from": [n0, m0], "to": [n1, m1], "ratio": m1 / max(m0, 1e-9)}
    return out


@torch.no_grad()
def cpu_time_share(n: int = 8192, repeats: int = 5) -> dict:
    """Share of the matmul rate from PROCESS CPU time at one thread: on a shared, overloaded machine
    wall time mostly measures waiting for a core, CPU time what the code itself costs. One thread,
    so no OpenMP barrier spinning is counted."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
        q, k, v, ql, kl = _inputs(n)

        def best(fn) -> float:
            fn()
            out = []
            for _ in range(repeats):
                t0 = time.process_time()
                fn()
                out.append(time.process_time() - t0)
            return min(out)

        mm = 2 * 2048**3 / best(lambda: a @ b) / 1e9
        lara = 10 * C * n * D * H / best(lambda: kernels.lara_attention(q, k, v, ql, kl)) / 1e9
    finally:
        torch.set_num_threads(threads)
    return {"n": n, "threads": 1, "matmul_gflops": mm, "lara_gflops": lara, "fraction_of_matmul_rate": lara / mm}


def _lara_backend() -> str:
    q, k, v, ql, kl = _inputs(64)
    return kernels.describe_backends(q, k, v, ql, kl)["chosen"]


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for method in sorted({r["method"] for r in rows}):
        pts = [(r["n"], r["seconds"], r["peak_extra_mib"]) for r in rows if r["method"] == method]
        ax_t.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], marker="o", label=method)
        ax_m.plot([p[0] for p in pts], [p[2] or math.nan for p in pts], marker="o", label=method)
    for ax, label in ((ax_t, "time (ms)"), (ax_m, "peak extra memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend()
    fig.suptitle(f"Attention on CPU, B={B} H={H} D={D} C={C}, fp32")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N = 1K..8K and short timing budgets")
    parser.add_argument("--max-n", type=int, default=65536, help="largest sequence length of the sweep")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: library default)")
    parser.add_argument("--sizes", type=int, nargs="+", help="explicit sequence lengths (overrides the sweep)")
    parser.add_argument("--out", default="attention.json", help="file name under benchmarks/results/")
    parser.add_argument("--methods", nargs="+", help="only these methods (default: all)")
    parser.add_argument(
        "--malloc",
        choices=["server", "default"],
        default="server",
        help="server: glibc tuned as the server's torch backend is (keep_freed_memory); default: glibc as is",
    )
    args = parser.parse_args()
    if args.malloc == "server":
        from lara_serve.server.backends.allocator import keep_freed_memory

        reason = keep_freed_memory()
        if reason:
            parser.error(f"--malloc server: keep_freed_memory not in effect ({reason}); use --malloc default")
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = args.sizes or [2**p for p in range(10, 17) if 2**p <= (8192 if args.quick else args.max_n)]
    budget = 0.3 if args.quick else 1.0

    gflops_before = matmul_gflops()
    rows = speed_sweep(sizes, budget, args.methods)
    gflops = max(gflops_before, matmul_gflops())  # the better of two readings: contention only lowers it
    approx = approximation()
    summary = targets(rows, gflops)
    summary["cpu_time_share_at_8192"] = cpu_time_share()
    config = {"B": B, "H": H, "D": D, "C": C, "dtype": "float32", "sizes": sizes, "malloc": args.malloc}
    payload = {"config": config, "env": environment()}
    payload |= {"speed": rows, "approximation": approx, "targets": summary}
    path = write_json(args.out, payload)
    png = RESULTS / args.out.replace(".json", ".png")
    plot(rows, png)

    methods = sorted({r["method"] for r in rows})
    table = [[n] + [_lookup(rows, m, n) and _lookup(rows, m, n) * 1e3 for m in methods] for n in sizes]
    print(markdown_table(["N"] + [f"{m} ms" for m in methods], table))
    mem = [[n] + [_lookup(rows, m, n, "peak_extra_mib") for m in methods] for n in sizes]
    print()
    print(markdown_table(["N"] + [f"{m} MiB" for m in methods], mem))
    print()
    print(
        markdown_table(
            ["inputs", "method", "relative error"], [[r["inputs"], r["method"], r["relative_error"]] for r in approx]
        )
    )
    print()
    for key, value in summary.items():
        print(f"{key}: {value}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
