"""Train the conversion of the teacher to LARA: attention transfer, then embedding distillation.

python -m lara_serve.model_export.pretrained.transfer --out runs/DIR [--device cpu|cuda] [--time-budget MINUTES]
    [--max-pieces N] [--resume] ...

Stage 1, attention transfer (LoLCATs, Zhang et al. 2024; Hedgehog, Zhang et al. 2024): the teacher is frozen and
only the LARA-specific parameters (landmark modules) and low-rank adapters on q/k/v train. Every student layer
reads the TEACHER's input to that layer and its attention sublayer output must match the teacher's (relative
squared error per layer), so the six layers learn side by side and errors do not compound while they learn.
Stage 2, distillation: the whole student reads windows of 256-512 pieces (and, with --long-fraction, longer
ones up to --max-pieces) and its sentence embedding must match the teacher's in cosine; past 512 pieces the
teacher reads the window in 512-piece chunks (the mean of the chunks' embeddings).

The run folder holds student.json + converted.safetensors (the student, loadable by `fidelity --student`),
checkpoint.pt (optimizer and position in the run: --resume continues exactly), log.jsonl (one JSON object per
logged step, evaluation and checkpoint) and summary.json. The time budget counts all sessions of a run together.
Texts come from installed packages only (`corpus.training_texts`); the fidelity set is never read here, except
for the small progress evaluations at checkpoints, which do not steer training.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from lara_serve.model_export.pretrained.corpus import read_text_dir, training_texts
from lara_serve.model_export.pretrained.fidelity import (
    add_student_args,
    fidelity_report,
    heldout_pieces,
    student_config_from,
    teacher_reference,
)
from lara_serve.model_export.pretrained.student import (
    load_student,
    save_student,
    set_trainable,
    student_from_model,
    student_from_teacher,
)
from lara_serve.model_export.pretrained.teacher import BertEncoder, WordPieces, load_teacher, pad_pieces

STAGES = ("attention", "embedding")
# Flags that steer a session, not the run: a resumed run takes these from the new command line, the rest
# (student, data, learning rates, seed) from the checkpoint, so a resume replays the same run.
SESSION_FLAGS = {"out", "resume", "device", "threads", "time_budget", "stage1_steps", "stage2_steps", "final_eval",
                 "checkpoint_every", "log_every", "eval_docs"}  # fmt: skip
WARMUP_STEPS = 20  # adapters start at zero and landmark modules at identity: a short ramp keeps step 1 sane


class PieceBank:
    """Training texts as word pieces; draws windows at random texts and offsets from a given generator."""

    def __init__(self, docs: Sequence[list[int]], min_pieces: int = 16) -> None:
        self.docs = [d for d in docs if len(d) >= min_pieces]  # a handful of pieces teaches no attention
        if not self.docs:
            raise ValueError("no training text has enough word pieces")
        self.lengths = np.array([len(d) for d in self.docs])

    def windows(self, rng: np.random.Generator, count: int, length: int) -> list[list[int]]:
        """`count` windows of length - 2 pieces (room for [CLS]/[SEP]) from texts at least that long, if any."""
        body = length - 2
        pool = np.flatnonzero(self.lengths >= body)
        pool = pool if len(pool) else np.arange(len(self.docs))  # nothing that long: whole texts, shorter
        out = []
        for i in rng.choice(pool, size=count):
            start = int(rng.integers(0, max(1, self.lengths[i] - body + 1)))
            out.append(self.docs[i][start : start + body])
        return out


def attention_loss(teacher: BertEncoder, student: BertEncoder, ids: Tensor, mask: Tensor) -> tuple[Tensor, list[float]]:
    """Mean over layers of ||student attn(x_t) - teacher attn(x_t)||^2 / ||teacher attn(x_t)||^2 on real pieces,
    x_t being the teacher's input to that layer. Relative, so the layers weigh alike whatever their scale."""
    with torch.no_grad():
        inputs, targets = teacher.attention_io(ids, mask)  # [B, N, D] each
    pad = mask == 0
    real = (~pad).unsqueeze(-1).to(targets[0].dtype)  # [B, N, 1]
    losses = []
    for layer, x, t in zip(student.layers, inputs, targets, strict=True):
        err = ((layer.attn(x, pad) - t) ** 2 * real).sum()
        losses.append(err / ((t**2) * real).sum().clamp_min(1e-12))
    return torch.stack(losses).mean(), [round(v.item(), 5) for v in losses]


