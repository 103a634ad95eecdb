"""The report of a `lara train` run: metrics from predicted probabilities, PNG charts, report.json and report.md.

Metrics are computed from (probabilities [N, C], gold labels [N]) only, so the LARA model and the plain
baseline are measured by the same code on the same test examples.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lara_serve.model_export.head.calibration import calibration_bins, expected_calibration_error

LENGTH_BINS = (0, 1024, 4096, 16384, 65536)  # bytes: accuracy vs document length (text)


def reliability(probs: np.ndarray, labels: np.ndarray) -> list[dict[str, Any]]:
    """The non-empty confidence bins (lara_serve.model_export.head.calibration.calibration_bins)."""
    return [b for b in calibration_bins(probs, labels) if b["n"]]


def classification_metrics(probs: np.ndarray, labels: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class precision/recall/F1/support, confusion[true][predicted], ECE."""
    k = len(names)
    pred = probs.argmax(1)
    confusion = np.bincount(labels * k + pred, minlength=k * k).reshape(k, k)
    per_class, f1s = {}, []
    for i, name in enumerate(names):
        tp, predicted, support = confusion[i, i], confusion[:, i].sum(), confusion[i].sum()
        p = tp / predicted if predicted else 0.0
        r = tp / support if support else 0.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        per_class[name] = {"precision": round(float(p), 4), "recall": round(float(r), 4),
                           "f1": round(float(f1), 4), "support": int(support)}  # fmt: skip
        if support:
            f1s.append(f1)
    return {
        "n": len(labels),
        "accuracy": round(float((pred == labels).mean()), 4),
        "macro_f1": round(float(np.mean(f1s)), 4),
        "ece": round(expected_calibration_error(probs, labels), 4),
        "per_class": per_class,
        "confusion": confusion.tolist(),
    }


def accuracy_by_length(probs: np.ndarray, labels: np.ndarray, lengths: Sequence[int]) -> list[dict[str, Any]]:
    """Accuracy per document-length bin (bytes), bins with at least one document."""
    lengths_a = np.asarray(lengths)
    hit = probs.argmax(1) == labels
    edges = [*LENGTH_BINS, np.inf]
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = (lengths_a >= lo) & (lengths_a < hi)
        if sel.any():
            rows.append({"min_bytes": int(lo), "max_bytes": None if hi == np.inf else int(hi),
                         "n": int(sel.sum()), "accuracy": round(float(hit[sel].mean()), 4)})  # fmt: skip
    return rows


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


# -- charts --------------------------------------------------------------------------------------------


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    return plt


def write_charts(out: Path, report: dict[str, Any], names: Sequence[str]) -> list[str]:
    """PNGs beside report.md; returns their file names."""
    plt = _figure()
    files = []
    lara = report["lara"]

    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * len(names), 1.0 + 0.5 * len(names)))
    conf = np.asarray(lara["confusion"])
    ax.imshow(conf, cmap="Blues")
    for (i, j), v in np.ndenumerate(conf):
        ax.text(j, i, str(v), ha="center", va="center", color="white" if v > conf.max() / 2 else "black")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("confusion (test)")
    files.append(_save(plt, fig, out / "confusion.png"))

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    for key, style in (("reliability_uncalibrated", "o--"), ("reliability", "o-")):
        rows = report["calibration"][key]
        label = "after temperature" if key == "reliability" else "before"
        ax.plot([r["confidence"] for r in rows], [r["accuracy"] for r in rows], style, label=label)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title(f"reliability (test), ECE {lara['ece']:.3f}")
    ax.legend()
    files.append(_save(plt, fig, out / "reliability.png"))

    hist = report["training"]["history"]
    if hist:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        x = [h["epoch"] for h in hist]
        ax.plot(x, [h["train_loss"] for h in hist], "o-", label="train loss")
        ax.plot(x, [h["train_acc"] for h in hist], "s-", label="train accuracy")
        ax.plot(x, [h["holdout_acc"] for h in hist], "^-", label="holdout accuracy")
        ax.set_xlabel("epoch")
        ax.legend()
        ax.set_title("training curves")
        files.append(_save(plt, fig, out / "training.png"))

    if report.get("accuracy_by_length"):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key in ("lara", "baseline"):
            rows = report["accuracy_by_length"].get(key) or []
            ax.plot([_bin_label(r) for r in rows], [r["accuracy"] for r in rows], "o-", label=key)
        ax.set_xlabel("document length (bytes)")
        ax.set_ylabel("test accuracy")
        ax.legend()
        files.append(_save(plt, fig, out / "accuracy_by_length.png"))
    return files


def _bin_label(row: dict[str, Any]) -> str:
    def kb(n: int) -> str:
        return f"{n // 1024}K" if n >= 1024 else str(n)

    return f">={kb(row['min_bytes'])}" if row["max_bytes"] is None else f"{kb(row['min_bytes'])}-{kb(row['max_bytes'])}"


