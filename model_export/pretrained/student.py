"""The student: the teacher's BERT with every softmax attention replaced by LARA (spec 5), read in one linear pass.

What changes against the teacher, and only that:
* the token mixer of each layer is `LaraMixer`: chunk-mean landmarks over the valid pieces (spec 5.2, 1-D),
  an optional landmark module, LARA through `lara_serve.kernels.lara_attention`; eval is deterministic and
  batch-independent (w = mu, or a fixed seeded noise buffer broadcast over the batch, spec 7);
* optional low-rank adapters (LoRA, Hu et al. 2021) on the q/k/v projections, zero at the start;
* positions past the teacher's 512: the learned rows copied end to end (Longformer, Beltagy et al. 2020), as
  a trainable table ("copy") or indexed modulo 512 ("periodic", no length limit). A relative or convolutional
  scheme slots in as another `embeddings.positions` module (`teacher.LearnedPositions`' interface).
At construction the student equals the zero-shot swap: landmark modules and adapters start as identities.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lara_serve import kernels
from lara_serve.model_export.models.layers import LandmarkModule, layer_seed
from lara_serve.model_export.pretrained.teacher import BertConfig, BertEncoder, LearnedPositions

LANDMARK_MODULES = ("none", "residual", "light")
POSITION_SCHEMES = ("copy", "periodic")


@dataclass(frozen=True)
class StudentConfig:
    """How the teacher is converted; saved with every checkpoint so a student rebuilds from the teacher."""

    num_landmarks: int = 64  # LARA proposals C per head; cost O(C N d), more follows sharper attention
    # "none": plain chunk means (spec `no-param-pool`); "residual": chunk mean + a per-head Linear started at
    # zero, so training starts from the zero-shot swap; "light": the project's Linear+LayerNorm (spec 5.2),
    # its Linear started at identity (the LayerNorm still rescales: zero-shot is not the plain swap).
    landmark_module: Literal["none", "residual", "light"] = "residual"
    alpha_coeff: float = 1.0  # lambda of the mis-opt weighting (spec 5.3)
    eval_noise: Literal["mean", "fixed"] = "mean"  # spec 7: w = mu, or a fixed seeded buffer
    # "eval": training runs the estimator that is served (the transfer fits that function, not a noisy one);
    # "fresh": new noise every step from a per-layer generator, as LARA trains from scratch (spec 5.3).
    train_noise: Literal["eval", "fresh"] = "eval"
    # "periodic" reads any length at no cost and equals "copy" until positions are trained; "copy" gives each
    # position its own trainable row (Longformer) up to max_positions.
    positions: Literal["copy", "periodic"] = "periodic"
    max_positions: int = 4096  # "copy" only: rows of the copied table (1.5 M values at 4096)
    lora_rank: int = 8  # 0: no adapters
    lora_alpha: float = 16.0  # adapter scale alpha / rank, as in the LoRA paper
    lora_targets: tuple[str, ...] = ("query", "key", "value")
    seed: int = 0  # eval noise buffers and training noise streams (layer_seed(seed, layer, tag))

    def __post_init__(self) -> None:
        if self.landmark_module not in LANDMARK_MODULES:
            raise ValueError(f"landmark_module must be one of {LANDMARK_MODULES}, got {self.landmark_module!r}")
        if self.positions not in POSITION_SCHEMES:
            raise ValueError(f"positions must be one of {POSITION_SCHEMES}, got {self.positions!r}")
        if self.eval_noise not in ("mean", "fixed") or self.train_noise not in ("eval", "fresh"):
            raise ValueError(f"eval_noise in (mean, fixed), train_noise in (eval, fresh); got {self}")
        if self.num_landmarks < 1 or self.lora_rank < 0:
            raise ValueError("num_landmarks must be >= 1 and lora_rank >= 0")
        if not set(self.lora_targets) <= {"query", "key", "value", "out"}:
            raise ValueError(f"lora_targets must name query/key/value/out, got {self.lora_targets}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StudentConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown student config keys {sorted(unknown)}")
        d = dict(d)
        if "lora_targets" in d:
            d["lora_targets"] = tuple(d["lora_targets"])
        return cls(**d)


# ----------------------------------------------------------------------------- LARA token mixer
class ResidualLandmarks(nn.Module):
    """x + x W_h + b_h per head, W and b zero at the start: the identity until transfer moves it."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(heads, head_dim, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, 1, head_dim))

    def forward(self, x: Tensor) -> Tensor:
        return x + x @ self.weight + self.bias  # [B, H, C, d]


