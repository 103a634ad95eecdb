"""The suite's outputs: the markdown tables (one short, one long) and the two charts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.robustness import stats


def _fmt(f: dict[str, Any] | None, pct: bool = True) -> str:
    if not f:
        return "-"
    k = 100 if pct else 1
    digits = 1 if pct else 3
    return f"{k * f['value']:.{digits}f} ({k * f['lo']:.{digits}f}-{k * f['hi']:.{digits}f})"


def pooled(filler: dict[str, Any], who: str, position: str | None, kb: int) -> dict[str, Any] | None:
    """One accuracy over every source's cell at (position, kb): Wilson over the summed items."""
    cells = [
        c[who] for key, c in filler.items() if key.split("/")[2] == str(kb) and position in (None, key.split("/")[1])
    ]
    if not cells:
        return None
    k = sum(round(c["value"] * c["n"]) for c in cells)
    return stats.wilson(k, sum(c["n"] for c in cells))


def _ood_worst(r: dict[str, Any], key: str) -> tuple[str, dict[str, Any]] | None:
    rows = [(name, row[key]) for name, row in r["ood"].items() if key in row and row["n"] > 1]
    return min(rows, key=lambda t: t[1]["value"]) if rows else None


def _text_rows(name: str, r: dict[str, Any]) -> list[list[str]]:
    c = r["cases"]
    rows = [
        [
            name,
            f"test split, clean (n={c['clean']['model']['n']})",
            _fmt(c["clean"]["model"]),
            _fmt(c["clean"]["anchor"]),
        ]
    ]
    if "upper" in c:
        rows.append([name, "upper-cased", _fmt(c["upper"]["model"]), _fmt(c["upper"]["anchor"])])
    if "new_source" in r:
        ns = r["new_source"]
        for key, label in (("first_2kb", "first 2 KB"), ("whole", "whole")):
            rows.append([name, f"BBC News (new source), {label}: {ns['label']}", _fmt(ns[key]["model"]),
                         _fmt(ns[key]["anchor"])])  # fmt: skip
    if not r.get("filler") and "sotu" not in r:
        return rows  # the genre model: the two rows above; its calibration and OOD rows are in the long tables
    for pos, kb in (("append", 10), (None, 20)):
        m, a = pooled(r["filler"], "model", pos, kb), pooled(r["filler"], "anchor", pos, kb)
        if m:
            where = f"{pos}ed" if pos else "any position"
            rows.append([name, f"+{kb} KB filler, {where} (all sources)", _fmt(m), _fmt(a)])
    if "sotu" in r:
        s = r["sotu"]
        for key, label in (("first_2kb", "first 2 KB"), ("whole", "whole (64 KB head)")):
            rows.append([name, f"State of the Union, {label}: politics", _fmt(s[key]["model"]), _fmt(s[key]["anchor"])])
    rows += _summary_rows(name, r)
    return rows


def _summary_rows(name: str, r: dict[str, Any]) -> list[list[str]]:
    cal = r["calibration"]
    rows = [[name, "ECE, clean test (15 bins)", _fmt(cal["model_ece"]), _fmt(cal["anchor_ece"])]]
    key = "model_auroc_ood" if r["has_ood_score"] else "model_auroc_msp"
    worst, worst_a = _ood_worst(r, key), _ood_worst(r, "anchor_auroc_msp")
    if worst:
        score = "ood_score" if r["has_ood_score"] else "1 - top prob"
        rows.append([name, f"worst OOD AUROC ({score}; model: {worst[0]}, anchor: {worst_a[0] if worst_a else '-'})",
                     _fmt(worst[1], pct=False), _fmt(worst_a[1], pct=False) if worst_a else "-"])  # fmt: skip
    return rows


