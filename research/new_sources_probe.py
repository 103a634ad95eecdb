"""New sources of known topics on this machine: does a news model answer them, and how sure is it? (issue 53:
"new sources of the five topics", which only the outside check measured)

    .venv/bin/python -m research.new_sources_probe [--n 200] [--threads 1]

Only two of the five topics have another source installed here, so this is a partial proxy, not the outside
check's pooled figure:
- tech: Debian package descriptions (/var/lib/dpkg/status, the long description of each installed package);
- tech: Python packages' descriptions (their METADATA bodies). `lara-text-news`'s trainer cut filler from
  these, and since `--topic-sources` its head trains on them as tech: only the packages on the holdout side
  of the build's rule (`python_descriptions_holdout`) are unseen text there;
- politics: the latest 16 State of the Union addresses (never trained on: `topic_sources.LATEST_KEPT_OUT`;
  the robustness suite reads the latest 8) read whole, and 2 KB excerpts of them (five per address, seeded);
- entertainment: the Brown corpus's press reviews (genre c: 17 reviews of books, theatre, music and films from
  1961, about 12 KB each; since 2026-12-07). The pretrained encoder's attention transfer read Brown's train
  split as generic English, no classifier head did; the window gate's probe read Brown g and h, not c.
Each set through `lara-text-news` (int8, each row alone as the server runs it), `lara-text-news-bytes` and the
TF-IDF anchor fitted on the BBC train split. Accuracy with a Wilson interval, mean top probability, ECE, and
what the wrong answers were. Writes research/results/new_sources_probe.json.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.robustness import sources
from benchmarks.robustness.runners import OnnxText, Outputs, TfidfAnchor
from benchmarks.robustness.stats import ece, wilson
from lara_serve.model_export.models.registry import NEWS_LABELS
from lara_serve.model_export.pretrained.classifier import in_holdout
from lara_serve.model_export.pretrained.topic_sources import python_description_items
from lara_serve.model_export.training.brown import load_brown
from lara_serve.model_export.training.data import load_news

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "research" / "results" / "new_sources_probe.json"
TECH, POLITICS, ENTERTAINMENT = (NEWS_LABELS.index(k) for k in ("tech", "politics", "entertainment"))


def debian_descriptions(min_chars: int = 200) -> list[str]:
    """The long description of each installed Debian package (continuation lines unindented, ' .' blank)."""
    status = Path("/var/lib/dpkg/status")
    out, cur = [], None
    for line in status.read_text(errors="ignore").splitlines() if status.exists() else []:
        if line.startswith("Description:"):
            cur = [line.split(":", 1)[1].strip() + "."]
        elif cur is not None and line.startswith(" "):
            cur.append("" if line.strip() == "." else line.strip())
        elif cur is not None:
            text = "\n".join(cur).strip()
            if len(text) >= min_chars:
                out.append(text)
            cur = None
    return sorted(set(out))


def sample(texts: list[str], n: int, seed: str) -> list[str]:
    return random.Random(seed).sample(texts, min(n, len(texts)))


def sotu_sets(latest: int) -> tuple[list[str], list[str]]:
    """The latest State of the Union addresses whole, and five seeded 2 KB excerpts of each."""
    speeches = [s["text"] for s in sources.load_sotu(latest=latest)]
    rng = random.Random("sotu-excerpts")
    excerpts = []
    for s in speeches:
        for _ in range(5):
            start = rng.randrange(max(1, len(s) - 2048))
            excerpts.append(s[start : start + 2048])
    return speeches, excerpts


def brown_reviews() -> list[str]:
    """The Brown corpus's genre c (press: reviews), both splits, in file order."""
    docs = load_brown("train") + load_brown("test")
    return [d.text for d in sorted(docs, key=lambda d: d.doc_id) if d.doc_id[1] == "c"]


def figures(out: Outputs, label: int) -> dict[str, Any]:
    pred = out.pred
    y = np.full(len(pred), label)
    top = out.probs.max(axis=1)
    return {
        "accuracy": wilson(int((pred == label).sum()), len(pred)),
        "mean_top_probability": round(float(top.mean()), 4),
        "ece": ece(out.probs, y)["value"],
        "answers": dict(Counter(NEWS_LABELS[int(p)] for p in pred).most_common()),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=200, help="items per set at most")
    p.add_argument("--sotu", type=int, default=16, help="latest State of the Union addresses")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="lara-text-news", help="a word-piece model folder under model_repository/")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    speeches, excerpts = sotu_sets(args.sotu)
    described = python_description_items()
    sets = {
        "debian_descriptions": (sample(debian_descriptions(), args.n, "debian"), TECH),
        "python_descriptions": (sample([i.text for i in described], args.n, "python"), TECH),
        "python_descriptions_holdout": ([i.text for i in described if in_holdout(i.key)], TECH),
        "sotu_whole": (speeches, POLITICS),
        "sotu_2kb_excerpts": (excerpts, POLITICS),
        "brown_reviews": (brown_reviews(), ENTERTAINMENT),
    }
    train = load_news("train")
    anchor = TfidfAnchor([d.text for d in train], [d.label for d in train], len(NEWS_LABELS))
    minilm, byte_model = OnnxText(args.model, args.threads), OnnxText("lara-text-news-bytes", args.threads)
    result: dict[str, Any] = {"command": "python -m research.new_sources_probe", "model": args.model, "sets": {}}
    for name, (texts, label) in sets.items():
        raws = [t.encode("utf-8") for t in texts]
        rows = {
            "lara-text-news": minilm(raws),  # an int8 graph: one row per call (OnnxText), as the server runs it
            "lara-text-news-bytes": byte_model(raws),
            "tfidf-logreg": anchor(raws, byte_model.max_length),
        }
        result["sets"][name] = {"n": len(raws), "label": NEWS_LABELS[label],
                                **{m: figures(o, label) for m, o in rows.items()}}  # fmt: skip
        for model, o in rows.items():
            thr = minilm.threshold if model == "lara-text-news" else byte_model.threshold
            if o.ood is not None and thr is not None:
                result["sets"][name][model]["in_distribution"] = round(float((o.ood <= thr).mean()), 4)
        print(name, {m: result["sets"][name][m]["accuracy"]["value"] for m in rows}, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
