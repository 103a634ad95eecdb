"""A BERT-shaped word-piece encoder (post-LN, Devlin et al. 2019) whose token mixer is a seam.

Embeddings (word + learned position + token type 0, LayerNorm), then per layer x = LN(x + Attn(x));
x = LN(x + FFN(x)). Dropout is left out: these encoders are converted and served, not pretrained here. The
sentence embedding is sentence-transformers' pooling: masked mean, then L2 normalise.

`BertEncoder(config, mixer=...)` takes a factory of modules mapping (q, k, v, key_padding_mask) -> out, and
`embeddings.positions` may be swapped for any module that adds positions to [B, N, D] embeddings. The
teacher (exact softmax, `lara_serve.model_export.pretrained.teacher`) and the LARA student and served
classifier (`bert_lara.py`) are this class with different mixers and positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lara_serve import kernels


@dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT encoder; defaults are all-MiniLM-L6-v2's."""

    vocab_size: int = 30522
    dim: int = 384
    depth: int = 6
    heads: int = 12
    mlp_dim: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    norm_eps: float = 1e-12
    pad_id: int = 0

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} must be divisible by heads {self.heads}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @classmethod
    def from_hf(cls, hf: dict) -> BertConfig:
        """From a Hugging Face BERT config.json; refuses what this encoder does not implement."""
        if hf.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"only exact (erf) GELU is implemented, config asks for {hf['hidden_act']!r}")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"only absolute positions are implemented, got {hf['position_embedding_type']!r}")
        return cls(
            vocab_size=hf["vocab_size"],
            dim=hf["hidden_size"],
            depth=hf["num_hidden_layers"],
            heads=hf["num_attention_heads"],
            mlp_dim=hf["intermediate_size"],
            max_positions=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2),
            norm_eps=hf.get("layer_norm_eps", 1e-12),
            pad_id=hf.get("pad_token_id", 0),
        )


# ----------------------------------------------------------------------------- the encoder
class LearnedPositions(nn.Module):
    """BERT's absolute positions: row n of a learned table is added at position n (at most max_positions)."""

    def __init__(self, max_positions: int, dim: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.zeros(max_positions, dim))

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        n = x.shape[1]
        if n > self.table.shape[0]:
            raise ValueError(f"{n} pieces but only {self.table.shape[0]} learned positions")
        return x + self.table[:n]  # [B, N, D]


class Embeddings(nn.Module):
    """Word + position + token type 0, then LayerNorm. Right padding keeps every position id at its index."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.words = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.positions: nn.Module = LearnedPositions(cfg.max_positions, cfg.dim)
        self.token_type = nn.Parameter(torch.zeros(cfg.type_vocab_size, cfg.dim))
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)

    def forward(self, input_ids: Tensor, pad: Tensor) -> Tensor:
        x = self.words(input_ids) + self.token_type[0]  # [B, N, D]; single segments: type 0 everywhere
        return self.norm(self.positions(x, pad))  # [B, N, D]


class SoftmaxMixer(nn.Module):
    """Exact attention softmax(q k^T / sqrt d) v through the project's kernels (torch SDPA)."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Tensor) -> Tensor:
        return kernels.softmax_attention(q, k, v, key_padding_mask=pad)  # [B, H, N, d]


Mixer = Callable[[int], nn.Module]  # layer index -> a module (q, k, v [B, H, N, d], pad [B, N]) -> [B, H, N, d]


class SelfAttention(nn.Module):
    """q/k/v projections, the token mixer, the output projection (BERT's `attention.self` + `output.dense`)."""

    def __init__(self, cfg: BertConfig, mixer: nn.Module) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.query = nn.Linear(cfg.dim, cfg.dim)
        self.key = nn.Linear(cfg.dim, cfg.dim)
        self.value = nn.Linear(cfg.dim, cfg.dim)
        self.mixer = mixer
        self.out = nn.Linear(cfg.dim, cfg.dim)

    def _split(self, x: Tensor) -> Tensor:
        b, n, dim = x.shape
        return x.view(b, n, self.heads, dim // self.heads).transpose(1, 2)  # [B, H, N, d]

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        b, n, dim = x.shape
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        y = self.mixer(q, k, v, pad)  # [B, H, N, d]
        return self.out(y.transpose(1, 2).reshape(b, n, dim))  # [B, N, D]


class FeedForward(nn.Module):
    """Linear -> exact GELU -> Linear (BERT's `intermediate` + `output.dense`)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.dim, cfg.mlp_dim)
        self.down = nn.Linear(cfg.mlp_dim, cfg.dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))  # [B, N, D]


class Layer(nn.Module):
    """Post-LN block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, cfg: BertConfig, mixer: nn.Module) -> None:
        super().__init__()
        self.attn = SelfAttention(cfg, mixer)
        self.attn_norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.ffn = FeedForward(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)

    def finish(self, x: Tensor, attn_out: Tensor) -> Tensor:
        """Everything after the attention sublayer, given its output (attention transfer feeds the teacher's)."""
        h = self.attn_norm(x + attn_out)  # [B, N, D]
        return self.ffn_norm(h + self.ffn(h))

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        return self.finish(x, self.attn(x, pad))


class BertEncoder(nn.Module):
    """forward(input_ids [B, N] int64, attention_mask [B, N] 1 = real) -> last hidden state [B, N, D]."""

    def __init__(self, cfg: BertConfig, mixer: Mixer | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        make = mixer or (lambda i: SoftmaxMixer())
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg, make(i)) for i in range(cfg.depth))

    def forward(self, input_ids: Tensor, attention_mask: Tensor, all_layers: bool = False) -> Tensor:
        """all_layers: [B, N, (depth + 1) * D], the embeddings' output and every layer's, concatenated in order
        (the last D columns are the last hidden state)."""
        pad = attention_mask == 0  # [B, N] True = padding, the kernels' convention
        x = self.embeddings(input_ids, pad)
        states = [x] if all_layers else []
        for layer in self.layers:
            x = layer(x, pad)
            if all_layers:
                states.append(x)
        return torch.cat(states, -1) if all_layers else x  # [B, N, D] or [B, N, (depth + 1) * D]

    def attention_io(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Each layer's input and its attention sublayer's output ([B, N, D] each): the targets of transfer."""
        pad = attention_mask == 0
        x = self.embeddings(input_ids, pad)
        inputs, outputs = [], []
        for layer in self.layers:
            a = layer.attn(x, pad)
            inputs.append(x)
            outputs.append(a)
            x = layer.finish(x, a)
        return inputs, outputs

    def embed(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The sentence embedding [B, D]: masked mean of the last hidden state, L2-normalised."""
        return mean_pool(self(input_ids, attention_mask), attention_mask)


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """sentence-transformers' Pooling(mean) + Normalize: sum of real rows / their count, then unit length."""
    m = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, N, 1]
    mean = (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)  # [B, D]
    return F.normalize(mean, p=2, dim=-1)