def _save(plt: Any, fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


# -- report.md -----------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


_PART_NAMES = {"blend": "blend", "wide": "wide path alone", "encoder": "encoder alone"}
_CLOCKS = {"wall": "wall-clock", "cpu": "of CPU time (--clock cpu)"}


def write_report(out: Path, report: dict[str, Any], names: Sequence[str]) -> None:
    """report.json (everything) and report.md (a person's view, with the charts)."""
    charts = write_charts(out, report, names)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    lara, base, cal = report["lara"], report.get("baseline"), report["calibration"]
    lines = [
        f"# {report['name']}: {report['task']} classifier trained on {report['data']}",
        "",
        f"Test set: {lara['n']} examples ({report['split']['how']}). Training: {report['training']['epochs']:g} "
        f"epochs, {report['training']['train_time_s']:.0f} s {_CLOCKS[report['training'].get('clock', 'wall')]}.",
        "",
        "| model | accuracy | macro-F1 | ECE |",
        "|---|---|---|---|",
        f"| LARA ({report['model']}) | {lara['accuracy']:.4f} | {lara['macro_f1']:.4f} | {lara['ece']:.4f} |",
    ]
    rec, phases = report["training"].get("recipe"), report["training"].get("phases_s")
    if base is not None:
        lines.append(
            f"| baseline: {base['name']} | {base['accuracy']:.4f} | {base['macro_f1']:.4f} | {base['ece']:.4f} |"
        )
    parts = report.get("parts")
    if parts:
        blend, enc, wide = parts["blend"], parts["encoder"], parts["wide"]
        served = parts.get("served") or {"part": "blend", "encoder_weight": blend["encoder"],
                                         "wide_weight": blend["wide"], "why": "the blend"}  # fmt: skip
        lines += [
            "",
            f"Served: the {_PART_NAMES.get(served['part'], served['part'])} ({served['why']}): LARA's logits are {served['encoder_weight']:g} x the "
            f"encoder's + {served['wide_weight']:g} x the wide path's ({wide.get('grams', 'word 1-2-grams')}, hashed "
            f"tf-idf, logistic regression). The blend's weights ({blend['encoder']:g}, {blend['wide']:g}) minimize the holdout NLL.",
            "",
            "| part | holdout accuracy | test accuracy |",
            "|---|---|---|",
            *(
                f"| {label}{' (served)' if key == served['part'] else ''} | {_pct(p.get('holdout_accuracy'))} | "
                f"{_pct(p.get('test_accuracy'))} |"
                for key, label, p in (
                    ("blend", "blend", blend),
                    ("wide", "wide path", wide),
                    ("encoder", "encoder", enc),
                )
            ),  # fmt: skip
        ]
    if rec:
        lines += [
            "",
            f"Recipe: {rec['recipe']} (median training document {rec['median_bytes']:,.0f} bytes; {rec['rule']}).",
        ]
    if phases:
        budget = report["training"].get("time_budget_s")
        lines += ["", f"Time by phase, s {_CLOCKS[report['training'].get('clock', 'wall')]}: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in phases.items())
                  + (f" (budget {budget:.0f} s for the whole run)" if budget else "") + "."]  # fmt: skip
    lines += [
        "",
        f"Calibration: temperature {cal['temperature']:.3f} fitted on the holdout, part of the served graph; "
        f"test ECE {cal['ece']['test_before']:.4f} before, {cal['ece']['test_after']:.4f} after"
        + (f" ({cal['note']})" if cal.get("note") else "")
        + (
            f". Fitted on {report['split']['holdout']} holdout items: below about 100 the temperature and the ood "
            "threshold are rough."
            if report["split"]["holdout"] < 100
            else "."
        ),
        "",
        f"Out of distribution: each prediction carries an ood_score (Mahalanobis distance of the pooled features); "
        f"`in_distribution` is true below {report['ood']['threshold']:.4g}, which 95% of the holdout passes "
        f"({100 * report['ood']['test_in_distribution_rate']:.1f}% of the test set).",
        "",
        "| class | precision | recall | F1 | support |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {c['precision']:.3f} | {c['recall']:.3f} | {c['f1']:.3f} | {c['support']} |"
              for n, c in lara["per_class"].items()]  # fmt: skip
    if report.get("accuracy_by_length"):
        lines += ["", "| length (bytes) | n | LARA | baseline |", "|---|---|---|---|"]
        base_rows = {r["min_bytes"]: r for r in report["accuracy_by_length"].get("baseline") or []}
        for r in report["accuracy_by_length"]["lara"]:
            b = base_rows.get(r["min_bytes"])
            lines.append(f"| {_bin_label(r)} | {r['n']} | {r['accuracy']:.3f} | {b['accuracy'] if b else '-'} |")
    lines += [""] + [f"![{c}]({c})" for c in charts]
    (out / "report.md").write_text("\n".join(lines) + "\n")
