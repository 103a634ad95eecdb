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

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from lara_serve.model_export.models.bert import BertEncoder, LearnedPositions
from lara_serve.model_export.models.bert_lara import (  # noqa: F401  (re-exported: the student's API)
    LANDMARK_MODULES,
    POSITION_SCHEMES,
    ExtendedPositions,
    LaraMixer,
    LoraLinear,
    ResidualLandmarks,
    StudentConfig,
    build_student,
)


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


# A folded, float16-rounded weight differs from teacher + adapter by the rounding alone: half a float16 step,
# 2^-11 of the value, plus a little for the float32 sums of the fold.
FOLD_TOLERANCE = 2.0**-10


@torch.no_grad()
def unmerge_adapters(teacher: BertEncoder, cfg: StudentConfig, folded: dict[str, Tensor]) -> tuple[BertEncoder, float]:
    """A trainable student (teacher + adapters) from a folded encoder's state (what a built model ships).

    Each adapted weight's change from the teacher is rank <= cfg.lora_rank by construction, so its truncated SVD
    gives the adapter back (up to the float16 rounding of the shipped weights, which it mostly filters out).
    Every other teacher weight must come back unchanged (within FOLD_TOLERANCE): a model folded from another
    teacher is refused. Returns the student and the largest relative residual ||D - scale B A|| / ||D||."""
    student = student_from_teacher(teacher, cfg)
    own = student.state_dict()
    worst = 0.0
    for i, layer in enumerate(student.layers):
        for name in cfg.lora_targets if cfg.lora_rank else ():
            lin = getattr(layer.attn, name)
            key = f"layers.{i}.attn.{name}"
            change = folded[f"{key}.weight"].to(lin.base.weight) - lin.base.weight
            u, s, vh = torch.linalg.svd(change.double(), full_matrices=False)
            root = (s[: cfg.lora_rank] / lin.scale).sqrt()
            lin.lora_b.copy_(u[:, : cfg.lora_rank] * root)
            lin.lora_a.copy_(root[:, None] * vh[: cfg.lora_rank])
            rest = change - lin.scale * lin.lora_b @ lin.lora_a
            worst = max(worst, (rest.norm() / change.norm().clamp_min(1e-30)).item())
            own.pop(f"{key}.base.weight"), own.pop(f"{key}.lora_a"), own.pop(f"{key}.lora_b")
            own[f"{key}.bias"] = own.pop(f"{key}.base.bias")
    for k, mine in own.items():
        if k not in folded:
            raise ValueError(f"the folded encoder lacks {k}: not built from this student config")
        theirs = folded[k].to(mine)
        if is_converted(k):
            mine.copy_(theirs)
        elif not torch.allclose(theirs, mine, rtol=FOLD_TOLERANCE, atol=1e-6):
            raise ValueError(f"{k} differs from the teacher's: the model was not folded from this teacher")
    return student, worst


def model_student_config(model_dir: Path) -> tuple[StudentConfig, dict]:
    """The StudentConfig a model directory built by `classifier` records (config.json training.student), and
    that training section."""
    from lara_serve.model_export.models.hub import load_config

    training = load_config(model_dir).get("training", {})
    if "student" not in training:
        raise ValueError(f"{model_dir}: config.json records no converted student (training.student)")
    return StudentConfig.from_dict(training["student"]), training


def student_from_model(model_dir: Path, teacher: BertEncoder) -> tuple[BertEncoder, StudentConfig, float]:
    """The trainable student inside a model directory built by `classifier`, so training can go on from what
    is shipped when the transfer run is gone; see unmerge_adapters."""
    from lara_serve.model_export.models.hub import load_pretrained

    cfg, _ = model_student_config(model_dir)
    folded = load_pretrained(model_dir).encoder.state_dict()
    student, residual = unmerge_adapters(teacher, cfg, folded)
    return student, cfg, residual


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