def _image_rows(name: str, r: dict[str, Any]) -> list[list[str]]:
    c = r["cases"]
    rows = [[name, f"t10k clean (n={c['clean']['model']['n']})", _fmt(c["clean"]["model"]), _fmt(c["clean"]["anchor"])]]
    for key, label in (("shift_3px", "shifted 3 px"), ("rotate_15deg", "rotated 15 degrees"),
                       ("contrast_x0.5", "contrast x0.5"), ("brightness_+60", "brightness +60"),
                       ("blur_sigma1.2", "blur sigma 1.2"), ("gaussian_noise", "gaussian noise sigma 25")):  # fmt: skip
        if key in c:  # results written before the photometric cases lack them
            rows.append([name, label, _fmt(c[key]["model"]), _fmt(c[key]["anchor"])])
    return rows + _summary_rows(name, r)[1:]  # ECE in the long tables


def _honesty_table(r: dict[str, Any]) -> str | None:
    """Per image case: ECE, and the share of wrong answers passing as sure ones (model: also in distribution)."""
    rows = [
        [k, f"{100 * v['model_ece']:.1f}", f"{100 * v['anchor_ece']:.1f}", _fmt(v["model_passed_wrong"]),
         _fmt(v["anchor_passed_wrong"]), _fmt(v.get("model_in_distribution"))]
        for k, v in r["cases"].items() if "model_ece" in v
    ]  # fmt: skip
    if not rows:
        return None
    anchor = r["anchor"]["name"]
    heads = ["case", "ECE model %", f"ECE {anchor} %", "wrong passing as sure, model %", f"... {anchor} %",
             "in distribution %"]  # fmt: skip
    return _table(rows, heads)


