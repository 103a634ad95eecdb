"""The text half of the suite: one shipped text model beside its TF-IDF anchor.

Cases (accuracy, model and anchor on the same bytes): clean test split; case, whitespace, markup and typo
variants; filler of each size from each evaluation source appended, prepended and interleaved; a new source of
a known class: for the news model, State of the Union addresses (label politics) read to growing lengths; for
the genre model, BBC News articles (label press: Brown's press reportage from another country and decade),
first 2 KB and whole. Out-of-domain sets against the clean test items: AUROC of ood_score (when the graph has
it) and of 1 - max probability (every model and the anchor), and the share the model flags out of
distribution. BBC News is not among them for the genre model: it is its press class from a new source (its
ood figures are kept beside the new-source accuracy).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.robustness import perturb, sources, stats
from benchmarks.robustness.runners import OnnxText, Outputs, TfidfAnchor, calibration_row, ood_row

SOTU_LENGTHS_KB = (1, 2, 4, 16)
Log = Callable[[str], None]


@dataclass(frozen=True)
class TextSettings:
    limit: int | None = None  # the clean test split, a seeded slice of it
    docs: int | None = None  # documents for the case/whitespace/markup/typo variants (None: all)
    filler_docs: int = 100
    filler_sources: tuple[str, ...] = sources.FILLER_SOURCES
    filler_kb: tuple[int, ...] = (1, 2, 5, 10, 20)
    positions: tuple[str, ...] = perturb.POSITIONS
    variants: tuple[str, ...] = perturb.TEXT_VARIANTS
    ood_items: int = 100
    sotu: int = 40  # the latest N addresses; 0 skips
    new_source: int = 60  # genre model: BBC News test articles as press; 0 skips
    seed: int = 0


def _dataset(model: OnnxText) -> str:
    return str(model.config["data"]["dataset"])


def _test_docs(dataset: str, limit: int | None, seed: int) -> tuple[list[bytes], list[int]]:
    """The test split in a seeded order (every class in any prefix, about in proportion), cut to `limit`."""
    from lara_serve.model_export.training.tasks import text_docs

    texts, labels = text_docs(dataset, "test")
    order = list(range(len(texts)))
    random.Random(f"robustness:{seed}").shuffle(order)
    order = order[:limit] if limit else order
    return [texts[i].encode("utf-8") for i in order], [labels[i] for i in order]


def _case(model_out: Outputs, anchor_out: Outputs, labels: list[int]) -> dict[str, Any]:
    y = np.asarray(labels)
    return {"model": stats.accuracy(model_out.pred, y), "anchor": stats.accuracy(anchor_out.pred, y)}


def _take(out: Outputs, n: int) -> Outputs:
    return Outputs(out.probs[:n], None if out.ood is None else out.ood[:n])


def _ood_sets(dataset: str, lengths: list[int], n: int, seed: int) -> dict[str, list[bytes]]:
    """Out-of-domain items whose lengths are drawn from the in-distribution test lengths (so length alone
    cannot tell them apart), plus the one-letter document "a"."""
    rng = random.Random(f"ood:{seed}")
    sizes = [rng.choice(lengths) for _ in range(n)]
    sets = {name: [sources.sampler(name)(random.Random(f"ood:{name}:{seed}:{i}"), k) for i, k in enumerate(sizes)]
            for name in sources.OOD_TEXT_SOURCES}  # fmt: skip
    if dataset == "news":  # text of another kind: Brown fiction, head cut to a news-like length
        from lara_serve.model_export.training.brown import load_brown

        fiction = [d.text.encode("utf-8") for s in ("train", "test") for d in load_brown(s) if d.label == 3]
        sets["brown_fiction"] = [fiction[i % len(fiction)][:k] for i, k in enumerate(sizes)]
    sets["a"] = [b"a"]
    return sets


def _ood(model: OnnxText, anchor: TfidfAnchor, clean_m: Outputs, clean_a: Outputs, sets: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raws in sets.items():
        m, a = model(raws), anchor(raws, model.max_length)
        row = ood_row(m, a, clean_m, clean_a, model.threshold)
        if name == "a":
            labels = model.config["labels"]
            row["model_answer"] = {"label": labels[int(m.pred[0])], "prob": round(float(m.probs.max()), 4)}
            if m.ood is not None:
                row["model_answer"]["ood_score"] = round(float(m.ood[0]), 4)
        out[name] = row
    return out


def _filler(
    model: OnnxText, anchor: TfidfAnchor, raws: list[bytes], labels: list[int], s: TextSettings, log: Log
) -> dict:
    out: dict[str, Any] = {}
    for src in s.filler_sources:
        draw = sources.sampler(src)
        for kb in s.filler_kb:
            # the same filler for a document at every position, so positions compare on equal text
            fills = [draw(random.Random(f"filler:{src}:{kb}:{s.seed}:{i}"), kb * 1024) for i in range(len(raws))]
            for pos in s.positions:
                docs = [perturb.place_filler(r, f, pos) for r, f in zip(raws, fills, strict=True)]
                out[f"{src}/{pos}/{kb}"] = _case(model(docs), anchor(docs, model.max_length), labels)
            log(
                f"  filler {src} {kb} KB: "
                + ", ".join(f"{p} {out[f'{src}/{p}/{kb}']['model']['value']:.3f}" for p in s.positions)
            )
    return out


def _sotu(model: OnnxText, anchor: TfidfAnchor, s: TextSettings) -> dict[str, Any]:
    speeches = sources.load_sotu(latest=s.sotu)
    raws = [sp["text"].encode("utf-8") for sp in speeches]
    label = model.config["labels"].index("politics")
    y = [label] * len(raws)
    out: dict[str, Any] = {
        "speeches": f"{len(raws)} latest ({speeches[0]['year']}-{speeches[-1]['year']})",
        "median_kb": round(float(np.median([len(r) for r in raws])) / 1024, 1),
    }
    for kb in SOTU_LENGTHS_KB:
        cut = [r[: kb * 1024] for r in raws]
        out[f"first_{kb}kb"] = _case(model(cut), anchor(cut, model.max_length), y)
    out["whole"] = _case(model(raws), anchor(raws, model.max_length), y)  # both read the first max_length bytes
    return out


def _bbc_as_press(
    model: OnnxText, anchor: TfidfAnchor, clean: tuple[Outputs, Outputs], s: TextSettings
) -> dict[str, Any]:
    """The genre model on BBC News test articles, each one's true genre press (loaded from the installed
    package at run time, never stored): accuracy on the first 2 KB and whole, and how much of it the model's
    ood score flags (not counted as out-of-domain: a new source of a known class should be answered)."""
    from lara_serve.model_export.training.data import load_news

    news = [d.text.encode("utf-8") for d in load_news("test")]
    raws = random.Random(f"newsource:bbc:{s.seed}").sample(news, min(s.new_source, len(news)))
    y = [model.config["labels"].index("press")] * len(raws)
    cut = [r[:2048] for r in raws]
    whole_m, whole_a = model(raws), anchor(raws, model.max_length)
    return {
        "source": f"BBC News test split, {len(raws)} articles (seeded sample)",
        "label": "press",
        "median_kb": round(float(np.median([len(r) for r in raws])) / 1024, 1),
        "first_2kb": _case(model(cut), anchor(cut, model.max_length), y),
        "whole": _case(whole_m, whole_a, y),
        "ood": ood_row(whole_m, whole_a, *clean, model.threshold),
    }


def run_text(model: OnnxText, s: TextSettings, log: Log = print) -> dict[str, Any]:
    from lara_serve.model_export.training.tasks import text_docs

    dataset = _dataset(model)
    train_texts, train_labels = text_docs(dataset, "train")
    anchor = TfidfAnchor(train_texts, train_labels, len(model.config["labels"]))
    raws, labels = _test_docs(dataset, s.limit, s.seed)
    log(f"{model.name}: {len(raws)} test docs, anchor fit in {anchor.fit_s:.0f} s")
    clean_m, clean_a = model(raws), anchor(raws, model.max_length)
    cases: dict[str, Any] = {"clean": _case(clean_m, clean_a, labels)}
    nv = s.docs or len(raws)
    for v in s.variants:
        docs = [perturb.text_variant(r, v, random.Random(f"{v}:{s.seed}:{i}")) for i, r in enumerate(raws[:nv])]
        cases[v] = _case(model(docs), anchor(docs, model.max_length), labels[:nv])
        log(f"  {v}: model {cases[v]['model']['value']:.3f} anchor {cases[v]['anchor']['value']:.3f}")
    nf = min(s.filler_docs, len(raws))
    filler = _filler(model, anchor, raws[:nf], labels[:nf], s, log) if nf and s.filler_sources else {}
    y = np.asarray(labels)
    result: dict[str, Any] = {
        "kind": "text",
        "dataset": dataset,
        "anchor": {"name": anchor.name, "fit_s": round(anchor.fit_s, 1), "train_docs": len(train_texts)},
        "has_ood_score": model.has_ood,
        "ood_threshold": model.threshold,
        "cases": cases,
        "filler": filler,
        "filler_clean": _case(_take(clean_m, nf), _take(clean_a, nf), labels[:nf]) if filler else None,
        "calibration": calibration_row(clean_m, clean_a, y, model.threshold),
    }
    if dataset == "news" and s.sotu:
        result["sotu"] = _sotu(model, anchor, s)
        log(f"  sotu: {result['sotu']['whole']['model']['value']:.3f} whole")
    if dataset == "brown" and s.new_source:
        result["new_source"] = _bbc_as_press(model, anchor, (clean_m, clean_a), s)
        log(f"  BBC News as press: {result['new_source']['whole']['model']['value']:.3f} whole")
    sets = _ood_sets(dataset, [len(r) for r in raws], s.ood_items, s.seed)
    result["ood"] = _ood(model, anchor, clean_m, clean_a, sets)
    return result
