"""Image augmentation for the robust ViT recipe: rotations about the centre, shifts of the asked size."""

from __future__ import annotations

import torch

from lara_serve.model_export.training.tasks import ImageTask, _augment_images, _rotate_images


def _bar() -> torch.Tensor:
    x = torch.zeros(1, 1, 28, 28, dtype=torch.uint8)
    x[0, 0, 6:22, 13:15] = 255  # a vertical bar through the centre
    return x


def test_a_quarter_turn_makes_a_vertical_bar_horizontal() -> None:
    g = torch.Generator().manual_seed(0)
    # max 90 degrees draws some angle; rotate by exactly 90 by asking many and keeping one near it
    x = _bar().repeat(64, 1, 1, 1)
    out = _rotate_images(x, g, 90.0).float()
    rows = out[:, 0].sum(-1)  # [B, H]: ink per row
    cols = out[:, 0].sum(-2)  # [B, W]: ink per column
    spread_rows = (rows > 0).sum(-1)
    spread_cols = (cols > 0).sum(-1)
    # the bar is 16 rows by 2 columns; turned by about 90 degrees it spans few rows and many columns
    assert bool(((spread_cols >= 14) & (spread_rows <= 6)).any())
    assert torch.allclose(out.sum((1, 2, 3)), x.float().sum((1, 2, 3)), rtol=0.08)  # ink kept (bilinear)


def test_zero_rotation_is_the_identity() -> None:
    x = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    assert torch.equal(_rotate_images(x, torch.Generator().manual_seed(0), 0.0), x)


def test_shift_moves_content_by_at_most_the_asked_pixels() -> None:
    x = torch.zeros(200, 1, 28, 28, dtype=torch.uint8)
    x[:, 0, 14, 14] = 255
    out = _augment_images(x, torch.Generator().manual_seed(1), pad=3)
    pos = out[:, 0].flatten(1).argmax(-1)
    dy, dx = pos // 28 - 14, (pos % 28 - 14).abs().clamp(max=14)  # flips mirror x about 13.5: |dx| <= 3 + 1
    assert dy.abs().max() == 3 and dx.max() <= 4


def test_task_applies_rotation_only_when_asked() -> None:
    images = _bar().repeat(8, 1, 1, 1)
    task = ImageTask(images, torch.zeros(8, dtype=torch.long), 0.0, 1.0, augment=True, shift=0, rotate_deg=0.0)
    (inputs, _), *_ = task.train_batches(8, torch.Generator().manual_seed(0))
    flipped_or_not = inputs["pixel_values"][:, 0]
    # shift 0 and no rotation: every image is the bar or its mirror image
    bar = images[0, 0].float() / 255.0
    assert all(torch.equal(im, bar) or torch.equal(im, bar.flip(-1)) for im in flipped_or_not)
    task.rotate_deg = 30.0
    (inputs, _), *_ = task.train_batches(8, torch.Generator().manual_seed(0))
    assert not all(torch.equal(im, bar) or torch.equal(im, bar.flip(-1)) for im in inputs["pixel_values"][:, 0])
