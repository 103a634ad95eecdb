"""After training: fit the serving head (calibration temperature + out-of-distribution score), measure it, export.

python -m lara_serve.model_export.head.finalize model_repository/lara-text-news

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
"""

from __future__ import annotations

import argparse
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
from lara_serve.model_export.models.ood import MahalanobisScore, ServingModel, pooled_features, threshold_at
from lara_serve.model_export.models.ood_input import image_input_scores, text_input_scores
from lara_serve.model_export.training.long_docs import _collate, length_groups
from lara_serve.model_export.training.tasks import load_task, text_docs

PASS_RATE = 0.95
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


def split_outputs(model: nn.Module, dataset: str, split: str, heads: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """(logits, features, labels) of a split; text documents are read whole (up to the model's max_length),
    and with heads=True also as their first TEXT_HEADS bytes."""
    cfg = model.cfg
    if dataset == "fashion":
        task = load_task(dataset, split, cfg)
        if split == "train":  # a seeded subset: the fit needs a covariance, not every image
            idx = torch.randperm(len(task), generator=torch.Generator().manual_seed(0))[:IMAGE_FIT_LIMIT]
            task = type(task)(task.images[idx], task.labels[idx], task.mean, task.std, augment=False)
        return task_outputs(model, task)
    texts, labels = text_docs(dataset, split)
    raws = [t.encode("utf-8")[: cfg.max_length] for t in texts]
    ys = list(labels)
    if heads:
        for n in TEXT_HEADS:
            raws += [t.encode("utf-8")[:n] for t in texts]
            ys += list(labels)
    z, f = text_outputs(model, raws)
    return z, f, torch.tensor(ys)


def split_input_scores(model: nn.Module, dataset: str) -> tuple[nn.Module, Tensor, Tensor]:
    """The input-space score (lara_serve.model_export.models.ood_input) fitted on the training split, with its values on the
    holdout ("val") and test splits; texts read as split_outputs reads them, images as the model sees them."""
    cfg = model.cfg
    if dataset == "fashion":
        train = load_task(dataset, "train", cfg)
        idx = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:IMAGE_FIT_LIMIT]
        train = type(train)(train.images[idx], train.labels[idx], train.mean, train.std, augment=False)
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
            return m.double() / scales[0] + torch.relu((s.double() - q_s) / (q_s - med_s))

        m_val, m_test = combined(m_val, s_val), combined(m_test, s_test)
    threshold = threshold_at(m_val, PASS_RATE)

    def ece(z: Tensor, y: Tensor, t: float) -> float:
        return round(expected_calibration_error(torch.softmax(z.double() / t, -1), y, ECE_BINS), 4)

    calibration = {
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


def finalize(model_dir: Path, plot_dir: Path | None = None) -> dict[str, Any]:
    conf = load_config(model_dir)
    dataset = conf["data"]["dataset"]
    model = load_pretrained(model_dir)  # the trained model alone, whatever head the weights already hold
    torch.manual_seed(0)
    random.seed(0)

    val = split_outputs(model, dataset, "val")
    temperature, note = holdout_temperature(val[0], val[2])
    train = split_outputs(model, dataset, "train", heads=True)
    test = split_outputs(model, dataset, "test")
    heads = ", documents whole and first 512 / 2,048 bytes" if dataset != "fashion" else ""
    input_score, s_val, s_test = split_input_scores(model, dataset)
    ood, calibration, ood_section = serving_sections(val, train, test, temperature, heads, note, (s_val, s_test))
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
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for d in args.model_dirs:
        print(json.dumps({"model": str(d), **finalize(d, args.plots)}, indent=2), flush=True)


if __name__ == "__main__":
    main()
