"""Shared transformer layers: attention wrapper over `kernels` (spec 2), MLP, pre-LN block."""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lara_serve import kernels
from lara_serve.kernels.landmarks import tracing
from lara_serve.model_export.models.config import AttentionConfig


def layer_seed(seed: int, layer: int, tag: str) -> int:
    """Stable per-layer seed, hash(global_seed, layer_index, tag) as in spec 7."""
    h = hashlib.sha256(f"{seed}:{layer}:{tag}".encode()).digest()
    return int.from_bytes(h[:7], "little")


class LandmarkModule(nn.Module):
    """Light proposal module (spec 5.2): Linear(d, d) + LayerNorm(d), shared across heads."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(head_dim, head_dim)
        self.norm = nn.LayerNorm(head_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.proj(x))  # [B, H, C, d]


class Attention(nn.Module):
    """Multi-head self-attention; the token mixer is chosen by `cfg.kind` and always calls `kernels`.

    forward(x [B, N, D], key_padding_mask [B, N] bool True=pad, grid (gh, gw) or None) -> [B, N, D].
    Landmarks are 2-D pooled when `grid` is given, else 1-D chunk means over valid tokens.
    Randomness (spec 7): training draws fresh noise from a per-module generator; eval is deterministic
    ("mean" mode, or a fixed seeded buffer broadcast over the batch when eval_noise="fixed").
    """

    def __init__(self, dim: int, heads: int, cfg: AttentionConfig, layer_index: int, seed: int = 0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} must be divisible by heads {heads}")
        self.cfg = cfg
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=cfg.qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.generator = torch.Generator().manual_seed(layer_seed(seed, layer_index, "train"))
        if cfg.kind == "lara" and cfg.landmark_module == "light":
            self.q_landmark = LandmarkModule(self.head_dim)
            self.k_landmark = LandmarkModule(self.head_dim)
        if cfg.kind == "lara" and cfg.eval_noise == "fixed":
            g = torch.Generator().manual_seed(layer_seed(seed, layer_index, "eval"))
            self.register_buffer("eval_noise", torch.randn(1, heads, cfg.num_landmarks, self.head_dim, generator=g))
        if cfg.kind == "performer":
            g = torch.Generator().manual_seed(layer_seed(seed, layer_index, "performer"))
            proj = kernels.orthogonal_gaussian_projection(heads, cfg.performer_features, self.head_dim, g)
            self.register_buffer("eval_proj", proj.float())  # [H, S, d]

    def reseed(self, seed: int) -> None:
        """Re-seed the training noise stream (used on resume so training replays)."""
        self.generator.manual_seed(seed)

    def _randn(self, *shape: int, like: Tensor) -> Tensor:
        return torch.randn(*shape, generator=self.generator).to(device=like.device, dtype=like.dtype)

    def _landmarks(
        self, q: Tensor, k: Tensor, mask: Tensor | None, grid: tuple[int, int] | None
    ) -> tuple[Tensor, Tensor]:
        c = self.cfg.num_landmarks
        if grid is not None:
            ql, kl = kernels.pool_2d(q, grid, c), kernels.pool_2d(k, grid, c)  # [B, H, C, d]
        else:
            ql, kl = kernels.chunk_means_1d(q, c, mask), kernels.chunk_means_1d(k, c, mask)  # [B, H, C, d]
        if self.cfg.landmark_module == "light":
            ql, kl = self.q_landmark(ql), self.k_landmark(kl)
        if self.cfg.mixed:
            w = torch.softmax(kl @ kl.transpose(-1, -2) / self.head_dim**0.5, dim=-1)  # [B, H, C, C]
            kl = w @ kl
        return ql, kl

    def _mix(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, grid: tuple[int, int] | None) -> Tensor:
        kind = self.cfg.kind
        b, h, n, d = q.shape
        if kind == "softmax":
            return kernels.softmax_attention(q, k, v, key_padding_mask=mask)
        if kind == "performer":
            proj = self._randn(h, self.cfg.performer_features, d, like=q) if self.training else self.eval_proj
            return kernels.performer_attention(q, k, v, proj, key_padding_mask=mask)
        if kind == "ra":
            if self.training:
                noise = self._randn(b, h, n, d, like=q)
                uniforms = torch.rand(b, h, n, generator=self.generator).to(device=q.device, dtype=q.dtype)
                return kernels.randomized_attention(q, k, v, key_padding_mask=mask, noise=noise, uniforms=uniforms)
            return kernels.randomized_attention(q, k, v, key_padding_mask=mask)
        ql, kl = self._landmarks(q, k, mask, grid)
        if self.training:
            noise = self._randn(b, h, self.cfg.num_landmarks, d, like=q)
        else:
            noise = getattr(self, "eval_noise", None)
        return kernels.lara_attention(
            q, k, v, ql, kl, key_padding_mask=mask, alpha_coeff=self.cfg.alpha_coeff, noise=noise
        )

    def _heads(self, x: Tensor) -> tuple[Tensor, ...]:
        """q, k, v [B, H, N, d] from x [B, N, D]: the same numbers on both paths, up to float rounding."""
        b, n, dim = x.shape
        if tracing():
            # Exported graphs project straight into head-major layout, one broadcast MatMul per tensor
            # (x [B, 1, N, D] @ W [H, D, d]; the weight reshapes fold into constants at load). The eager
            # form below (one Linear, then a permute) costs onnxruntime a Split of [B, N, 3, H, d] and three
            # Transposes per layer: 14% of the text model's time at 32K tokens (onnxruntime profile).
            w = self.qkv.weight.view(3, self.heads, self.head_dim, dim).transpose(-1, -2)  # [3, H, D, d]
            bias = self.qkv.bias
            xs = x.unsqueeze(1)  # [B, 1, N, D]
            if bias is None:
                return tuple(xs @ w[i] for i in range(3))
            bias = bias.view(3, self.heads, 1, self.head_dim)
            return tuple(xs @ w[i] + bias[i] for i in range(3))
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # [3, B, H, N, d]
        return qkv.unbind(0)  # [B, H, N, d] each

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, grid: tuple[int, int] | None = None) -> Tensor:
        b, n, dim = x.shape
        q, k, v = self._heads(x)
        out = self._mix(q, k, v, key_padding_mask, grid)  # [B, H, N, d]
        out = out.transpose(1, 2).reshape(b, n, dim)  # [B, N, D]
        return self.proj(out)


class Mlp(nn.Module):
    """fc1 -> (optional 3x3 depthwise conv over the token grid, as in PVTv2) -> GELU -> fc2."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0, dwconv: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden) if dwconv else None
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        x = self.fc1(x)  # [B, N, hidden]
        if self.dwconv is not None:
            if grid is None:
                raise ValueError("the depthwise-conv MLP needs a token grid (image models only)")
            b, n, c = x.shape
            g = x.transpose(1, 2).reshape(b, c, grid[0], grid[1])  # [B, hidden, gh, gw]
            x = self.dwconv(g).flatten(2).transpose(1, 2)  # [B, N, hidden]
        return self.drop(self.fc2(self.drop(F.gelu(x))))


class DropPath(nn.Module):
    """Stochastic depth per example (identity in eval)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape[0], 1, 1, device=x.device) >= self.p  # [B, 1, 1]
        return x * keep.to(x.dtype) / (1.0 - self.p)


class Block(nn.Module):
    """Pre-LN transformer block."""

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_ratio: float,
        cfg: AttentionConfig,
        layer_index: int,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        seed: int = 0,
        mlp_dwconv: bool = False,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, cfg, layer_index, seed)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout, dwconv=mlp_dwconv)
        self.drop = nn.Dropout(dropout)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, grid: tuple[int, int] | None = None) -> Tensor:
        x = x + self.drop_path(self.drop(self.attn(self.norm1(x), key_padding_mask, grid)))
        return x + self.drop_path(self.mlp(self.norm2(x), grid))


def init_weights(module: nn.Module) -> None:
    """Spec 2 init: Linear trunc-normal(0.02), zero bias; LayerNorm (1, 0)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
