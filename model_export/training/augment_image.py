"""Photometric image augmentation for training: brightness, contrast, gamma, blur, noise and JPEG.

A model trained only on Fashion-MNIST's fixed exposure (black background, garments up to 255) keys on
absolute grey levels: halve the contrast or lift the background by 60 levels and it answers at random with
high confidence. Each training image here gets, with its own probability, a photometric change drawn from
ranges that cover what photographs and scans do to a picture (and the suite's corruptions); the geometric
augmentation (shifts, rotations, flips) stays in `tasks.ImageTask`.

Every draw comes from the caller's `torch.Generator`, so a seeded run sees the same images again. Each op
takes per-image parameters and is the identity at its neutral setting (brightness 0, contrast 1, gamma 1,
sigma 0, JPEG quality None), which is how images not drawn for an op pass through unchanged.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

_RANGES = ("brightness", "contrast", "gamma", "blur_sigma", "noise_sigma", "jpeg_quality")


def brightness(x: Tensor, delta: Tensor) -> Tensor:
    """x: float [B, 1, H, W] grey levels 0-255; delta: [B] levels added, clipped to 0-255."""
    return (x + delta[:, None, None, None]).clamp(0, 255)


def contrast(x: Tensor, factor: Tensor, about_mean: Tensor) -> Tensor:
    """Scale each image's levels by `factor` [B] about its own mean (Pillow's ImageEnhance.Contrast) where
    `about_mean` [B] is true, about black otherwise (a dimmer exposure of a dark background)."""
    pivot = torch.where(about_mean, x.mean(dim=(1, 2, 3)), torch.zeros_like(factor))  # [B]
    f, p = factor[:, None, None, None], pivot[:, None, None, None]
    return (p + f * (x - p)).clamp(0, 255)


def gamma(x: Tensor, g: Tensor) -> Tensor:
    """255 * (x / 255) ** g per image (g [B] > 0): < 1 lifts the dark levels, > 1 sinks them."""
    return 255.0 * (x / 255.0).clamp(0, 1) ** g[:, None, None, None]


def gaussian_blur(x: Tensor, sigma: Tensor) -> Tensor:
    """Separable Gaussian blur with a per-image sigma [B] in pixels (0: unchanged), edges replicated."""
    radius = max(1, math.ceil(3 * float(sigma.max()))) if len(sigma) else 1
    offsets = torch.arange(-radius, radius + 1, dtype=x.dtype)  # [K]
    s = sigma.clamp_min(1e-6)[:, None]  # [B, 1]
    kernel = torch.exp(-0.5 * (offsets[None] / s) ** 2)  # [B, K]; sigma ~0 leaves a one-hot kernel
    kernel = kernel / kernel.sum(-1, keepdim=True)
    b, c, h, w = x.shape
    padded = torch.nn.functional.pad(x.reshape(1, b * c, h, w), (radius,) * 4, mode="replicate")
    k = kernel.repeat_interleave(c, 0)  # [B*C, K]
    rows = torch.nn.functional.conv2d(padded, k[:, None, None, :], groups=b * c)  # [1, B*C, H+2r, W]
    out = torch.nn.functional.conv2d(rows, k[:, None, :, None], groups=b * c)  # [1, B*C, H, W]
    return out.reshape(b, c, h, w)


def gaussian_noise(x: Tensor, sigma: Tensor, g: torch.Generator) -> Tensor:
    """Additive Gaussian noise of `sigma` [B] grey levels, clipped to 0-255 (as the robustness suite's)."""
    noise = torch.randn(x.shape, generator=g, dtype=x.dtype) * sigma[:, None, None, None]
    return (x + noise).clamp(0, 255)


def jpeg(x: Tensor, quality: list[int | None]) -> Tensor:
    """Each image saved as a greyscale JPEG at its quality (Pillow) and decoded; None leaves it unchanged.
    x: float [B, 1, H, W] -> float, rounded to whole levels where compressed."""
    from PIL import Image

    out = x.clone()
    for i, q in enumerate(quality):
        if q is None:
            continue
        buf = io.BytesIO()
        Image.fromarray(x[i, 0].round().clamp(0, 255).to(torch.uint8).numpy()).save(buf, format="JPEG", quality=q)
        decoded = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("L"), dtype=np.float32)
        out[i, 0] = torch.from_numpy(decoded.copy())
    return out


def _uniform(lo: float, hi: float, n: int, g: torch.Generator) -> Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=g)


