"""The byte-level text encoder's input side: hashed byte n-gram and word embeddings, case folding, and the two
kinds of positions (sinusoidal, absolute; a masked depthwise convolution, relative).

Apart from `text` so that `long_forward`, which recomputes these rows slice by slice, imports them without
importing the encoder that calls it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

# Exact polynomial code of the n-gram (base 257 > any id), then an order-salted modulus; use a prime
# bucket count for an even spread. The code of an n-gram is below 257**n, so int64 holds it exactly up to
# n = 7 (257**8 > 2**63): longer orders would wrap and alias unrelated n-grams.
_BASE = 257
_ORDER_SALT = 1_000_003
MAX_ORDER = 7


def sinusoidal(positions: Tensor, dim: int) -> Tensor:
    """positions [B, N] int -> [B, N, dim] sin/cos embeddings (work for any length)."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    ang = positions.to(torch.float32)[..., None] * freq  # [B, N, half]
    return torch.cat([ang.sin(), ang.cos()], dim=-1)  # [B, N, dim]


class HashedTable(nn.Module):
    """A table of `buckets` rows, `table_dim` wide and mapped to `dim` by one bias-free Linear when
    factorized (ALBERT-style: more buckets for the same parameters), else `dim` wide."""

    def __init__(self, buckets: int, dim: int, table_dim: int, key: str) -> None:
        super().__init__()
        if table_dim < 0:
            raise ValueError(f"{key} must be 0 (rows as wide as the model) or positive, got {table_dim}")
        self.buckets = buckets
        self.table = nn.Embedding(buckets, table_dim or dim)
        # Factorized: rows are added up in the narrow space, then projected once.
        self.proj = nn.Linear(table_dim, dim, bias=False) if table_dim else None

    def reset_parameters(self, std: float) -> None:
        """Rows ~ N(0, std); a projection keeps the output's scale at std (unit-gain: N(0, 1/table_dim))."""
        nn.init.normal_(self.table.weight, std=std)
        if self.proj is not None:
            nn.init.normal_(self.proj.weight, std=self.proj.in_features**-0.5)

    def project(self, rows: Tensor) -> Tensor:
        """[B, N, table width] -> [B, N, dim]."""
        return rows if self.proj is None else self.proj(rows)


class NgramEmbedding(HashedTable):
    """fastText-style hashed n-grams ending at each position, computed from input_ids in the graph.

    The n-gram at position i covers ids i-n+1..i; ids before the document start are pad (0), so a
    document's n-grams never depend on how much padding surrounds it.
    """

    def __init__(self, buckets: int, orders: tuple[int, ...], dim: int, table_dim: int = 0) -> None:
        if not orders or any(not 1 <= n <= MAX_ORDER for n in orders):
            raise ValueError(f"ngram_orders must be integers in 1..{MAX_ORDER} (exact int64 hashing), got {orders}")
        super().__init__(buckets, dim, table_dim, "ngram_dim")
        self.orders = orders

    def forward(self, ids: Tensor) -> Tensor:
        n_max = max(self.orders)
        padded = nn.functional.pad(ids, (n_max - 1, 0))  # [B, N + n_max - 1]
        n = ids.shape[1]
        out = torch.zeros(ids.shape + (self.table.embedding_dim,), dtype=self.table.weight.dtype, device=ids.device)
        h = torch.zeros_like(ids)
        for back in range(n_max):
            shifted = padded[:, n_max - 1 - back : n_max - 1 - back + n]  # id at i - back, [B, N]
            h = h + shifted * _BASE**back  # [B, N]
            if back + 1 in self.orders:
                bucket = (h + (back + 1) * _ORDER_SALT) % self.buckets
                out = out + self.table(bucket)  # [B, N, D] (D = table_dim when factorized)
        return self.project(out)  # [B, N, dim]


# Whole words: runs of ASCII letters and digits, letters case-folded, hashed by a polynomial code kept
# modulo a prime below 2**31 at every step, so no word length can wrap int64; words longer than
# WORD_MAX_BYTES are hashed by their last WORD_MAX_BYTES bytes.
_WORD_MOD = 2_147_483_647
WORD_MAX_BYTES = 16


