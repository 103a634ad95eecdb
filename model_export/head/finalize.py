"""After training: fit the serving head (calibration temperature + out-of-distribution score), measure it, export.

python -m lara_serve.model_export.head.finalize model_repository/lara-text-news-bytes

- temperature: fitted on the holdout split's logits (lara_serve.model_export.head.calibration.fit_temperature);
- ood score: class means and shared covariance of the pooled features of training items (text: whole
  documents and their first 512 / 2,048 bytes, since heads of documents are what a head-truncating client
  sends), divided by its 95% holdout quantile, plus a penalty once an input-space score fitted on the
  training inputs (byte bigrams for text, a Gaussian per pixel for images; lara_serve.model_export.models.ood_input) exceeds
  its own 95% holdout quantile; threshold where 95% of holdout items pass (lara_serve.model_export.models.ood);
- ECE (15 bins) before and after, on the holdout and the test split, and the test split's in-distribution
  rate, written into config.json's "calibration" and "ood" sections, plus a reliability diagram;
- the weights file gains the serving head's tensors and 1/model.onnx is exported again with two outputs.
The test split is only measured, never fitted on.

--corrupted temperature ood (image models trained with --image-photometric): the temperature is fitted on the
holdout plus each holdout image once through the training recipe, and the ood fit (class means, covariance,
pixel model) on the training subset plus its copies, so pictures changed the way training changed them are
judged as in distribution and their confidence is what the model earns on them; the threshold stays at 95%
of the clean holdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from lara_serve.model_export.export.exporter import export_model_dir
from lara_serve.model_export.head.calibration import (
    ECE_BINS,
    ece_floor,
    expected_calibration_error,
    fit_temperature,
    reliability_diagram,
)
from lara_serve.model_export.models.hub import VERSION, WEIGHTS, load_config, load_pretrained
from lara_serve.model_export.models.ood import MahalanobisScore, ServingModel, penalised, pooled_features, threshold_at
from lara_serve.model_export.models.ood_input import image_input_scores, text_input_scores
from lara_serve.model_export.training.long_docs import _collate, length_groups
from lara_serve.model_export.training.tasks import load_task, text_docs

PASS_RATE = 0.95
# Image models trained with a photometric recipe: parts of the head that may also see the images once more
# through that recipe (seeded): the temperature's holdout, the ood fit's training subset (finalize --corrupted).
CORRUPTED_PARTS = ("temperature", "ood")
TEXT_HEADS = (512, 2048)  # document heads added to the ood fit, besides whole documents
IMAGE_FIT_LIMIT = 12000  # training images in the ood fit (of 58,000): the covariance is 64x64 or so


@torch.inference_mode()
def text_outputs(model: nn.Module, raws: list[bytes], batch_size: int = 8) -> tuple[Tensor, Tensor]:
    """(logits [N, C], pooled features [N, D]) of raw byte documents, in order."""
    logits: list[Tensor | None] = [None] * len(raws)
    feats: list[Tensor | None] = [None] * len(raws)
    labels = [0] * len(raws)
    for idx in length_groups(raws, batch_size):
        inputs, _ = _collate(raws, labels, idx)
        f = pooled_features(model, inputs)
        z = model(**inputs)
        for j, i in enumerate(idx):
            logits[i], feats[i] = z[j], f[j]
    return torch.stack(logits), torch.stack(feats)  # type: ignore[arg-type]


@torch.inference_mode()
def task_outputs(model: nn.Module, task: Any, batch_size: int = 256) -> tuple[Tensor, Tensor, Tensor]:
    """(logits, features, labels) over a task's evaluation batches (images)."""
    zs, fs, ys = [], [], []
    for inputs, y in task.eval_batches(batch_size):
        fs.append(pooled_features(model, inputs))
        zs.append(model(**inputs))
        ys.append(y)
    return torch.cat(zs), torch.cat(fs), torch.cat(ys)


