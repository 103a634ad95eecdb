"""ViT for small grayscale images (spec 2): conv stem, token grid, pre-LN blocks, no class token, GAP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lara_serve.model_export.models.config import ViTConfig
from lara_serve.model_export.models.layers import Block, init_weights


class ConvStem(nn.Module):
    """3x3 convs at full resolution, then a strided 3x3 conv to `dim` channels (the token grid).

    With stem_channels = 0 it is a plain linear patch embedding (conv with kernel = stride = patch).
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        p = cfg.patch_size
        if cfg.stem_channels == 0:
            self.body = nn.Conv2d(cfg.in_chans, cfg.dim, kernel_size=p, stride=p)
            return
        layers: list[nn.Module] = []
        ch = cfg.in_chans
        for _ in range(cfg.stem_layers):
            layers += [
                nn.Conv2d(ch, cfg.stem_channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(cfg.stem_channels),
                nn.GELU(),
            ]
            ch = cfg.stem_channels
        k, pad = (3, 1) if p < 3 else (p, 0)
        if cfg.stem_grid_layers == 0:
            layers.append(nn.Conv2d(ch, cfg.dim, kernel_size=k, stride=p, padding=pad))
        else:
            # More conv work at the token-grid resolution: a small CNN before the attention blocks.
            layers += [nn.Conv2d(ch, cfg.dim, k, stride=p, padding=pad, bias=False), nn.BatchNorm2d(cfg.dim), nn.GELU()]
            for i in range(cfg.stem_grid_layers):
                last = i == cfg.stem_grid_layers - 1
                layers.append(nn.Conv2d(cfg.dim, cfg.dim, 3, padding=1, bias=last))
                if not last:
                    layers += [nn.BatchNorm2d(cfg.dim), nn.GELU()]
        self.body = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)  # [B, D, gh, gw]


class ViT(nn.Module):
    """forward(pixel_values [B, C, H, W] normalized) -> logits [B, num_classes] float32."""

    def __init__(self, cfg: ViTConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.stem = ConvStem(cfg)
        self.grid = cfg.image_size // cfg.patch_size
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.dim, self.grid, self.grid))
        dpr = [cfg.drop_path * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.ModuleList(
            Block(
                cfg.dim,
                cfg.heads,
                cfg.mlp_ratio,
                cfg.attention,
                i,
                drop_path=dpr[i],
                seed=seed,
                mlp_dwconv=cfg.mlp_dwconv,
            )
            for i in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)
        init_weights(self)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def _pos(self, gh: int, gw: int) -> Tensor:
        """Position embeddings, bilinearly interpolated when the token grid differs from training."""
        if (gh, gw) == (self.grid, self.grid):
            return self.pos_embed
        return F.interpolate(self.pos_embed, size=(gh, gw), mode="bilinear", align_corners=False)

    def forward_features(self, pixel_values: Tensor) -> Tensor:
        x = self.stem(pixel_values)  # [B, D, gh, gw]
        gh, gw = x.shape[-2], x.shape[-1]
        x = (x + self._pos(gh, gw)).flatten(2).transpose(1, 2)  # [B, N, D]
        for blk in self.blocks:
            x = blk(x, None, (gh, gw))
        return self.norm(x)  # [B, N, D]

    def forward_pooled(self, x: Tensor) -> Tensor:
        return x.mean(1)  # GAP: [B, N, D] -> [B, D]

    def forward_head(self, x: Tensor) -> Tensor:
        return self.head(self.forward_pooled(x)).float()  # [B, num_classes]

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(pixel_values))