def word_chars(ids: Tensor, utf8: bool = False) -> tuple[Tensor, Tensor]:
    """ids (byte + 1, 0 = pad) [B, N] -> (is a word byte [B, N] bool, case-folded code [B, N] int64, 0 elsewhere).
    utf8=True also counts every byte >= 0x80 as a word byte, so words of non-Latin scripts (their UTF-8
    sequences) are words too, not gaps; ASCII punctuation and spaces still separate them."""
    b = ids - 1
    upper = (b >= 65) & (b <= 90)
    is_word = upper | ((b >= 97) & (b <= 122)) | ((b >= 48) & (b <= 57))
    if utf8:
        is_word = is_word | (b >= 128)
    folded = (ids + upper.long() * 32) * is_word.long()  # 'A' -> 'a'; non-word bytes -> 0
    return is_word, folded


def fold_case(ids: Tensor) -> Tensor:
    """ids (byte + 1) [B, N] -> the same ids with ASCII 'A'..'Z' mapped to 'a'..'z' (pad 0 and other bytes kept)."""
    upper = (ids >= 65 + 1) & (ids <= 90 + 1)
    return ids + upper.long() * 32


def word_hashes(ids: Tensor, utf8: bool = False) -> tuple[Tensor, Tensor]:
    """ids [B, N] -> (h [B, N] int64 in [0, 2**31): the hash of the word ending at each position, end [B, N]
    int64: 1 at a word's last byte, else 0). Pads (id 0) are not word bytes, so neither depends on padding.
    utf8: as in `word_chars`."""
    is_word, code = word_chars(ids, utf8)  # [B, N] each
    n, w = ids.shape[1], WORD_MAX_BYTES
    code_p = nn.functional.pad(code, (w - 1, 0))  # [B, N + w - 1]
    word_p = nn.functional.pad(is_word.long(), (w - 1, 0))
    run = torch.ones_like(ids)  # 1 while bytes i-back..i are all word bytes
    h = torch.zeros_like(ids)
    for back in range(w):
        lo = w - 1 - back  # the columns holding byte i - back
        run = run * word_p[:, lo : lo + n]
        h = (h + code_p[:, lo : lo + n] * run * pow(_BASE, back, _WORD_MOD)) % _WORD_MOD  # < 2**31 * 2**9
    next_word = nn.functional.pad(is_word.long()[:, 1:], (0, 1))  # [B, N], 0 past the end
    return h, is_word.long() * (1 - next_word)


class WordEmbedding(HashedTable):
    """fastText-style hashed whole words: one table row per word, added at the word's last byte only.

    A word ends where the next byte is not a word byte (or the document ends), so its row depends on the
    document's own bytes only, never on padding; a word cut by truncation is hashed as the part kept.
    """

    def __init__(self, buckets: int, dim: int, table_dim: int = 0) -> None:
        if buckets < 1:
            raise ValueError(f"word_buckets must be positive, got {buckets}")
        super().__init__(buckets, dim, table_dim, "word_dim")

    def forward(self, ids: Tensor) -> Tensor:
        h, end = word_hashes(ids)  # [B, N] each
        rows = self.table(h % self.buckets) * end[..., None].to(self.table.weight.dtype)  # [B, N, D']
        return self.project(rows)  # [B, N, dim]


# A bigram's code mixes the two word hashes (each < 2**31; 2**20 * 2**31 stays inside int64); the salt keeps
# bigram buckets off the unigram ones' pattern.


class ConvPositions(nn.Module):
    """x + DWConv1d(x) over real tokens only: pads are zeroed first, so a document's output does not
    depend on the padding beside it, and the kernel sees the same zeros at a document's ends either way."""

    def __init__(self, dim: int, kernel: int) -> None:
        super().__init__()
        if kernel % 2 == 0:
            raise ValueError(f"conv_kernel must be odd (centred), got {kernel}")
        self.conv = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        x = x * valid[..., None].to(x.dtype)  # [B, N, D]
        return x + self.conv(x.transpose(1, 2)).transpose(1, 2)  # [B, N, D]