def embedding_loss(teacher: BertEncoder, student: BertEncoder, tok: WordPieces, windows: list[list[int]]) -> Tensor:
    """1 - cosine between the student's embedding and the teacher's (whole, or in 512-piece chunks)."""
    device = next(student.parameters()).device
    target = teacher_reference(teacher, tok, windows, len(windows)).to(device)  # [B, D], unit length
    ids, mask = pad_pieces([tok.wrap(w) for w in windows], tok.pad_id)
    got = student.embed(ids.to(device), mask.to(device))  # [B, D], unit length
    return (1.0 - (got * target).sum(-1)).mean()


def _log(out: Path, record: dict[str, Any]) -> None:
    with open(out / "log.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def _save(out: Path, student: BertEncoder, opt: torch.optim.Optimizer | None, state: dict[str, Any]) -> None:
    """opt None at a stage boundary: the next stage starts a fresh optimizer, also after a resume."""
    save_student(out, student, student.student_cfg)
    gens = [layer.attn.mixer.generator.get_state() for layer in student.layers]
    tmp = out / "checkpoint.pt.tmp"
    torch.save({"state": state, "optimizer": None if opt is None else opt.state_dict(), "generators": gens}, tmp)
    tmp.replace(out / "checkpoint.pt")  # a crash mid-write never leaves a broken checkpoint


def _step_loss(ctx: dict[str, Any], stage: int, step: int) -> tuple[Tensor, dict[str, Any]]:
    """One batch's loss; the batch depends only on (seed, stage, step), so a resumed run draws the same ones."""
    args, bank, tok = ctx["args"], ctx["bank"], ctx["tok"]
    rng = np.random.default_rng([args.seed, stage, step])
    device = next(ctx["student"].parameters()).device
    if stage == 0:
        length = int(rng.choice(args.pieces))
        ids, mask = pad_pieces([tok.wrap(w) for w in bank.windows(rng, args.batch_size, length)], tok.pad_id)
        loss, per_layer = attention_loss(ctx["teacher"], ctx["student"], ids.to(device), mask.to(device))
        return loss, {"pieces": length, "per_layer": per_layer}
    long = args.max_pieces > ctx["teacher"].cfg.max_positions and rng.random() < args.long_fraction
    length = (
        int(rng.integers(ctx["teacher"].cfg.max_positions + 1, args.max_pieces + 1))
        if long
        else int(rng.choice(args.pieces))
    )
    count = max(1, args.batch_size * max(args.pieces) // length)  # about the same pieces per batch
    return embedding_loss(ctx["teacher"], ctx["student"], tok, bank.windows(rng, count, length)), {"pieces": length}


def _quick_eval(ctx: dict[str, Any]) -> dict[str, Any] | None:
    if not ctx["heldout"]:
        return None
    rows = fidelity_report(
        ctx["teacher"], ctx["student"], ctx["tok"], ctx["heldout"], (256, 512), ctx["args"].eval_docs
    )
    ctx["student"].train()
    return {n: r["mean_cosine"] for n, r in rows.items()}


def train_stage(ctx: dict[str, Any], stage: int, end_s: float, max_steps: int, opt_state: dict | None) -> None:
    """Run one stage until its share of the time budget (or max_steps) is spent, checkpointing as it goes."""
    args, student, state, out = ctx["args"], ctx["student"], ctx["state"], ctx["args"].out
    params = set_trainable(student, positions=stage == 1 and args.train_positions)
    lr = args.lr[stage]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    student.train()
    bar = tqdm(desc=f"stage {stage + 1} ({STAGES[stage]})", initial=state["step"], mininterval=20, file=sys.stderr)
    mark = time.perf_counter()
    while state["elapsed_s"] < end_s and not (max_steps and state["step"] >= max_steps):
        step = state["step"]
        loss, info = _step_loss(ctx, stage, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / WARMUP_STEPS)
        opt.step()
        state["step"] = step + 1
        now = time.perf_counter()
        state["elapsed_s"], mark = state["elapsed_s"] + now - mark, now
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}", min=f"{state['elapsed_s'] / 60:.1f}")
        if state["step"] % args.log_every == 0:
            _log(out, {"stage": STAGES[stage], "step": state["step"], "loss": round(loss.item(), 5), **info,
                       "elapsed_s": round(state["elapsed_s"], 1)})  # fmt: skip
        if state["step"] % args.checkpoint_every == 0:
            quick = _quick_eval(ctx)
            _save(out, student, opt, state)
            _log(out, {"event": "checkpoint", "stage": STAGES[stage], "step": state["step"], "fidelity": quick})
            now = time.perf_counter()
            state["elapsed_s"], mark = state["elapsed_s"] + now - mark, now
    bar.close()
    ctx["stage_steps"][STAGES[stage]] = state["step"]
    if stage + 1 < len(STAGES):
        state["stage"], state["step"] = stage + 1, 0
        _save(out, student, None, state)
    else:  # the last stage stays open: --resume with a larger budget (or step cap) trains on where it stopped
        _save(out, student, opt, state)
    _log(out, {"event": "stage done", "stage": STAGES[stage], "elapsed_s": round(state["elapsed_s"], 1)})


def initial_student(source: Path, teacher: BertEncoder) -> BertEncoder:
    """--init: train on from a transfer run folder, or from a model directory `classifier` built (its folded
    encoder unfolded into teacher + adapters); the student config is the source's, not the command line's."""
    if (source / "config.json").is_file():
        student, cfg, residual = student_from_model(source, teacher)
        if residual > 0.05:  # the fold is rank <= lora_rank by construction: more means a foreign model
            raise ValueError(f"{source}: its adapted weights are not teacher + rank-{cfg.lora_rank} ({residual:.3f})")
        return student
    return load_student(source, teacher)


def _setup(args: argparse.Namespace) -> tuple[dict[str, Any], dict | None]:
    """Teacher, student (fresh or resumed), texts and run state; returns the context and a saved optimizer."""
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the teacher's targets stay fp32-accurate enough
    torch.manual_seed(args.seed)
    teacher, tok = load_teacher(args.teacher_dir, device=device)
    state, opt_state = {"stage": 0, "step": 0, "elapsed_s": 0.0, "args": _args_dict(args)}, None
    if args.resume:
        # on the CPU: the noise generators' states must stay there; the optimizer moves its own state to its params
        ckpt = torch.load(args.out / "checkpoint.pt", map_location="cpu", weights_only=False)
        state = ckpt["state"]
        opt_state = ckpt["optimizer"] if state["step"] else None  # step 0 of a stage: nothing to carry over
        student = load_student(args.out, teacher)
        for layer, g in zip(student.layers, ckpt["generators"], strict=True):
            layer.attn.mixer.generator.set_state(g)
    elif args.init:
        student = initial_student(args.init, teacher)
    else:
        student = student_from_teacher(teacher, student_config_from(args))
    texts = (
        read_text_dir(args.texts) if args.texts else [t for ts in training_texts(not args.no_spam).values() for t in ts]
    )
    bank = PieceBank([tok.pieces(t) for t in texts])
    try:
        heldout = heldout_pieces(tok) if args.eval_docs else []
    except Exception as e:  # progress evaluations are optional: a missing corpus must not stop training
        warnings.warn(f"no progress evaluation: {e}", stacklevel=2)
        heldout = []
    ctx = {"args": args, "teacher": teacher, "student": student, "tok": tok, "bank": bank, "state": state}
    return ctx | {"heldout": heldout, "stage_steps": {}}, opt_state


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both stages within the time budget; writes the run folder and returns summary.json's content."""
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    ctx, opt_state = _setup(args)
    state, budget = ctx["state"], args.time_budget * 60.0
    _log(
        args.out, {"event": "resume" if args.resume else "start", "state": dict(state), "texts": len(ctx["bank"].docs)}
    )
    ends, caps = (args.stage1_fraction * budget, budget), (args.stage1_steps, args.stage2_steps)
    for stage in range(state["stage"], len(STAGES)):
        train_stage(ctx, stage, ends[stage], caps[stage], opt_state)
        opt_state = None  # a new stage starts a new optimizer
    summary: dict[str, Any] = {"args": _args_dict(args), "student_config": ctx["student"].student_cfg.to_dict()}
    summary |= {"elapsed_s": round(state["elapsed_s"], 1), "steps": ctx["stage_steps"]}
    if args.final_eval and ctx["heldout"]:
        rows = fidelity_report(ctx["teacher"], ctx["student"], ctx["tok"], ctx["heldout"], args.final_eval)
        summary["fidelity"] = rows
        (args.out / "fidelity.json").write_text(json.dumps({"student": str(args.out), "fidelity": rows}, indent=2))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _log(args.out, {"event": "done", "elapsed_s": summary["elapsed_s"], "fidelity": summary.get("fidelity")})
    return summary


def _args_dict(args: argparse.Namespace) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="run folder (runs/DIR)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--time-budget", type=float, default=60.0, help="minutes for both stages, all sessions together")
    p.add_argument("--stage1-fraction", type=float, default=0.6, help="share of the budget for attention transfer")
    p.add_argument("--stage1-steps", type=int, default=0, help="cap on stage 1 steps (0: the budget decides)")
    p.add_argument("--stage2-steps", type=int, default=0, help="cap on stage 2 steps (0: the budget decides)")
    p.add_argument("--pieces", type=int, nargs="+", default=[256, 512], help="window lengths (<= 512) to draw from")
    p.add_argument("--max-pieces", type=int, default=512, help="longest stage-2 window (> 512: chunked teacher)")
    p.add_argument("--long-fraction", type=float, default=0.25, help="share of stage-2 steps past 512 pieces")
    p.add_argument("--batch-size", type=int, default=8, help="windows per step at the longest of --pieces")
    p.add_argument("--lr", type=float, nargs=2, default=[1e-3, 2e-4], metavar=("STAGE1", "STAGE2"))
    p.add_argument("--train-positions", action="store_true", help="stage 2 also trains the (copied) positions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--eval-docs", type=int, default=16, help="held-out texts in checkpoint evaluations (0: none)")
    p.add_argument("--final-eval", type=int, nargs="*", default=[256, 512], help="lengths of the closing fidelity")
    p.add_argument("--texts", type=Path, help="train on the *.txt under this folder instead of the installed corpora")
    p.add_argument("--no-spam", action="store_true", help="leave SpamAssassin bodies out of the training text")
    p.add_argument("--teacher-dir", type=Path, help="a BERT folder other than the installed teacher (tests)")
    p.add_argument("--init", type=Path, help="start from this transfer run or built model (its student config)")
    add_student_args(p)
    args = p.parse_args(argv)
    if max(args.pieces) > 512 or min(args.pieces) < 8:
        p.error("--pieces must lie in [8, 512]: the teacher reads at most 512 at once")
    if args.resume:
        saved = torch.load(args.out / "checkpoint.pt", weights_only=False)["state"].get("args", {})
        for k, v in saved.items():
            if k not in SESSION_FLAGS and hasattr(args, k):
                setattr(args, k, Path(v) if k in ("texts", "teacher_dir", "init") and v not in (None, "None") else v)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run(args)


if __name__ == "__main__":
    main()