@dataclass(frozen=True)
class ImagePhotometric:
    """Per training image, each change with its probability and a value drawn from its range: brightness in
    grey levels added (clipped), contrast factor (about the image mean or about black, even odds), gamma
    (log-uniform), blur sigma in pixels, noise sigma in grey levels, JPEG quality. Applied in that order
    (exposure, then optics, then sensor noise, then compression)."""

    brightness_prob: float = 0.3
    brightness: tuple[float, float] = (-70.0, 70.0)
    contrast_prob: float = 0.3
    contrast: tuple[float, float] = (0.4, 1.0)
    gamma_prob: float = 0.2
    gamma: tuple[float, float] = (0.5, 2.0)
    blur_prob: float = 0.2
    blur_sigma: tuple[float, float] = (0.3, 1.5)
    noise_prob: float = 0.25
    noise_sigma: tuple[float, float] = (5.0, 35.0)
    jpeg_prob: float = 0.15
    jpeg_quality: tuple[int, int] = (20, 95)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_prob") and not 0.0 <= value <= 1.0:
                raise ValueError(f"{f.name} must be a probability in [0, 1], got {value}")
            if f.name in _RANGES and not (len(value) == 2 and value[0] <= value[1]):
                raise ValueError(f"{f.name} must be a range [low, high] with low <= high, got {list(value)}")
        if self.contrast[0] < 0 or self.gamma[0] <= 0 or self.blur_sigma[0] < 0 or self.noise_sigma[0] < 0:
            raise ValueError("contrast, blur_sigma and noise_sigma must be >= 0 and gamma > 0")
        if not 1 <= self.jpeg_quality[0] <= self.jpeg_quality[1] <= 100:
            raise ValueError(f"jpeg_quality must lie in [1, 100], got {list(self.jpeg_quality)}")

    @classmethod
    def from_json(cls, text: str) -> ImagePhotometric:
        """Settings from a JSON object of overrides ('{}': the defaults); unknown keys are an error."""
        kw: dict[str, Any] = json.loads(text)
        if not isinstance(kw, dict):
            raise ValueError(f"expected a JSON object, got {text!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kw) - known)
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; allowed: {sorted(known)}")
        return cls(**{k: tuple(v) if k in _RANGES else v for k, v in kw.items()})

    def settings(self) -> dict[str, Any]:
        """The settings as JSON-ready values (config.json's training notes)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    def __call__(self, x: Tensor, g: torch.Generator) -> Tensor:
        """x: uint8 [B, 1, H, W] -> uint8, same shape."""
        b = x.shape[0]
        out = x.to(torch.float32)

        def drawn(prob: float) -> Tensor:
            return torch.rand(b, generator=g) < prob  # [B] which images get this op

        on = drawn(self.brightness_prob)
        out = brightness(out, torch.where(on, _uniform(*self.brightness, b, g), torch.zeros(b)))
        on, about_mean = drawn(self.contrast_prob), torch.rand(b, generator=g) < 0.5
        out = contrast(out, torch.where(on, _uniform(*self.contrast, b, g), torch.ones(b)), about_mean)
        on = drawn(self.gamma_prob)
        log_g = _uniform(math.log(self.gamma[0]), math.log(self.gamma[1]), b, g)
        out = gamma(out, torch.where(on, log_g.exp(), torch.ones(b)))
        on = drawn(self.blur_prob)
        if on.any():
            out = gaussian_blur(out, torch.where(on, _uniform(*self.blur_sigma, b, g), torch.zeros(b)))
        on = drawn(self.noise_prob)
        if on.any():
            out = gaussian_noise(out, torch.where(on, _uniform(*self.noise_sigma, b, g), torch.zeros(b)), g)
        on = drawn(self.jpeg_prob)
        lo, hi = self.jpeg_quality
        q = torch.randint(lo, hi + 1, (b,), generator=g)
        out = jpeg(out, [int(qi) if o else None for qi, o in zip(q.tolist(), on.tolist(), strict=True)])
        return out.round().clamp(0, 255).to(torch.uint8)


# Fixed corruptions of the training holdout, scored each epoch of a photometric run to choose weights without
# t10k: the targets at their stated strength (contrast x0.5 about the mean, brightness +60, blur
# sigma 1.2, noise sigma 25) through this module's ops, seeded; the suite measures with its own code.
HOLDOUT_CORRUPTIONS = ("contrast0.5", "bright60", "blur1.2", "noise25")


def holdout_corruptions(images: Tensor, seed: int = 1234) -> dict[str, Tensor]:
    """uint8 [N, 1, H, W] -> {name: uint8 [N, 1, H, W]} for each of HOLDOUT_CORRUPTIONS."""
    x, n = images.to(torch.float32), len(images)
    g = torch.Generator().manual_seed(seed)
    out = {
        "contrast0.5": contrast(x, torch.full((n,), 0.5), torch.ones(n, dtype=torch.bool)),
        "bright60": brightness(x, torch.full((n,), 60.0)),
        "blur1.2": gaussian_blur(x, torch.full((n,), 1.2)),
        "noise25": gaussian_noise(x, torch.full((n,), 25.0), g),
    }
    return {k: v.round().clamp(0, 255).to(torch.uint8) for k, v in out.items()}
