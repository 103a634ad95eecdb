"""Issue 53: would the outlier probe, asked about each 510-piece window, keep English non-news prose out of the pool?

The served `lara-text-news` reads a long text in windows and pools all windows' pieces with one learned
score per piece. Documentation prose around an article still pulls it (robustness suite, 20 KB: 70-75% right).
The serving head's outlier probe (models.ood.OutlierProbe) already tells English non-news prose from news on a
document's mean vector. Here it is asked about each window's mean instead, and every piece of window j gets
gate x log sigmoid(-g_j) added to its pool score (g_j the probe's logit: high for non-news). A text of one
window is unchanged (softmax does not see a constant), so the gate can only move multi-window texts.

Read on the build's holdout only (sha256 rule; 60 articles), with filler from the probe's *selection* sources
(English manual pages, Brown belles-lettres and government documents: never its training text, never the
robustness suite's /usr/share/doc prose), 10 and 20 KB before or after; and the holdout read clean, whole.
Float graph (PyTorch), one thread.

    python -m research.minilm_window_gate [--docs 60] [--gates none sigmoid:8 hinge:4 ...]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from lara_serve.model_export.models.bert import mean_pool
from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.pretrained.classifier import in_holdout, with_forms
from lara_serve.model_export.pretrained.outlier_probe import brown_texts
from lara_serve.model_export.pretrained.robust_head import english_man_pages
from lara_serve.model_export.pretrained.teacher import WordPieces
from lara_serve.model_export.pretrained.topic_sources import topic_items
from lara_serve.model_export.training.data import load_news

MODEL = Path("model_repository/lara-text-news")
OUT = Path(__file__).parent / "results" / "minilm_window_gate.json"


@torch.inference_mode()
def logits_by_gate(serving: torch.nn.Module, tok: WordPieces, text: str, gates: list[str]) -> dict[str, int]:
    """The head's label for each gate ("none": the served pool; "sigmoid:S": S x log sigmoid(-g_j); "hinge:S":
    -S x max(0, (g_j - q) / (q - median)), q and median the probe's holdout quantile and median as the served
    ood score uses them: windows that look like the training data all keep their weight; "doc:S": sigmoid's,
    times sigmoid(g_doc) of the whole text, so a text that as a whole looks like news is read as the pool reads
    it, whatever one of its windows looks like)."""
    model, probe = serving.model, serving.probe
    ids = torch.tensor([tok.encode(text, model.cfg.max_length)])
    mask = torch.ones_like(ids)
    x = model.forward_features(ids, mask)  # [1, J*(W+2), D]
    rows = model.read_mask(mask)  # [1, J*(W+2)]
    per = min(model.cfg.window + 2, x.shape[1])  # a text within one window is read at its own length
    j = x.shape[1] // per
    xw, rw = x.reshape(j, per, -1), rows.reshape(j, per)
    live = rw.sum(1) > 0
    g = probe(mean_pool(xw, rw))  # [J] the probe's logit of each window's unit mean
    s = model.pool.score(x).squeeze(-1)[0]  # [J*(W+2)] the pool's own score
    g_doc = probe(mean_pool(x, rows))[0]  # the probe's logit of the whole text's unit mean (the ood score's)
    q, med = float(serving.probe_scales[1]), float(serving.probe_scales[2])
    out = {}
    for gate in gates:
        kind, _, strength = gate.partition(":")
        if kind == "none":
            raw = torch.zeros_like(g)
        elif kind == "sigmoid":
            raw = float(strength) * F.logsigmoid(-g)
        elif kind == "doc":  # the same, scaled by how unlike the training data the whole text looks
            raw = float(strength) * torch.sigmoid(g_doc) * F.logsigmoid(-g)
        else:
            raw = -float(strength) * torch.relu((g - q) / (q - med))
        bias = raw.where(live, torch.zeros_like(g)).repeat_interleave(per)
        t = (s + bias).masked_fill(rows[0] == 0, torch.finfo(s.dtype).min)
        w = torch.softmax(t, -1)
        read = F.normalize(w @ x[0], dim=-1)
        out[gate] = int(model.head(read[None]).argmax())
    return out


def cut(texts: list[str], n: int, rng: random.Random) -> str:
    parts, size = [], 0
    while size < n:
        parts.append(texts[rng.randrange(len(texts))])
        size += len(parts[-1]) + 1
    start = rng.randrange(max(1, size - n))
    return "\n".join(parts)[start : start + n]


def holdout_cases(docs: int) -> Iterator[tuple[str, str, int]]:
    """(case, text, label) in a fixed order and draw: `docs` holdout articles read clean and with 10 and 20 KB of
    the selection sources before or after; then every holdout article once in a long form (web page, e-mail,
    JSON, Markdown, a table after it: the build's holdout forms, classifier.with_forms with its seed), where a
    wrapper's windows must not outvote the article; then the holdout side of the build's other sources of two
    topics (State of the Union addresses, Python package descriptions)."""
    every = [d for d in load_news("train") if in_holdout(d.text)]
    picked = every[:: max(1, len(every) // docs)][:docs]
    sources = {"man pages": list(english_man_pages(200)), "brown belles-lettres": brown_texts("g"),
               "brown government": brown_texts("h")}  # fmt: skip
    rng = random.Random(0)
    for i, d in enumerate(picked):
        yield "clean", d.text, d.label
        for kb in (10, 20):
            name = list(sources)[(i + kb) % len(sources)]
            filler = cut(sources[name], kb * 1024, rng)
            text = filler + "\n\n" + d.text if rng.random() < 0.5 else d.text + "\n\n" + filler
            yield f"+{kb} KB", text, d.label
    texts, labels, forms = with_forms([d.text for d in every], [d.label for d in every], 1)
    for text, label, form in zip(texts, labels, forms, strict=True):
        if form not in ("whole", "headline", "lead"):
            yield f"form {form}", text, label
    for item in topic_items(0):  # the build's other sources of two topics, holdout side (since 2026-12-06)
        if in_holdout(item.key):
            yield f"topic {item.source}", item.text, item.label


def tally(predict: Callable[[str], dict[str, int]], docs: int) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """predict(text) -> {gate: label} over holdout_cases -> (right answers per case and gate, items per case)."""
    right: dict[str, dict[str, int]] = {}
    counts: dict[str, int] = {}
    for case, text, label in tqdm(holdout_cases(docs), desc="holdout cases", unit="text"):
        got = predict(text)
        row = right.setdefault(case, dict.fromkeys(got, 0))
        for gate, pred in got.items():
            row[gate] += int(pred == label)
        counts[case] = counts.get(case, 0) + 1
    return right, counts


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=60)
    ap.add_argument(
        "--gates",
        nargs="+",
        default=[
            "none",
            "sigmoid:2",
            "sigmoid:8",
            "hinge:1",
            "hinge:4",
            "hinge:16",
            "doc:4",
            "doc:8",
            "doc:16",
            "doc:32",
        ],
    )
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    serving, tok = load_pretrained(MODEL, serving=True).eval(), WordPieces.from_dir(MODEL)
    right, counts = tally(lambda text: logits_by_gate(serving, tok, text, args.gates), args.docs)
    result = {
        "command": "python -m research.minilm_window_gate",
        "model": str(MODEL),
        "n": counts,
        "accuracy": {c: {g: round(r / counts[c], 4) for g, r in row.items()} for c, row in right.items()},
        "seconds": round(time.time() - t0, 1),
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["accuracy"], indent=1))
    return result


if __name__ == "__main__":
    main()
