"""Training throughput and peak memory of `lara train`'s default text recipe, at 4, 16 and 64 KB documents,
in one process and in two (torch.distributed, gloo, through lara_serve.model_export.your_data.dist) on the same cores.

    python -m benchmarks.train_throughput                       # writes results/train_throughput.{json,png}
    python -m benchmarks.train_throughput --steps 4 --warmup 1 --sizes 4   # a quick look

Each setting runs in fresh processes (so the peak RSS is that setting's own): the default text model
(lara-text-news-bytes's architecture with the recipe's attention pooling and case folding) trained by
lara_serve.model_export.your_data.fit.fit on the recipe's batches (LengthMixTask windows of 256 B-8 KB and same-label
composites, lara_serve.model_export.training.augment.TextAugment noise and filler, 24 K tokens a batch). The batch plan is
built before the clock starts and timed apart (the data side); the step clock covers what the training
loop does per batch (forward, backward, gradient all-reduce, clipping, optimizer), after warm-up steps.

A "document" here is one training example: a window of a document (or of a composite), as the recipe
draws them; documents longer than the longest window cost what their windows cost. Per core: one
process runs with all `--cores` threads, two processes with cores / 2 threads each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "train_throughput.json"
SIZES_KB = (4, 16, 64)
LABELS = ("alpha", "beta", "gamma", "delta")
RECIPE_TOKENS = 24576  # lara_serve.model_export.your_data.recipe.length_mix's tokens_per_batch


def documents(n: int, kb: int, seed: int = 0) -> tuple[list[bytes], list[int]]:
    """n documents of kb KB each: prose of a per-label vocabulary plus shared words, labels in turn."""
    rng = random.Random(seed)
    shared = [f"w{i}" for i in range(300)]
    vocab = [[f"{name}{i}" for i in range(60)] for name in LABELS]
    docs, labels = [], []
    for i in range(n):
        y = i % len(LABELS)
        words: list[str] = []
        size = 0
        while size < kb * 1024:
            words.append(rng.choice(vocab[y]) if rng.random() < 0.2 else rng.choice(shared))
            size += len(words[-1]) + 1
        docs.append(" ".join(words).encode()[: kb * 1024])
        labels.append(y)
    return docs, labels


class _FixedBatches:
    """A task that yields the same prepared batches (the recipe's) and records when each is asked for:
    the time between two requests is one step of the training loop."""

    def __init__(self, batches: list[tuple[Any, Any]]) -> None:
        self.batches, self.asked = batches, []

    def steps_per_epoch(self, batch_size: int) -> int:
        return len(self.batches)

    def train_batches(self, batch_size: int, g: Any):
        for b in self.batches:
            self.asked.append(time.perf_counter())
            yield b
        self.asked.append(time.perf_counter())


def _recipe_batches(kb: int, n_docs: int, count: int, tokens: int) -> tuple[list[tuple[Any, Any]], dict[str, float]]:
    """`count` batches of the default text recipe over documents of kb KB; and the data side's cost."""
    import torch

    from lara_serve.model_export.training.long_docs import LengthMixTask
    from lara_serve.model_export.your_data.recipe import capped, length_mix, text_augment

    docs, labels = documents(n_docs, kb)
    task = LengthMixTask(docs, torch.tensor(labels), 65536, **{**length_mix(65536), "tokens_per_batch": tokens})
    aug = text_augment(65536)
    assert aug is not None
    aug(b"warm the filler bank", random.Random(0))  # read the installed filler sources before the clock
    task.text_augment = capped(aug, 65536)
    batches: list[tuple[Any, Any]] = []
    t0, epoch = time.perf_counter(), 0
    while len(batches) < count:
        batches += [(x, y) for x, y, *_ in task.train_batches(0, torch.Generator().manual_seed(epoch))]
        epoch += 1
    data_s = time.perf_counter() - t0
    examples = sum(len(y) for _, y in batches)
    return batches[:count], {"data_s_per_doc": data_s / examples}


def worker(args: argparse.Namespace) -> None:
    """One process's part of one setting; rank 0 writes the JSON record to args.record."""
    import torch

    from lara_serve.model_export.models.config import TextConfig
    from lara_serve.model_export.models.registry import build_model, get_config
    from lara_serve.model_export.your_data import dist as userdist
    from lara_serve.model_export.your_data.fit import FitSettings, fit
    from lara_serve.model_export.your_data.recipe import text_config

    torch.set_num_threads(args.threads)
    group = userdist.setup()
    batches, data = _recipe_batches(args.kb, args.docs, args.warmup + args.steps, args.tokens_per_batch)
    base = get_config(args.arch)
    assert isinstance(base, TextConfig)
    cfg = text_config(dataclasses.replace(base, num_classes=len(LABELS)))
    torch.manual_seed(0)
    model = build_model(cfg, seed=0)
    task = _FixedBatches(batches)
    settings = FitSettings(lr=1e-3, weight_decay=0.01, label_smoothing=0.1, batch_size=0, epochs=1,
                           time_budget_s=None, seed=0)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        fit(model, task, lambda m: 0.0, settings, Path(tmp) / "ckpt", {}, progress="quiet", group=group)
    step_s = [b - a for a, b in zip(task.asked, task.asked[1:], strict=False)][args.warmup :]
    timed = batches[args.warmup :]
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    peaks = _gather(group, peak_mib)
    userdist.teardown(group)
    if not group.main:
        return
    docs = sum(len(y) for _, y in timed)
    tokens = sum(int(x["attention_mask"].sum()) for x, _ in timed)
    seconds = sum(step_s)
    record = {
        "doc_kb": args.kb,
        "processes": group.world,
        "threads_per_process": args.threads,
        "cores": group.world * args.threads,
        "warmup_steps": args.warmup,
        "steps": len(step_s),
        "docs": docs,
        "tokens": tokens,
        "step_s": [round(s, 4) for s in step_s],
        # A batch of fewer examples than processes leaves a process without work for that step (it adds
        # zero gradients): the recipe's long windows make such batches, in `lara train` as here.
        "examples_per_step": [len(y) for _, y in timed],
        "docs_per_s": docs / seconds,
        "docs_per_s_per_core": docs / seconds / (group.world * args.threads),
        "tokens_per_s": tokens / seconds,
        "data_s_per_doc": round(data["data_s_per_doc"], 6),
        "peak_rss_mib_per_process": [round(p, 1) for p in peaks],
        "peak_rss_mib_total": round(sum(peaks), 1),
    }
    Path(args.record).write_text(json.dumps(record))


def _gather(group: Any, value: float) -> list[float]:
    """Every process's value, in rank order (one all-reduce of a one-hot vector)."""
    if group.world == 1:
        return [value]
    import torch
    import torch.distributed as dist

    buf = torch.zeros(group.world, dtype=torch.float64)
    buf[group.rank] = value
    dist.all_reduce(buf)
    return buf.tolist()


def run_setting(kb: int, processes: int, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    """One setting in fresh processes of `threads` threads each; returns rank 0's record."""
    from lara_serve.server.testing import free_port

    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "record.json"
        common = ["-m", "benchmarks.train_throughput", "--worker", "--kb", str(kb), "--threads", str(threads),
                  "--steps", str(args.steps), "--warmup", str(args.warmup), "--docs", str(args.docs),
                  "--arch", args.arch, "--tokens-per-batch", str(args.tokens_per_batch),
                  "--record", str(record)]  # fmt: skip
        if processes == 1:
            cmd = [sys.executable, *common]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                   "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *common]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        return json.loads(record.read_text())


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    layouts = sorted({(r["processes"], r["threads_per_process"]) for r in result["rows"]}, key=lambda x: -x[1])
    for (procs, threads), style in zip(layouts, ("o-", "s--", "^:"), strict=False):
        rows = [r for r in result["rows"] if (r["processes"], r["threads_per_process"]) == (procs, threads)]
        kbs = [r["doc_kb"] for r in rows]
        label = f"{procs} proc x {threads} thread{'s' * (threads > 1)}"
        ax1.plot(kbs, [r["docs_per_s_per_core"] for r in rows], style, label=label)
        ax2.plot(kbs, [r["peak_rss_mib_total"] for r in rows], style, label=f"{label}, all processes")
    for ax, title in ((ax1, "training documents / s / core"), (ax2, "peak RSS (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("document size (KB)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    # The run's note (what else ran on the machine) is in the JSON; the title says what was measured.
    fig.suptitle(f"lara train, default text recipe, {result['cores']} shared cores, "
                 f"{result['tokens_per_batch']:,}-token batches", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=",".join(map(str, SIZES_KB)), help="document sizes in KB, comma-separated")
    p.add_argument("--cores", type=int, default=2, help="cores shared by the one or two processes")
    p.add_argument("--steps", type=int, default=6, help="timed steps per setting")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (allocator, thread pools)")
    p.add_argument("--docs", type=int, default=64, help="documents per setting (the batch plan draws from them)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per setting")
    p.add_argument("--also-one-thread", action="store_true", help="add 1 process x 1 thread (per-core reference)")
    p.add_argument("--tokens-per-batch", type=int, default=RECIPE_TOKENS,
                   help="the batch's token budget (the recipe's by default; smaller: quicker steps, and the "
                   "fixed per-step costs, optimizer and all-reduce, weigh more)")  # fmt: skip
    p.add_argument("--arch", default="lara-text-news-bytes", help="registered text architecture (tests: tiny-text)")
    p.add_argument("--note", default="", help="what else ran on the machine (recorded)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kb", type=int, default=4, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--record", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    from benchmarks.common import environment

    rows = []
    for kb in (int(s) for s in args.sizes.split(",")):
        # 1 x cores threads and 2 x cores/2 on the same cores; optionally 1 x 1, the per-core reference
        # without an intra-op thread pool (whose per-op barrier suffers most when the cores are shared).
        layouts = [(1, args.cores), (2, max(1, args.cores // 2))] + [(1, 1)] * args.also_one_thread
        for procs, threads in layouts:
            rows.append(run_setting(kb, procs, threads, args))
            r = rows[-1]
            print(f"{kb:3d} KB, {procs} proc x {threads} thr: {r['docs_per_s_per_core']:.3f} docs/s/core, "
                  f"{r['tokens_per_s']:.0f} tokens/s, peak RSS {r['peak_rss_mib_total']:.0f} MiB", flush=True)  # fmt: skip
    ratio = {}
    for kb in sorted({r["doc_kb"] for r in rows}):
        one, two = (next(r for r in rows if r["doc_kb"] == kb and r["cores"] == args.cores and r["processes"] == n)
                    for n in (1, 2))  # fmt: skip
        ratio[str(kb)] = round(two["docs_per_s"] / one["docs_per_s"], 3)
    result = {
        "benchmark": "train_throughput",
        "command": "python -m benchmarks.train_throughput " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cores": args.cores,
        "arch": args.arch,
        "tokens_per_batch": args.tokens_per_batch,
        "note": args.note,
        "environment": environment(),
        "two_over_one_process_throughput": ratio,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    chart(result, args.out.with_suffix(".png"))
    print(f"2-process / 1-process throughput: {ratio}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