def _landmark_module(kind: str, heads: int, head_dim: int) -> nn.Module:
    if kind == "none":
        return nn.Identity()
    if kind == "residual":
        return ResidualLandmarks(heads, head_dim)
    light = LandmarkModule(head_dim)
    with torch.no_grad():  # identity Linear: only the LayerNorm's standardisation is new
        light.proj.weight.copy_(torch.eye(head_dim))
        light.proj.bias.zero_()
    return light


class LaraMixer(nn.Module):
    """LARA over q, k, v [B, H, N, d] with 1-D chunk-mean landmarks of the valid pieces; -> [B, H, N, d]."""

    def __init__(self, heads: int, head_dim: int, cfg: StudentConfig, layer_index: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.q_landmarks = _landmark_module(cfg.landmark_module, heads, head_dim)
        self.k_landmarks = _landmark_module(cfg.landmark_module, heads, head_dim)
        self.generator = torch.Generator().manual_seed(layer_seed(cfg.seed, layer_index, "train"))
        if cfg.eval_noise == "fixed":
            # spec 7: a persistent buffer (it travels with checkpoints), broadcast over the batch, never
            # indexed by batch position, so a document's output does not depend on its neighbours.
            g = torch.Generator().manual_seed(layer_seed(cfg.seed, layer_index, "eval"))
            self.register_buffer("eval_noise", torch.randn(1, heads, cfg.num_landmarks, head_dim, generator=g))

    def _noise(self, q: Tensor) -> Tensor | None:
        if self.training and self.cfg.train_noise == "fresh":
            b, h, _, d = q.shape
            return torch.randn(b, h, self.cfg.num_landmarks, d, generator=self.generator).to(q)
        noise = getattr(self, "eval_noise", None)
        return None if noise is None else noise.to(q)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Tensor) -> Tensor:
        c = self.cfg.num_landmarks
        # chunk means over valid pieces only: padding never enters a landmark nor moves a chunk boundary
        ql = self.q_landmarks(kernels.chunk_means_1d(q, c, pad))  # [B, H, C, d]
        kl = self.k_landmarks(kernels.chunk_means_1d(k, c, pad))  # [B, H, C, d]
        return kernels.lara_attention(
            q, k, v, ql, kl, key_padding_mask=pad, alpha_coeff=self.cfg.alpha_coeff, noise=self._noise(q)
        )  # [B, H, N, d]


# ----------------------------------------------------------------------------- adapters and positions
class LoraLinear(nn.Module):
    """base(x) + (alpha / r) x A^T B^T with the base frozen; B starts at zero so the layer starts as base."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=5**0.5)  # as nn.Linear's init (and the LoRA reference code)

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale  # [B, N, out]

    def merged(self) -> nn.Linear:
        """One plain Linear with the adapter folded in (for export: no extra op at inference)."""
        out = nn.Linear(self.base.in_features, self.base.out_features, device=self.lora_a.device)
        with torch.no_grad():
            out.weight.copy_(self.base.weight + self.scale * self.lora_b @ self.lora_a)
            out.bias.copy_(self.base.bias)
        return out


class ExtendedPositions(nn.Module):
    """The teacher's learned positions past their length: rows copied end to end (Longformer's start).

    "copy": a trainable [max_positions, D] table, row n = teacher row n mod 512, free to drift in training.
    "periodic": the teacher's 512 rows indexed by n mod 512: no length limit, no extra values.
    """

    def __init__(self, teacher_table: Tensor, scheme: str, max_positions: int) -> None:
        super().__init__()
        self.period = teacher_table.shape[0]
        rows = max(max_positions, self.period) if scheme == "copy" else self.period
        idx = torch.arange(rows) % self.period
        self.table = nn.Parameter(teacher_table.detach()[idx].clone())
        self.periodic = scheme == "periodic"

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        n = x.shape[1]
        if self.periodic:
            return x + self.table[torch.arange(n, device=x.device) % self.period]  # [B, N, D]
        if n > self.table.shape[0]:
            raise ValueError(f"{n} pieces but the copied table has {self.table.shape[0]} rows (raise max_positions)")
        return x + self.table[:n]  # [B, N, D]


# ----------------------------------------------------------------------------- building the student
def build_student(bert: BertConfig, cfg: StudentConfig) -> BertEncoder:
    """The student's skeleton (random teacher weights); `student_from_teacher` fills them."""
    model = BertEncoder(bert, mixer=lambda i: LaraMixer(bert.heads, bert.head_dim, cfg, i))
    model.student_cfg = cfg
    return model