def photometric_recipe(conf: dict[str, Any]) -> Any:
    """The ImagePhotometric a model was trained with (config.json's training notes), or None."""
    settings = ((conf.get("training") or {}).get("image_augment") or {}).get("photometric")
    if not settings:
        return None
    from lara_serve.model_export.training.augment_image import ImagePhotometric

    return ImagePhotometric.from_json(json.dumps(settings))


def with_corrupted(task: Any, recipe: Any, seed: int) -> Any:
    """The image task's items followed by each image once more through the photometric `recipe` (seeded,
    as in training: some images come through unchanged), so a fit sees pictures as users' cameras change them."""
    g = torch.Generator().manual_seed(seed)
    changed = torch.cat([recipe(task.images[i : i + 512], g) for i in range(0, len(task), 512)])
    images, labels = torch.cat([task.images, changed]), torch.cat([task.labels, task.labels])
    return dataclasses.replace(task, images=images, labels=labels, augment=False)


def _image_task(model: nn.Module, split: str, recipe: Any = None) -> Any:
    task = load_task("fashion", split, model.cfg)
    if split == "train":  # a seeded subset: the fit needs a covariance, not every image
        idx = torch.randperm(len(task), generator=torch.Generator().manual_seed(0))[:IMAGE_FIT_LIMIT]
        task = type(task)(task.images[idx], task.labels[idx], task.mean, task.std, augment=False)
    return task if recipe is None else with_corrupted(task, recipe, seed=1 if split == "train" else 2)


