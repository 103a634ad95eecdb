"""LARA inside a pretrained BERT (spec 5): the token mixer, adapters, extended positions, and the served classifier.

What changes against the teacher's exact encoder (`bert.py`), and only that:
* the token mixer of each layer is `LaraMixer`: chunk-mean landmarks over the valid pieces (spec 5.2, 1-D),
  an optional landmark module, LARA through `lara_serve.kernels.lara_attention`; eval is deterministic and
  batch-independent (w = mu, or a fixed seeded noise buffer broadcast over the batch, spec 7);
* optional low-rank adapters (LoRA, Hu et al. 2021) on the q/k/v projections, zero at the start;
* positions past the teacher's 512: the learned rows copied end to end (Longformer, Beltagy et al. 2020), as
  a trainable table ("copy") or indexed modulo 512 ("periodic", no length limit).
The conversion itself (copying a teacher's weights in, attention transfer) lives in
`lara_serve.model_export.pretrained`; this module is what the served graph needs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lara_serve import kernels
from lara_serve.model_export.models.bert import BertConfig, BertEncoder, mean_pool
from lara_serve.model_export.models.config import BertTextConfig
from lara_serve.model_export.models.layers import LandmarkModule, layer_seed
from lara_serve.model_export.models.text import _BIGRAM_MUL, _BIGRAM_SALT, TfidfHead, wide_logits
from lara_serve.model_export.models.text_embeddings import _WORD_MOD

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
    min_chunk: int = 1  # tokens per landmark at least (kernels.chunk_assignment; AttentionConfig.min_chunk)
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
        if self.num_landmarks < 1 or self.lora_rank < 0 or self.min_chunk < 1:
            raise ValueError("num_landmarks and min_chunk must be >= 1 and lora_rank >= 0")
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
        m = self.cfg.min_chunk
        ql = self.q_landmarks(kernels.chunk_means_1d(q, c, pad, m))  # [B, H, C, d]
        kl = self.k_landmarks(kernels.chunk_means_1d(k, c, pad, m))  # [B, H, C, d]
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


# ----------------------------------------------------------------------------- the served classifier
def bert_shape(cfg: BertTextConfig) -> BertConfig:
    """The encoder's shape from a served config (the fields the two share; pad_id is the tokenizer's)."""
    shared = {f.name for f in dataclasses.fields(BertConfig)} - {"pad_id"}
    return BertConfig(**{name: getattr(cfg, name) for name in shared})


def student_config(cfg: BertTextConfig, seed: int = 0) -> StudentConfig:
    """The conversion a served config describes: adapters already folded in, periodic positions."""
    att = cfg.attention
    lara = {"num_landmarks": att.num_landmarks, "alpha_coeff": att.alpha_coeff, "eval_noise": att.eval_noise,
            "min_chunk": att.min_chunk}  # fmt: skip
    return StudentConfig(**lara, landmark_module=cfg.landmark_module, positions="periodic", lora_rank=0, seed=seed)


class AttentionPool(nn.Module):
    """Token weights softmax over real tokens of a learned score (one Linear D -> 1), the weighted mean of the
    token vectors at unit length: the document vector a filler-robust head reads.

    Why: the teacher's masked mean gives every piece one vote, so 10 KB of unrelated text around a 2 KB
    article leaves the article a fifth of the embedding, and a head on it follows the filler (26% correct at
    10 KB). A score trained on articles with filler around them (pretrained.robust_head) weighs the pieces
    that carry the topic; with the score at zero this is the mean pool exactly. Order-free, as the mean is."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.score = nn.Linear(dim, 1)
        nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)

    def forward(self, x: Tensor, attention_mask: Tensor, bias: Tensor | None = None) -> Tensor:
        s = self.score(x).squeeze(-1)  # [B, N]
        if bias is not None:  # [B, N], e.g. WindowGate's
            s = s + bias
        s = s.masked_fill(attention_mask == 0, torch.finfo(s.dtype).min)
        w = torch.softmax(s, -1)  # [B, N]; padding gets exactly 0
        return nn.functional.normalize((w.unsqueeze(1) @ x).squeeze(1), p=2, dim=-1)  # [B, D]


