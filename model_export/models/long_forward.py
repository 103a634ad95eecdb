"""The text encoder's features for very long documents, in bounded slices of rows (eager, CPU, inference).

Why: the plain forward holds every layer's full-length activations at once. At 128 channels a full-length
fp32 tensor is 512 bytes per token, and the plain eager forward peaks near 4 KB per input byte (onnxruntime
7.4: docs/models.md, "Up to 1 MiB"), so a 1 MiB document would need 4-8 GB. Here only what LARA needs
whole is ever full length:

- the residual stream x [n, D], updated in place, slice by slice (512 B/token);
- one head's q, k, v at a time ([n, d] each; 3/H of the full width): LARA's global statistics (chunk-mean
  landmarks, the sums over keys, the softmax over queries) need every token of a head, not every head;
- the attention output of all heads [H, n, d] (512 B/token), read back slice by slice for the projection.

Everything per token (embeddings and n-grams, convolutional positions, LayerNorm, the q/k/v projection, the
output projection, the MLP, the final norm) runs on slices of `chunk` rows; the embedding slices carry the
few rows of context (halo) the n-grams, words and convolution read, so their rows are the plain forward's.
The result is the plain forward's up to float32 rounding (summation orders differ), tested against a
float64 reference. Each document runs over its own valid rows, so its features are the same bits alone
and in any batch, with any padding; padded rows of the output are zeros.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lara_serve import kernels
from lara_serve.model_export.models.text_embeddings import WORD_MAX_BYTES, sinusoidal

# Documents with more valid tokens than this take the sliced path (shorter ones: the plain forward, as
# before). Rows per slice: large enough that the per-slice GEMMs run at full speed, small enough that a
# slice's temporaries (the MLP's [chunk, 2D] and the like) stay far below the full-length tensors.
LONG_FROM = 65536
CHUNK = 16384


def applies(model: Any, input_ids: Tensor) -> bool:
    """Whether `model.forward_features` should take this path for `input_ids` [B, N]: eager inference on the
    CPU, LARA attention, and a padded length above LONG_FROM."""
    return (
        input_ids.is_cpu
        and not model.training
        and not torch.is_grad_enabled()
        and model.cfg.attention.kind == "lara"
        and input_ids.shape[1] > LONG_FROM
    )


def features(model: Any, ids: Tensor, valid: Tensor, chunk: int = 0) -> Tensor:
    """ids [B, N] int64 (pads already 0, case already folded when the model folds), valid [B, N] bool ->
    the final-norm features [B, N, D] float32, each document computed over its own valid rows."""
    chunk = chunk or CHUNK
    b, n = ids.shape
    if b == 1 and bool(valid.all()):
        return _document(model, ids, chunk)  # [1, N, D], no copy
    out = torch.zeros(b, n, model.cfg.dim, dtype=model.embed.weight.dtype)
    for i in range(b):
        own = ids[i][valid[i]][None]  # [1, n_i]
        if own.shape[1]:
            out[i, valid[i]] = _document(model, own, chunk)[0]
    return out  # [B, N, D]


def _halo(model: Any) -> tuple[int, int]:
    """Rows of context left and right of a slice that its embedding rows depend on."""
    cfg = model.cfg
    left = max(cfg.ngram_orders) - 1 if model.ngrams is not None else 0
    left = max(left, WORD_MAX_BYTES - 1 if model.words is not None else 0)
    right = 1 if model.words is not None else 0  # a word ends where the next byte is not a word byte
    conv = model.pos_conv.conv.kernel_size[0] // 2 if model.pos_conv is not None else 0
    return left + conv, right + conv


def embed_rows(model: Any, ids: Tensor, start: Tensor | int) -> Tensor:
    """forward_features' embedding stage on consecutive rows of one unpadded document, the first at position
    `start` (an int, or a [] tensor in the sliced program's EmbedStage): ids [1, m] -> [1, m, D]."""
    x = model.embed(ids)  # [1, m, D]
    if model.ngrams is not None:
        x = x + model.ngrams(ids)
    if model.words is not None:
        x = x + model.words(ids)
    if model.pos_conv is not None:
        return model.pos_conv(x, torch.ones_like(ids, dtype=torch.bool))
    pos = start + torch.arange(ids.shape[1])[None]  # [1, m]: every row is real
    return x + sinusoidal(pos, model.cfg.dim) * 0.1


def _document(model: Any, ids: Tensor, chunk: int) -> Tensor:
    """One unpadded document ids [1, n] -> final-norm features [1, n, D]."""
    n = ids.shape[1]
    left, right = _halo(model)
    slices = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
    x = torch.empty(1, n, model.cfg.dim, dtype=model.embed.weight.dtype)  # [1, n, D], the residual stream
    for s, e in slices:
        a, z = max(0, s - left), min(n, e + right)
        x[:, s:e] = embed_rows(model, ids[:, a:z], a)[:, s - a : e - a]
    for blk in model.blocks:
        out = _attention(blk, x, slices)  # [1, H, n, d]
        for s, e in slices:
            o = out[:, :, s:e].transpose(1, 2).reshape(1, e - s, -1)  # [1, m, D]
            y = x[:, s:e] + blk.attn.proj(o)
            x[:, s:e] = y + blk.mlp(blk.norm2(y))
        del out
    for s, e in slices:
        x[:, s:e] = model.norm(x[:, s:e])
    return x


def _attention(blk: Any, x: Tensor, slices: list[tuple[int, int]]) -> Tensor:
    """LARA over all n rows, one head at a time: x [1, n, D] -> per-head outputs [1, H, n, d]."""
    attn = blk.attn
    h_count, d, dim = attn.heads, attn.head_dim, x.shape[-1]
    weight = attn.qkv.weight.view(3, h_count, d, dim)  # rows of q, k, v per head
    bias = attn.qkv.bias.view(3, h_count, d) if attn.qkv.bias is not None else None
    noise = getattr(attn, "eval_noise", None)  # [1, H, C, d] (fixed-noise eval) or None (mean)
    n = x.shape[1]
    out = torch.empty(1, h_count, n, d, dtype=x.dtype)
    for h in range(h_count):
        qkv = torch.empty(3, 1, 1, n, d, dtype=x.dtype)  # this head's q, k, v [1, 1, n, d] each
        for s, e in slices:
            xn = blk.norm1(x[0, s:e])  # [m, D]
            for j in range(3):
                qkv[j, 0, 0, s:e] = F.linear(xn, weight[j, h], None if bias is None else bias[j, h])
        q, k, v = qkv.unbind(0)
        ql, kl = attn._landmarks(q, k, None, None)  # [1, 1, C, d]
        out[:, h : h + 1] = kernels.lara_attention(
            q, k, v, ql, kl, alpha_coeff=attn.cfg.alpha_coeff, noise=None if noise is None else noise[:, h : h + 1]
        )
        del qkv, q, k, v
    return out
