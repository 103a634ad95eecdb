"""Why does `:explain` miss the article when filler comes first? Occlusion variants on the same composites.

    python -m research.explain_occlusion --docs 60                # 60 holdout composites (the choice)
    python -m research.explain_occlusion --split test --docs 40 --name explain_occlusion_test40

Hypothesis: the windowed word-piece model reads a document in fixed windows of 510 pieces. Deleting a passage
shifts every window boundary after it, so with filler prepended each filler deletion re-cuts the whole
article, and the change that causes can outweigh what any one article passage carries. Occluding in place
(the passage's pieces replaced by as many neutral pieces, so no boundary moves) tests that.

Methods, each scored as "top passage inside the article" on the correctly labelled composites:
- delete: the served method (the text without the passage);
- mask: the passage's pieces replaced by [MASK], boundaries kept;
- pad: the same with [PAD] (id 0, read as a real piece);
- alone: the passage read alone (sufficiency, not necessity): log-odds of the whole text's label.

Composites are benchmarks.explain_composites' (same seed, same filler sources) on the pretrained build's
holdout articles by default (`--split test`: the benchmark's own articles). Writes research/results/{name}.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.explain_composites import composites, inside
from benchmarks.robustness.runners import REPOSITORY, OnnxModel
from benchmarks.robustness.stats import softmax, wilson
from lara_serve.model_export.training.data import NEWS_CLASSES
from lara_serve.server.explain import Passage, log_odds, positions, split_passages, without
from lara_serve.server.preprocess import IDS, Item, text_item, wordpiece_tokenizer
from lara_serve.server.repository import read_config

RESULTS = Path(__file__).parent / "results"
METHODS = ("delete", "mask", "pad", "alone")


def run(model: OnnxModel, ids: np.ndarray) -> np.ndarray:
    logits, _ = model._run({"input_ids": ids[None], "attention_mask": np.ones_like(ids)[None]})
    return softmax(logits)[0]


def variant(item: Item, passage: Passage, method: str, mask_id: int, pad_id: int) -> np.ndarray:
    """The ids a method reads: the server's own occlusion (`server.explain.without`) for delete, mask and pad."""
    if method == "alone":
        ids = item.arrays[IDS]
        s, e = positions(item, passage)
        return np.concatenate((ids[:1], ids[s:e], ids[-1:]))  # [CLS] passage [SEP]
    fill = {"delete": None, "mask": mask_id, "pad": pad_id}[method]
    return without(item, passage, fill).arrays[IDS]


def explain_one(
    model: OnnxModel, item: dict[str, Any], prep: Any, mask_id: int, passages: int, methods: list[str]
) -> dict[str, Any]:
    it = text_item(item["text"].encode(), prep, "head")
    ids = it.arrays[IDS]
    whole = run(model, ids)
    label = int(whole.argmax())
    parts = split_passages(item["text"].encode(), passages)
    row: dict[str, Any] = {"source": item["source"], "position": item["position"], "label": item["label"],
                           "predicted": label, "passages": []}  # fmt: skip
    for p in parts:
        scores = {}
        for m in methods:
            prob = run(model, variant(it, p, m, mask_id, prep.pad_id))[label]
            scores[m] = log_odds(prob) if m == "alone" else log_odds(float(whole[label])) - log_odds(prob)
        half, _ = inside({"start": p.start, "end": p.end}, tuple(item["article"]))
        row["passages"].append({"start": p.start, "end": p.end, "inside": half, **scores})
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="lara-text-news")
    ap.add_argument("--docs", type=int, default=40)
    ap.add_argument("--kb", type=int, default=10)
    ap.add_argument("--max-passages", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--split", default="holdout", choices=("holdout", "test"))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--name", default="explain_occlusion")
    args = ap.parse_args(argv)
    model = OnnxModel(args.model, threads=args.threads)
    prep = read_config(REPOSITORY / args.model).preprocessing
    mask_id = int(wordpiece_tokenizer(prep.tokenizer).token_to_id("[MASK]"))
    rows = []
    for k, item in enumerate(composites(args.docs, args.kb, 0, args.split)):
        row = explain_one(model, item, prep, mask_id, args.max_passages, args.methods)
        row["correct"] = NEWS_CLASSES[row["predicted"]] == item["label"]
        rows.append(row)
        tops = {m: max(row["passages"], key=lambda p: p[m])["inside"] for m in args.methods}
        print(f"[{k + 1}/{args.docs}] {item['source']}/{item['position']} right={row['correct']} {tops}", flush=True)
    right = [r for r in rows if r["correct"]]
    summary: dict[str, Any] = {}
    for m in args.methods:
        for pos in ("append", "prepend", "all"):
            rs = [r for r in right if pos in ("all", r["position"])]
            hits = sum(max(r["passages"], key=lambda p: p[m])["inside"] for r in rs)
            summary[f"{m}/{pos}"] = wilson(hits, len(rs)) if rs else None
    out = {"settings": vars(args), "summary": summary, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(out, indent=1) + "\n")
    for k, v in summary.items():
        print(k, v and f"{100 * v['value']:.1f}% [{100 * v['lo']:.1f}, {100 * v['hi']:.1f}] n={v['n']}")
    return out


if __name__ == "__main__":
    main()