def split_outputs(
    model: nn.Module, dataset: str, split: str, heads: bool = False, recipe: Any = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(logits, features, labels) of a split; text documents are read whole (up to the model's max_length),
    and with heads=True also as their first TEXT_HEADS bytes. recipe (images): with_corrupted's copies too."""
    cfg = model.cfg
    if dataset == "fashion":
        return task_outputs(model, _image_task(model, split, recipe))
    texts, labels = text_docs(dataset, split)
    raws = [t.encode("utf-8")[: cfg.max_length] for t in texts]
    ys = list(labels)
    if heads:
        for n in TEXT_HEADS:
            raws += [t.encode("utf-8")[:n] for t in texts]
            ys += list(labels)
    z, f = text_outputs(model, raws)
    return z, f, torch.tensor(ys)


def split_input_scores(model: nn.Module, dataset: str, recipe: Any = None) -> tuple[nn.Module, Tensor, Tensor]:
    """The input-space score (lara_serve.model_export.models.ood_input) fitted on the training split, with its values on the
    holdout ("val") and test splits; texts read as split_outputs reads them, images as the model sees them
    (recipe: the training subset with its photometric copies)."""
    cfg = model.cfg
    if dataset == "fashion":
        train = _image_task(model, "train", recipe)
        return image_input_scores(train, load_task(dataset, "val", cfg), load_task(dataset, "test", cfg))
    raws = {
        p: [t.encode("utf-8")[: cfg.max_length] for t in text_docs(dataset, p)[0]] for p in ("train", "val", "test")
    }
    return text_input_scores(raws["train"], raws["val"], raws["test"], bool(getattr(cfg, "case_fold", False)))


Outputs = tuple[Tensor, Tensor, Tensor]  # (logits [N, C], pooled features [N, D], labels [N])


def holdout_temperature(z_val: Tensor, y_val: Tensor) -> tuple[float, str | None]:
    """The temperature fitted on the holdout, and a note when it is kept at 1: with no holdout error the NLL
    falls as T -> 0, so the fit would sharpen to its bound on no evidence."""
    temperature = fit_temperature(z_val, y_val)
    if temperature < 1.0 and bool((z_val.argmax(1) == y_val).all()):
        return 1.0, "no holdout errors: kept T = 1 (the fit would sharpen without bound)"
    return temperature, None


def calibration_section(
    z_val: Tensor, y_val: Tensor, z_test: Tensor, y_test: Tensor, temperature: float, note: str | None = None
) -> dict[str, Any]:
    """config.json's "calibration" for raw logits z (before the temperature): ECE before and after on the
    holdout and the test split, and the ECE floor of the test split's confidences."""

    def ece(z: Tensor, y: Tensor, t: float) -> float:
        return round(expected_calibration_error(torch.softmax(z.double() / t, -1), y, ECE_BINS), 4)

    return {
        "method": "temperature",
        "temperature": round(temperature, 4),
        "fitted_on": f"holdout ({len(y_val)} items)",
        "bins": ECE_BINS,
        "ece": {
            "holdout_before": ece(z_val, y_val, 1.0),
            "holdout_after": ece(z_val, y_val, temperature),
            "test_before": ece(z_test, y_test, 1.0),
            "test_after": ece(z_test, y_test, temperature),
        },
        # what a perfectly calibrated model with the same test confidences would measure (mean, 95th pct.)
        "ece_floor_test": ece_floor(torch.softmax(z_test.double() / temperature, -1).max(-1).values.numpy()),
        "n_test": len(y_test),
        **({"note": note} if note else {}),
    }


def serving_sections(
    val: Outputs,
    train: Outputs,
    test: Outputs,
    temperature: float,
    train_items: str,
    note: str | None = None,
    inputs: tuple[Tensor, Tensor] | None = None,
) -> tuple[MahalanobisScore, dict[str, Any], dict[str, Any]]:
    """The ood score fitted on training features with the threshold passing PASS_RATE of the holdout, and
    config.json's "calibration" and "ood" sections (ECE before/after on holdout and test; test pass rate).

    inputs: an input-space score's values on the holdout and test items (lara_serve.model_export.models.ood_input); the served
    score is then m / q_m + max(0, (s - q_s) / (q_s - median_s)), q the PASS_RATE quantiles on the holdout
    (ood section "scales": [q_m, q_s, median_s]): the feature score, plus a penalty once the input is less
    likely than PASS_RATE of the holdout's (the rule chosen on validation sets: research/ood_combination.py);
    the threshold is set on that combination."""
    (z_val, f_val, y_val), (_, f_train, y_train), (z_test, f_test, y_test) = val, train, test
    ood = MahalanobisScore.fit(f_train, y_train)
    m_val, m_test = ood(f_val), ood(f_test)
    scales = None
    if inputs is not None:
        s_val, s_test = inputs
        q_s, med_s = threshold_at(s_val, PASS_RATE), float(s_val.double().median())
        q_s = max(q_s, med_s + 1e-6 * max(abs(med_s), 1.0))  # a spread > 0 even for a degenerate holdout
        scales = [threshold_at(m_val, PASS_RATE), q_s, med_s]
        component_pass = {"feature": round(float((m_test <= scales[0]).double().mean()), 4),
                          "input": round(float((s_test <= q_s).double().mean()), 4)}  # fmt: skip

        def combined(m: Tensor, s: Tensor) -> Tensor:
            return penalised(m.double(), s.double(), scales[0], q_s, med_s)

        m_val, m_test = combined(m_val, s_val), combined(m_test, s_test)
    threshold = threshold_at(m_val, PASS_RATE)
    calibration = calibration_section(z_val, y_val, z_test, y_test, temperature, note)
    ood_section = {
        "method": "mahalanobis",
        "score": "squared Mahalanobis distance of the pooled features to the nearest class mean (shared covariance)",
        "fitted_on": f"training split ({len(y_train)} items{train_items})",
        "threshold": threshold,
        "holdout_pass_rate": PASS_RATE,
        "test_in_distribution_rate": round(float((m_test <= threshold).double().mean()), 4),
    }
    if scales is not None:
        ood_section["method"] = "mahalanobis / scales[0] + max(0, (input nll - scales[1]) / (scales[1] - scales[2]))"
        ood_section["score"] = (
            "the squared Mahalanobis distance of the pooled features to the nearest class mean (shared covariance) "
            "divided by its 95% holdout quantile, plus a penalty once the input's mean negative log-likelihood "
            "under a model of the training inputs (text: byte bigrams; images: a Gaussian per pixel) exceeds its "
            "95% holdout quantile, in units of that quantile's distance from the holdout median; "
            "lara_serve.model_export.models.ood_input"
        )
        ood_section["scales"] = scales  # unrounded: the graph divides by these exact values
        ood_section["test_pass_rate_by_component"] = component_pass
    return ood, calibration, ood_section


def _corrupted_recipe(conf: dict[str, Any], corrupted: tuple[str, ...]) -> Any:
    unknown = sorted(set(corrupted) - set(CORRUPTED_PARTS))
    if unknown:
        raise ValueError(f"unknown corrupted part(s) {unknown}; allowed: {list(CORRUPTED_PARTS)}")
    recipe = photometric_recipe(conf) if corrupted else None
    if corrupted and recipe is None:
        raise ValueError(f"{conf['name']}: --corrupted needs an image model trained with --image-photometric")
    return recipe


def finalize(model_dir: Path, plot_dir: Path | None = None, corrupted: tuple[str, ...] = ()) -> dict[str, Any]:
    """corrupted: CORRUPTED_PARTS whose fit also sees the images through the model's photometric recipe."""
    conf = load_config(model_dir)
    dataset = conf["data"]["dataset"]
    recipe = _corrupted_recipe(conf, corrupted)
    model = load_pretrained(model_dir)  # the trained model alone, whatever head the weights already hold
    torch.manual_seed(0)
    random.seed(0)

    val = split_outputs(model, dataset, "val")
    fit_val = split_outputs(model, dataset, "val", recipe=recipe) if "temperature" in corrupted else val
    temperature, note = holdout_temperature(fit_val[0], fit_val[2])
    ood_recipe = recipe if "ood" in corrupted else None
    train = split_outputs(model, dataset, "train", heads=True, recipe=ood_recipe)
    test = split_outputs(model, dataset, "test")
    heads = ", documents whole and first 512 / 2,048 bytes" if dataset != "fashion" else ""
    heads += ", each also once through the photometric training recipe" if ood_recipe is not None else ""
    input_score, s_val, s_test = split_input_scores(model, dataset, ood_recipe)
    ood, calibration, ood_section = serving_sections(val, train, test, temperature, heads, note, (s_val, s_test))
    if "temperature" in corrupted:
        calibration["fitted_on"] = (
            f"holdout ({len(val[2])} items) and each once through the photometric training recipe"
        )
    z_test, _, y_test = test
    serving = ServingModel.wrap(model, temperature, ood, input_score, tuple(ood_section["scales"]))
    weights = model_dir / VERSION / WEIGHTS
    state = {k: v for k, v in load_file(str(weights)).items() if not k.startswith("serving.")}
    save_file({**state, **serving.serving_state()}, str(weights), metadata={"format": "pt"})
    conf["calibration"] = calibration
    conf["ood"] = ood_section
    conf["outputs"] = [o for o in conf["outputs"] if o["name"] == "logits"] + [
        {"name": "ood_score", "datatype": "FP32", "shape": [-1]}
    ]
    (model_dir / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    export_model_dir(model_dir, max_length=conf.get("export", {}).get("max_length"))
    if plot_dir is not None:
        plot_dir.mkdir(parents=True, exist_ok=True)
        probs = torch.softmax(z_test.double() / temperature, -1)
        reliability_diagram(probs, y_test, plot_dir / f"calibration_{conf['name']}.png", title=conf["name"])
    return {"calibration": calibration, "ood": ood_section}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dirs", nargs="+", type=Path)
    p.add_argument("--plots", type=Path, default=Path("benchmarks/results"), help="where reliability diagrams go")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--corrupted",
        nargs="+",
        default=[],
        choices=CORRUPTED_PARTS,
        help="image models trained with --image-photometric: fit these parts also on the images once through that "
        "recipe (temperature: the holdout; ood: the training subset of the feature and pixel models)",
    )
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for d in args.model_dirs:
        result = finalize(d, args.plots, tuple(args.corrupted))
        print(json.dumps({"model": str(d), **result}, indent=2), flush=True)


if __name__ == "__main__":
    main()
