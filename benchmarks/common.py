"""Timing and memory helpers shared by the CPU benchmarks."""

from __future__ import annotations

import fcntl
import json
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"


# On 2026-12-06 the byte news model's folder became lara-text-news-bytes and the pretrained encoder's
# (lara-news-minilm) became lara-text-news: a commit before that holds each under its former name.
FORMER_FOLDERS = {"lara-text-news-bytes": "lara-text-news", "lara-text-news": "lara-news-minilm"}


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=RESULTS.parent.parent, capture_output=True)


def model_path_at(rev: str, model: str) -> str:
    """model_repository/<folder> in which commit `rev` shipped `model` (its former folder before the rename)."""
    renamed = _git("cat-file", "-e", f"{rev}:model_repository/lara-text-news-bytes").returncode == 0
    return f"model_repository/{model if renamed else FORMER_FOLDERS.get(model, model)}"


def shipped_onnx_at(rev: str, model: str) -> bytes:
    """The bytes of the model.onnx that commit `rev` shipped for `model` (to time today's code against it)."""
    done = _git("show", f"{rev}:{model_path_at(rev, model)}/1/model.onnx")
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


def median_time(fn: Callable[[], Any], *, min_repeats: int = 3, budget_s: float = 1.0, warmup: int = 1) -> float:
    """Median wall time in seconds over at least `min_repeats` runs (more while within `budget_s`)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_repeats or (time.perf_counter() - start < budget_s and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_memory_mib(fn: Callable[[], Any]) -> float | None:
    """Peak resident memory added while `fn` runs, in MiB (Linux: VmHWM reset through clear_refs).

    Returns None where the kernel interface is missing. Counts what the process touches, so allocator
    caching can only make it an over-estimate of the method's own working set.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS
        before = _status_kib("VmRSS")
        fn()
        return max(_status_kib("VmHWM") - before, 0) / 1024
    except OSError:
        return None


def matmul_gflops(n: int = 2048, dtype: torch.dtype = torch.float32) -> float:
    """This machine's dense matmul rate now (GFLOP/s), to express kernel speed as a fraction of it."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / median_time(lambda: a @ b, min_repeats=5) / 1e9


def environment() -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Lay out, write and close a matplotlib figure: a closed figure gives its memory back."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(x: Any) -> str:
        if x is None:
            return "-"
        if isinstance(x, float):
            return f"{x:.3g}"
        return str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def merge_fold_row(
    out: Path,
    lock_dir: Path,
    row: dict[str, Any],
    header: dict[str, Any],
    summarize: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> dict[str, Any]:
    """Add one cross-validation fold's row to the results file `out` and re-summarize, under a lock: folds
    run as parallel processes that write the same file. Rows of another experiment (a different `budget_min`
    in `header`) are dropped; a row for the same fold replaces the old one. A row without "wall_time_s" (a
    fold scored again rather than retrained) keeps the replaced row's: the time of the call that trained it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "merge.lock", "w") as lock:  # beside the runs, not among the committed results
        fcntl.flock(lock, fcntl.LOCK_EX)
        cur = json.loads(out.read_text()) if out.is_file() else {}
        if cur.get("budget_min") != header.get("budget_min"):
            cur = {}
        old = [r for r in cur.get("rows", []) if r["fold"] == row["fold"]]
        if "wall_time_s" not in row and old and "wall_time_s" in old[0]:
            row = {**row, "wall_time_s": old[0]["wall_time_s"]}
        rows = sorted([r for r in cur.get("rows", []) if r["fold"] != row["fold"]] + [row], key=lambda r: r["fold"])
        payload = {**header, "environment": environment(), "rows": rows, "summary": summarize(rows)}
        out.write_text(json.dumps(payload, indent=2) + "\n")
    return payload