def student_from_teacher(teacher: BertEncoder, cfg: StudentConfig) -> BertEncoder:
    """Copy every teacher weight into a LARA student, extend its positions, add (zero) adapters."""
    student = build_student(teacher.cfg, cfg)
    missing, unexpected = student.load_state_dict(teacher.state_dict(), strict=False)
    strays = [k for k in missing if ".mixer." not in k]
    if strays or unexpected:
        raise RuntimeError(f"teacher/student mismatch: missing {strays}, unexpected {unexpected}")
    table = teacher.embeddings.positions.table
    if not isinstance(teacher.embeddings.positions, LearnedPositions):
        raise TypeError("the teacher must have learned absolute positions")
    student.embeddings.positions = ExtendedPositions(table, cfg.positions, cfg.max_positions)
    if cfg.lora_rank:
        for layer in student.layers:
            for name in cfg.lora_targets:
                setattr(layer.attn, name, LoraLinear(getattr(layer.attn, name), cfg.lora_rank, cfg.lora_alpha))
    return student.to(table.device)


def is_converted(name: str) -> bool:
    """A parameter or buffer that the teacher does not have (what transfer trains and checkpoints save)."""
    return ".mixer." in name or ".lora_" in name or name.startswith("embeddings.positions.")


def converted_state(student: BertEncoder) -> dict[str, Tensor]:
    """The student minus the teacher: landmark modules, noise buffers, adapters, positions."""
    return {k: v.detach().cpu() for k, v in student.state_dict().items() if is_converted(k)}


def load_converted(teacher: BertEncoder, cfg: StudentConfig, state: dict[str, Tensor]) -> BertEncoder:
    """Rebuild a saved student: the teacher's weights plus its converted state."""
    student = student_from_teacher(teacher, cfg)
    missing, unexpected = student.load_state_dict(state, strict=False)
    lost = [k for k in missing if is_converted(k)]
    if lost or unexpected:
        raise RuntimeError(f"converted state does not fit: missing {lost}, unexpected {unexpected}")
    return student


def set_trainable(student: BertEncoder, positions: bool = False) -> list[nn.Parameter]:
    """Freeze the teacher's weights; train landmark modules and adapters (and the copied positions if asked)."""
    params = []
    for name, p in student.named_parameters():
        train = ".mixer." in name or ".lora_" in name or (positions and name.startswith("embeddings.positions."))
        p.requires_grad_(train)
        if train:
            params.append(p)
    return params


def merge_adapters(student: BertEncoder) -> BertEncoder:
    """Fold every LoRA adapter into its Linear, in place (same outputs up to float rounding)."""
    for layer in student.layers:
        for name in ("query", "key", "value", "out"):
            mod = getattr(layer.attn, name)
            if isinstance(mod, LoraLinear):
                setattr(layer.attn, name, mod.merged())
    return student


# ----------------------------------------------------------------------------- files
STUDENT_CONFIG = "student.json"
STUDENT_WEIGHTS = "converted.safetensors"


def save_student(folder: Path, student: BertEncoder, cfg: StudentConfig) -> None:
    """student.json (the conversion's config) + converted.safetensors (what the teacher lacks), atomically."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STUDENT_WEIGHTS + ".tmp")
    save_file({k: v.contiguous() for k, v in converted_state(student).items()}, str(tmp))
    tmp.replace(folder / STUDENT_WEIGHTS)
    (folder / STUDENT_CONFIG).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")


def load_student(folder: Path, teacher: BertEncoder) -> BertEncoder:
    """A saved student in eval mode: the teacher's weights plus the folder's converted state."""
    from safetensors.torch import load_file

    if not (folder / STUDENT_WEIGHTS).is_file():
        raise FileNotFoundError(f"no {STUDENT_WEIGHTS} in {folder}: not a transfer run folder (or no checkpoint yet)")
    cfg = StudentConfig.from_dict(json.loads((folder / STUDENT_CONFIG).read_text()))
    state = load_file(str(folder / STUDENT_WEIGHTS))
    device = next(teacher.parameters()).device
    return load_converted(teacher, cfg, {k: v.to(device) for k, v in state.items()}).eval()