class WindowGate(nn.Module):
    """Each window's say in the attention pool, from a linear probe on its mean vector: bias [B, J*(W+2)] =
    strength x log sigmoid(-g_j) on every slot of window j, g_j = weight . unit_mean(window j) + bias (a window
    probe, pretrained.window_gate: high for a window that carries no article). An article's window (g << 0)
    keeps its weight, a window of documentation prose (g >> 0) loses about strength x g of log-weight.

    Why: the pool scores each piece alone, so 20 KB of English prose around an article still outvotes it
    (robustness suite: 70-75% right); the probe tells such prose from an article on a whole window. Softmax
    ignores a constant, so a text of one window reads exactly as without the gate (research/minilm_window_probe.py)."""

    def __init__(self, dim: int, strength: float) -> None:
        super().__init__()
        self.strength = strength
        self.register_buffer("weight", torch.zeros(dim))  # [D], the probe's (filled by load_state_dict)
        self.register_buffer("bias", torch.zeros(1))  # [1]

    def forward(self, x: Tensor, rows: Tensor, per: int) -> Tensor:
        """x [B, J*per, D] every window's vectors, rows [B, J*per] the read mask -> bias [B, J*per]."""
        b, n, d = x.shape
        mean = unit_mean(x.reshape(b, -1, per, d), rows.reshape(b, -1, per, 1), 2)  # [B, J, D], each window's
        g = mean @ self.weight + self.bias  # [B, J]
        gate = self.strength * nn.functional.logsigmoid(-g)  # [B, J], <= 0
        return gate.unsqueeze(-1).expand(-1, -1, per).reshape(b, n)


def unit_mean(x: Tensor, mask: Tensor, dim: int) -> Tensor:
    """The masked mean of x over `dim` at unit length (mean_pool's arithmetic; mask broadcastable to x, 1 = real):
    per window (WindowGate) or per hidden state (layer_means)."""
    m = mask.to(x.dtype)
    return nn.functional.normalize((x * m).sum(dim) / m.sum(dim).clamp_min(1e-9), p=2, dim=-1)


def layer_means(x: Tensor, attention_mask: Tensor, blocks: int) -> Tensor:
    """x [B, N, blocks * D] (BertEncoder's all_layers) -> [B, blocks * D]: each block's unit-length masked mean
    (mean_pool), concatenated and scaled by 1/sqrt(blocks) to unit length.

    Why: a head on the last layer's mean alone reads context, not words; frozen, it trailed a tf-idf model by 11
    points on messages in ~100 languages, where the label is in the words. The embeddings' output (a bag of
    word pieces) and the middle layers give the head those words back: on `lara train`'s holdouts, subject lines
    83.8 -> 88.1%, messages 79.4 -> 87.5%, e-mails 91 -> 91%, speeches 14 of 14 both
    (research/frozen_layer_means.py)."""
    b, n, width = x.shape
    means = unit_mean(x.reshape(b, n, blocks, width // blocks), attention_mask.reshape(b, n, 1, 1), 1)  # [B, k, D]
    return (means / blocks**0.5).reshape(b, width)  # [B, blocks * D]


def window_layout(
    input_ids: Tensor, attention_mask: Tensor, window: int, cls_id: int, sep_id: int, pad_id: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """[CLS] + pieces + [SEP] rows ([B, N], right-padded, as the server sends them) -> the same pieces in
    windows of W = min(window, N), each its own [CLS] + pieces + [SEP]: (ids [B*J, W+2], attention mask
    [B*J, W+2], read mask [B, J*(W+2)]), J = ceil(N / W). The read mask is what a readout pools: every real window's
    slots, and the first window's always (an empty document reads [CLS] [SEP], as whole).

    A window past a shorter row's end (batch padding) is read as [CLS] [SEP] (an all-masked row has no
    softmax) and left out of the read mask, so a document's answer does not depend on its neighbours."""
    b, n = input_ids.shape
    valid = attention_mask > 0
    count = valid.sum(1, keepdim=True)  # [B, 1]: [CLS] + pieces + [SEP]
    # the pieces alone, shifted left by one ([CLS] off, one pad slot at the end), [SEP] masked out
    stream = torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], pad_id)], 1)  # [B, N]
    pos = torch.arange(n, device=input_ids.device)[None]
    real = torch.cat([valid[:, 1:], torch.zeros_like(valid[:, :1])], 1) & (pos < count - 2)  # [B, N]
    # a batch no longer than one window is that window: padding a headline to 510 pieces would cost what 510
    # pieces cost (sym_min keeps the export's sequence axis symbolic)
    window = torch.sym_min(window, n)
    pad = (window - n % window) % window
    stream = nn.functional.pad(torch.where(real, stream, pad_id), (0, pad), value=pad_id).reshape(-1, window)
    real = nn.functional.pad(real, (0, pad), value=False).reshape(-1, window)  # [B*J, W]
    pieces = real.sum(1, keepdim=True)  # [B*J, 1]
    ends = torch.full_like(stream[:, :1], pad_id)
    ids = torch.cat([torch.full_like(ends, cls_id), stream, ends], 1)  # [B*J, W+2]
    slot = torch.arange(window + 2, device=input_ids.device)[None]
    ids = torch.where(slot == pieces + 1, torch.full_like(ids, sep_id), ids)
    mask = slot <= pieces + 1  # [B*J, W+2]
    per_row = pieces.reshape(b, -1)  # [B, J]
    first = (torch.ones_like(per_row).cumsum(1) == 1).reshape(-1, 1)  # [B*J, 1]: each row's first window
    read = (mask & ((pieces > 0) | first)).reshape(b, -1)  # [B, J*(W+2)]
    return ids, mask.long(), read.long()