def _table(rows: list[list[str]], headers: list[str]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def short_table(results: dict[str, Any]) -> str:
    rows: list[list[str]] = []
    for name, r in results["models"].items():
        rows += _text_rows(name, r) if r["kind"] == "text" else _image_rows(name, r)
    return _table(rows, ["model", "case", "model (95% CI)", "anchor (95% CI)"])


def long_tables(results: dict[str, Any]) -> str:
    out = []
    for name, r in results["models"].items():
        anchor = r["anchor"]["name"]
        rows = [[k, str(v["model"]["n"]), _fmt(v["model"]), _fmt(v["anchor"])] for k, v in r["cases"].items()]
        rows += [
            [f"filler {k} KB", str(v["model"]["n"]), _fmt(v["model"]), _fmt(v["anchor"])]
            for k, v in r.get("filler", {}).items()
        ]
        for k, v in r.get("sotu", {}).items():
            if isinstance(v, dict):
                rows.append([f"sotu {k} (politics)", str(v["model"]["n"]), _fmt(v["model"]), _fmt(v["anchor"])])
        ns = r.get("new_source", {})
        for k in ("first_2kb", "whole"):
            if k in ns:
                v = ns[k]
                rows.append(
                    [f"BBC News {k} ({ns['label']})", str(v["model"]["n"]), _fmt(v["model"]), _fmt(v["anchor"])]
                )
        out.append(f"### {name} (anchor: {anchor})\n\n" + _table(rows, ["case", "n", "model %", f"{anchor} %"]))
        honesty = _honesty_table(r) if r["kind"] == "image" else None
        if honesty:  # wrong passing as sure: top probability >= 0.9 and (model) ood_score within the threshold
            out.append(honesty)
        ood = dict(r["ood"])
        if "ood" in ns:  # shown for what the ood score does with it; not an out-of-domain set (worst AUROC skips it)
            ood[f"BBC News ({ns['label']} from a new source; not counted)"] = ns["ood"]
        ood_rows = []
        for k, v in ood.items():
            ood_rows.append([k, str(v["n"]), _fmt(v.get("model_auroc_ood"), False), _fmt(v["model_auroc_msp"], False),
                             _fmt(v["anchor_auroc_msp"], False), _fmt(v.get("flagged_out")),
                             f"{v['model_mean_top_prob']:.2f} / {v['anchor_mean_top_prob']:.2f}"])  # fmt: skip
        out.append(_table(ood_rows, ["OOD set", "n", "AUROC ood_score", "AUROC 1-top prob", f"{anchor} AUROC 1-top prob",
                                     "flagged out %", "mean top prob model / anchor"]))  # fmt: skip
        cal = r["calibration"]
        line = f"ECE (15 bins, clean test): model {_fmt(cal['model_ece'])}%, {anchor} {_fmt(cal['anchor_ece'])}%"
        if "test_in_distribution" in cal:
            line += f"; clean test items in distribution {_fmt(cal['test_in_distribution'])}%"
        out.append(line)
    return "\n\n".join(out)


def markdown(results: dict[str, Any]) -> str:
    return (
        "# Robustness suite (`python -m benchmarks.robustness`)\n\n"
        + "".join(f"Command: `{c}`  \n" for c in results.get("parts", [results["command"]]))
        + f"Run: {results['environment']['time']}, {results['wall_s']:.0f} s"
        + (f" (the sum of {len(results['parts'])} runs made in parallel). " if "parts" in results else ". ")
        + "Accuracies and ECE in %, accuracies with 95% Wilson intervals; AUROC with Hanley-McNeil intervals; ECE with a bootstrap "
        "interval. What each case means: docs/robustness.md.\n\n## Summary\n\n"
        + short_table(results)
        + "\n\n## All cases\n\n"
        + long_tables(results)
        + "\n"
    )


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def filler_chart(results: dict[str, Any], path: Path) -> bool:
    """Accuracy against filler KB: one panel per (text model, source), a colour per position, model solid,
    anchor dashed; KB 0 is the same documents without filler."""
    panels = [(n, r) for n, r in results["models"].items() if r.get("filler")]
    if not panels:
        return False
    plt = _plt()
    srcs = sorted({k.split("/")[0] for _, r in panels for k in r["filler"]})
    fig, axes = plt.subplots(len(panels), len(srcs), figsize=(3.2 * len(srcs), 3 * len(panels)), squeeze=False)
    colours = {"append": "tab:blue", "prepend": "tab:orange", "interleave": "tab:green"}
    markers = {"append": "o", "prepend": "s", "interleave": "^"}
    for row, (name, r) in enumerate(panels):
        for col, src in enumerate(srcs):
            ax = axes[row][col]
            for pos, colour in colours.items():
                keys = sorted((int(k.split("/")[2]), k) for k in r["filler"] if k.startswith(f"{src}/{pos}/"))
                if not keys:
                    continue
                # positions often score alike: a small sideways offset and a marker each keep every line visible
                dx = 0.015 * max(kb for kb, _ in keys) * (list(colours).index(pos) - 1)
                for who, style in (("model", "-"), ("anchor", "--")):
                    xs = [dx] + [kb + dx for kb, _ in keys]
                    ys = [100 * r["filler_clean"][who]["value"]] + [100 * r["filler"][k][who]["value"] for _, k in keys]
                    ax.plot(xs, ys, style, color=colour, marker=markers[pos], ms=4, label=f"{who} {pos}")
            ax.set_title(f"{name}: {src}", fontsize=9)
            ax.set_ylim(0, 102)
            ax.grid(alpha=0.3)
            ax.set_xlabel("filler (KB)")
            if col == 0:
                ax.set_ylabel("accuracy (%)")
    axes[0][0].legend(fontsize=6, loc="lower left")
    fig.suptitle("accuracy vs filler: model (solid) vs anchor (dashed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def calibration_chart(results: dict[str, Any], path: Path) -> None:
    """Reliability diagrams (accuracy per confidence bin) of every model and its anchor on the clean test."""
    plt = _plt()
    models = list(results["models"].items())
    fig, axes = plt.subplots(len(models), 2, figsize=(7, 3.2 * len(models)), squeeze=False)
    for row, (name, r) in enumerate(models):
        for col, who in enumerate(("model", "anchor")):
            ax = axes[row][col]
            bins = r["calibration"][f"{who}_bins"]
            mids = [(b["lo"] + b["hi"]) / 2 for b in bins]
            ax.bar(mids, [b["accuracy"] or 0 for b in bins], width=1 / len(bins), edgecolor="black")
            ax.plot([0, 1], [0, 1], "k--", lw=1)
            e = r["calibration"][f"{who}_ece"]
            label = name if who == "model" else r["anchor"]["name"]
            ax.set_title(f"{label}: ECE {100 * e['value']:.1f}% (n={e['n']})", fontsize=9)
            ax.set_xlabel("confidence")
            ax.set_ylabel("accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
