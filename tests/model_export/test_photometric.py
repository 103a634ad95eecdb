"""Photometric augmentation (augment_image): each op on small arrays (range, seeded determinism, identity at
its neutral setting), the recipe as a whole, the --image-photometric flag parsed and recorded, the holdout
corruptions, and the serving head's photometric copies (finalize.with_corrupted)."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from lara_serve.model_export.head import finalize
from lara_serve.model_export.training import augment_image as A
from lara_serve.model_export.training import train
from lara_serve.model_export.training.tasks import ImageTask


def _images(n: int = 6, seed: int = 0) -> torch.Tensor:
    """uint8 [n, 1, 8, 8]: a bright square on black plus random texture, every level 0-255 reachable."""
    x = torch.randint(0, 256, (n, 1, 8, 8), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    x[:, :, :2] = 0  # a black band, as Fashion-MNIST's background
    x[:, :, 3:6, 3:6] = 250
    return x


def test_each_op_is_the_identity_at_its_neutral_setting() -> None:
    x = _images().float()
    n = len(x)
    assert torch.equal(A.brightness(x, torch.zeros(n)), x)
    assert torch.allclose(A.contrast(x, torch.ones(n), torch.tensor([True, False] * 3)), x)
    assert torch.allclose(A.gamma(x, torch.ones(n)), x, atol=1e-3)
    assert torch.allclose(A.gaussian_blur(x, torch.zeros(n)), x, atol=1e-4)
    assert torch.equal(A.gaussian_noise(x, torch.zeros(n), torch.Generator()), x)
    assert torch.equal(A.jpeg(x, [None] * n), x)


def test_ops_change_levels_as_named_and_stay_in_range() -> None:
    x = _images().float()
    n = len(x)
    up = A.brightness(x, torch.full((n,), 70.0))
    assert float(up[:, :, :2].min()) == 70.0 and float(up.max()) == 255.0  # background lifted, highlights clipped
    half = A.contrast(x, torch.full((n,), 0.5), torch.ones(n, dtype=torch.bool))
    assert torch.allclose(half.mean((1, 2, 3)), x.mean((1, 2, 3)), atol=1e-3)  # about the mean: mean kept
    assert torch.allclose(half.std((1, 2, 3)), 0.5 * x.std((1, 2, 3)), rtol=1e-4)
    dim = A.contrast(x, torch.full((n,), 0.5), torch.zeros(n, dtype=torch.bool))
    assert torch.allclose(dim, 0.5 * x)  # about black: the background stays black
    assert bool((A.gamma(x, torch.full((n,), 0.5)) >= x - 1e-3).all())  # gamma < 1 lifts every level
    blurred = A.gaussian_blur(x, torch.full((n,), 1.5))
    assert float(blurred.std()) < float(x.std()) and abs(float(blurred.mean() - x.mean())) < 3.0
    noisy = A.gaussian_noise(x, torch.full((n,), 25.0), torch.Generator().manual_seed(0))
    assert 10.0 < float((noisy - x).std()) < 30.0
    jpg = A.jpeg(x, [20] * n)
    assert not torch.equal(jpg, x) and bool((jpg == jpg.round()).all())
    for out in (up, half, dim, blurred, noisy, jpg, A.gamma(x, torch.full((n,), 2.0))):
        assert float(out.min()) >= 0.0 and float(out.max()) <= 255.0


def test_blur_takes_a_sigma_per_image() -> None:
    x = _images(2).float()
    both = A.gaussian_blur(x, torch.tensor([0.0, 1.2]))
    assert torch.allclose(both[0], x[0], atol=1e-4)
    assert torch.allclose(both[1], A.gaussian_blur(x[1:], torch.tensor([1.2]))[0], atol=1e-4)


def test_recipe_is_seeded_uint8_and_neutral_when_every_probability_is_zero() -> None:
    x = _images(32)
    recipe = A.ImagePhotometric()
    a, b = recipe(x, torch.Generator().manual_seed(3)), recipe(x, torch.Generator().manual_seed(3))
    assert a.dtype == torch.uint8 and a.shape == x.shape and torch.equal(a, b)
    assert not torch.equal(a, recipe(x, torch.Generator().manual_seed(4)))
    changed = (a != x).flatten(1).any(1).float().mean()
    assert 0.5 < float(changed) < 1.0  # most images changed, some pass through (about 1 in 5 at the defaults)
    off = {f"{k}_prob": 0.0 for k in ("brightness", "contrast", "gamma", "blur", "noise", "jpeg")}
    assert torch.equal(A.ImagePhotometric(**off)(x, torch.Generator().manual_seed(3)), x)


def test_settings_read_json_and_refuse_what_is_not_allowed() -> None:
    r = A.ImagePhotometric.from_json('{"contrast": [0.3, 1.0], "jpeg_prob": 0.5}')
    assert r.contrast == (0.3, 1.0) and r.jpeg_prob == 0.5
    assert A.ImagePhotometric.from_json(json.dumps(r.settings())) == r  # recorded settings read back
    with pytest.raises(ValueError, match="unknown setting.*allowed"):
        A.ImagePhotometric.from_json('{"sharpness": 1}')
    with pytest.raises(ValueError, match="probability"):
        A.ImagePhotometric(blur_prob=1.5)
    with pytest.raises(ValueError, match="low <= high"):
        A.ImagePhotometric(brightness=(50.0, -50.0))
    with pytest.raises(ValueError, match="jpeg_quality"):
        A.ImagePhotometric(jpeg_quality=(0, 90))


def test_holdout_corruptions_are_fixed_and_named() -> None:
    x = _images(4)
    a, b = A.holdout_corruptions(x), A.holdout_corruptions(x)
    assert tuple(a) == A.HOLDOUT_CORRUPTIONS
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == torch.uint8 for k in a)
    assert int(a["bright60"][:, :, :2].min()) == 60


def test_image_task_applies_the_recipe_after_the_geometry() -> None:
    x, y = _images(8), torch.arange(8) % 3
    task = ImageTask(x, y, 0.0, 1.0, augment=True, shift=0)
    task.photometric = A.ImagePhotometric(brightness_prob=1.0, brightness=(60.0, 60.0), contrast_prob=0.0,
                                          gamma_prob=0.0, blur_prob=0.0, noise_prob=0.0, jpeg_prob=0.0)  # fmt: skip
    (inputs, labels), *_ = list(task.train_batches(8, torch.Generator().manual_seed(0)))
    assert float(inputs["pixel_values"][:, :, :2].min()) == pytest.approx(60 / 255)  # background lifted by 60


def test_flag_parsed_recorded_and_refused_for_text(tmp_path) -> None:
    argv = ["--model", "lara-vit-fashion", "--image-photometric", '{"noise_prob": 0.4}', "--epochs", "1"]
    args = train.parse_args(argv)
    assert train.parse_args(shlex.split(train.command_line(args))[3:]).image_photometric == args.image_photometric
    task = ImageTask(_images(2), torch.zeros(2, dtype=torch.long), 0.0, 1.0)
    settings = train._image_photometric(args, task)
    assert settings["noise_prob"] == 0.4 and settings["contrast"] == [0.4, 1.0] and task.photometric is not None
    assert train.parse_args(["--model", "lara-vit-fashion", "--image-photometric"]).image_photometric == "{}"
    with pytest.raises(SystemExit, match="image models"):
        train._image_photometric(args, object())
    bad = train.parse_args(["--model", "lara-vit-fashion", "--image-photometric", '{"blur_prob": 2}'])
    with pytest.raises(SystemExit, match="--image-photometric: blur_prob must be a probability"):
        train._image_photometric(bad, task)


def test_train_records_the_recipe_in_config_json(tmp_path, fashion_test) -> None:
    out = tmp_path / "vit"
    argv = ["--model", "lara-vit-fashion", "--override", '{"depth": 1, "dim": 16, "heads": 1, "stem_channels": 8}',
            "--limit", "64", "--eval-limit", "32", "--batch-size", "32", "--max-steps", "1", "--no-test",
            "--image-photometric", '{"jpeg_prob": 0.5}', "--out", str(out), "--run-dir", str(tmp_path / "ck")]  # fmt: skip
    train.main(argv)
    conf = json.loads((out / "config.json").read_text())
    assert conf["training"]["image_augment"]["photometric"]["jpeg_prob"] == 0.5
    assert "--image-photometric" in conf["training"]["command"]
    assert {f"val_acc_{k}" for k in A.HOLDOUT_CORRUPTIONS} <= set(conf["metrics"]["history"][-1])
    assert conf["preprocessing"]["invert_light_background"] is True  # the preparation keys survive retraining
    recipe = finalize.photometric_recipe(conf)
    assert recipe == A.ImagePhotometric(jpeg_prob=0.5)


def test_with_corrupted_appends_one_seeded_copy_per_image() -> None:
    task = ImageTask(_images(5), torch.arange(5), 0.0, 1.0, augment=False)
    recipe = A.ImagePhotometric(brightness_prob=1.0)
    a, b = finalize.with_corrupted(task, recipe, seed=2), finalize.with_corrupted(task, recipe, seed=2)
    assert len(a) == 10 and torch.equal(a.labels, torch.cat([task.labels] * 2)) and torch.equal(a.images, b.images)
    assert torch.equal(a.images[:5], task.images) and not torch.equal(a.images[5:], task.images)
    assert finalize.photometric_recipe({"training": {"image_augment": {"shift": 3}}}) is None
    with pytest.raises(ValueError, match="unknown corrupted part"):
        finalize._corrupted_recipe({"name": "m"}, ("labels",))
    with pytest.raises(ValueError, match="--image-photometric"):
        finalize._corrupted_recipe({"name": "m", "training": {}}, ("temperature",))