class PieceTfidfHead(TfidfHead):
    """The wide path of a word-piece model: TfidfHead's tf-idf linear head with word pieces for words. A gram
    is one piece or two pieces in a row ([CLS], [SEP] and padding are none), so the graph needs no bytes.

    Why: the byte model's wide path hashes words of the bytes, which a word-piece graph never sees; pieces are
    words or their stems and endings (all-MiniLM's uncased vocabulary of 30,522), so their 1-2-grams carry what
    a bag of words carries, and a frozen pretrained encoder can be blended with it in one exported graph."""

    def __init__(self, buckets: int, num_classes: int, special: tuple[int, ...]) -> None:
        super().__init__(buckets, num_classes)
        self.special = tuple(int(s) for s in special)

    @classmethod
    def for_config(cls, cfg: BertTextConfig, buckets: int) -> PieceTfidfHead:
        """The head of a model of `cfg`: padding (forward_wide zeroes it), [CLS] and [SEP] are no pieces."""
        return cls(buckets, cfg.num_classes, (0, cfg.cls_id, cfg.sep_id))

    def grams(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """ids [B, N] ([CLS] + pieces + [SEP], zero-padded) -> (bucket [B, 2N] int64, real [B, 2N] bool):
        each slot's piece, then the bigram ending at it."""
        real = torch.ones_like(ids, dtype=torch.bool)
        for s in self.special:
            real = real & (ids != s)
        prev = nn.functional.pad(ids[:, :-1], (1, 0))
        prev_real = nn.functional.pad(real[:, :-1], (1, 0))  # the first slot has no piece before it
        code = (prev * _BIGRAM_MUL + ids + _BIGRAM_SALT) % _WORD_MOD  # ids < 2**15: no int64 overflow
        return torch.cat([ids % self.buckets, code % self.buckets], 1), torch.cat([real, real & prev_real], 1)


# Windows read by one encoder call in eager torch: a 1 MiB document is ~430 windows, whose activations at once
# would be several GB; 16 at a time keep them near 200 MB (the exported graph reads all windows in one call: the
# server runs documents past its max_length on the sliced program instead, export.sliced_windows).
WINDOW_GROUP = 16


class LaraBertClassifier(nn.Module):
    """forward(input_ids [B, N], attention_mask [B, N]) -> logits [B, C]: the LARA student reading the whole
    document in one pass, its unit-length masked-mean embedding (the teacher's sentence embedding) or, with
    readout "attention", its AttentionPool, then a Linear.

    It has the byte encoder's readout interface (forward_features, forward_pooled, forward_readout), so the
    serving head (calibration temperature, ood_score) and the ONNX export wrap it unchanged."""

    def __init__(self, cfg: BertTextConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = build_student(bert_shape(cfg), student_config(cfg, seed))
        table = torch.zeros(cfg.max_positions, cfg.dim)  # filled by load_state_dict
        self.encoder.embeddings.positions = ExtendedPositions(table, "periodic", cfg.max_positions)
        self.head = nn.Linear(cfg.dim * self.blocks, cfg.num_classes)
        self.pool = AttentionPool(cfg.dim) if cfg.readout == "attention" else None
        self.gate = WindowGate(cfg.dim, cfg.window_gate) if cfg.window_gate > 0 else None
        self.tfidf = PieceTfidfHead.for_config(cfg, cfg.tfidf_buckets) if cfg.tfidf_buckets else None

    @property
    def blocks(self) -> int:
        """How many hidden states forward_features concatenates: every one (embeddings + each layer) for readout
        "layers", else the last."""
        return self.cfg.depth + 1 if self.cfg.readout == "layers" else 1

    def forward_features(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """[B, N, D], or with a window [B, J*(W+2), D]: every window's vectors, the rows `read_mask` names.
        Readout "layers": blocks * D columns, the last D the last hidden state."""
        layers = self.blocks > 1
        if not self.cfg.window:
            return self.encoder(input_ids, attention_mask, all_layers=layers)  # [B, N, blocks * D]
        ids, mask, _ = self.layout(input_ids, attention_mask)
        if torch.compiler.is_exporting() or ids.shape[0] <= WINDOW_GROUP:
            x = self.encoder(ids, mask, all_layers=layers)
        else:  # windows are independent: a long document's activations are one group's at a time (torch backend)
            x = torch.cat([self.encoder(ids[i : i + WINDOW_GROUP], mask[i : i + WINDOW_GROUP], all_layers=layers)
                           for i in range(0, ids.shape[0], WINDOW_GROUP)])  # fmt: skip
        return x.reshape(input_ids.shape[0], -1, self.cfg.dim * self.blocks)

    def layout(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = self.cfg
        return window_layout(input_ids, attention_mask, c.window, c.cls_id, c.sep_id, self.encoder.cfg.pad_id)

    def read_mask(self, attention_mask: Tensor) -> Tensor:
        """Which rows of forward_features the readouts pool: the mask itself, or the windows' read mask."""
        if not self.cfg.window:
            return attention_mask
        return self.layout(torch.zeros_like(attention_mask), attention_mask)[2]  # depends on the mask only

    def last_state(self, x: Tensor) -> Tensor:
        """forward_features' x -> the last hidden state [B, N, D] (x itself unless readout "layers": no Slice
        in the other graphs, which stay as they were exported)."""
        return x if self.blocks == 1 else x[..., -self.cfg.dim :]

    def forward_pooled(self, x: Tensor, attention_mask: Tensor) -> Tensor:
        return mean_pool(self.last_state(x), self.read_mask(attention_mask))  # [B, D], unit length

    def head_features(self, x: Tensor, rows: Tensor, bias: Tensor | None = None) -> Tensor:
        """What the head reads, from forward_features' x and the rows it pools: the last hidden state's mean, its
        attention pool (plus window_bias's bias), or every block's mean (layer_means)."""
        if self.blocks > 1:
            return layer_means(x, rows, self.blocks)  # [B, blocks * D]
        return mean_pool(x, rows) if self.pool is None else self.pool(x, rows, bias)  # [B, D]

    def window_bias(self, x: Tensor, rows: Tensor, attention_mask: Tensor) -> Tensor | None:
        """The WindowGate's pool bias [B, J*(W+2)], or None without a gate. W = min(window, N), as window_layout
        cuts the input [B, N] (sym_min: the export's sequence axis stays symbolic)."""
        if self.gate is None:
            return None
        return self.gate(x, rows, torch.sym_min(self.cfg.window, attention_mask.shape[1]) + 2)

    def forward_readout(self, x: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """(logits [B, C], the last hidden state's masked mean [B, D]): the ood score reads the mean, which counts
        every piece (a document that is mostly not news should look so), the head reads head_features."""
        rows = self.read_mask(attention_mask)  # once: with windows it is a small graph of its own
        pooled = mean_pool(self.last_state(x), rows)  # as forward_pooled
        if self.blocks == 1 and self.pool is None:
            read = pooled
        else:
            read = self.head_features(x, rows, self.window_bias(x, rows, attention_mask))
        return self.head(read), pooled  # [B, C], [B, D]

    def forward_wide(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The wide path's logits [B, C] (config tfidf_buckets > 0); the serving head adds them to the encoder's."""
        return wide_logits(self.tfidf, input_ids, attention_mask)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        logits = self.forward_readout(self.forward_features(input_ids, attention_mask), attention_mask)[0]
        if self.tfidf is not None:
            logits = logits + self.forward_wide(input_ids, attention_mask)
        return logits

    @classmethod
    def from_encoder(
        cls, cfg: BertTextConfig, encoder: BertEncoder, weight: Tensor, bias: Tensor, seed: int = 0
    ) -> LaraBertClassifier:
        """A classifier from a converted encoder whose adapters are merged, and a head (weight [C, D], bias [C])."""
        model = cls(cfg, seed)
        model.encoder.load_state_dict(encoder.state_dict(), strict=True)
        with torch.no_grad():
            model.head.weight.copy_(weight)
            model.head.bias.copy_(bias)
        return model.eval()
