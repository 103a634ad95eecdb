"""Which parts of the bag-of-words anchor keep its accuracy flat from the first KB to whole documents.

    python -m research.anchor_parts [--dataset news] [--no-heads]

The anchor (TF-IDF word 1-2-grams, sublinear tf, idf, L2 norm, + logistic regression) fit on whole texts
plus their first 512 B and 1 KB loses only about 0.3 point at 1 KB by 5-fold cross-validation on BBC, where
every LARA recipe tried lost more (docs/long-documents.md). Before building any bag-of-words path into the
text model, this measures the anchor with parts taken away, on the same folds and head-weighted fits
(`benchmarks.long_docs.tfidf_kfold_truncation`): word bigrams, then idf and the sublinear tf, then the L2
norm (an L1-normalized count vector is the mean of one-hot word vectors: what a linear head over the
masked mean of hashed word embeddings computes). Also features of the kind the text model's wide path reads
(hashed word 1-2-grams, `lara_serve.model_export.models.text.TfidfHead`) fit by logistic regression. Writes
research/results/anchor_parts.json.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from benchmarks.common import environment, markdown_table
from benchmarks.long_docs import GAP_AT, HEAD_FIT, tfidf_kfold_truncation
from lara_serve.model_export.training.distill import tfidf_classifier
from research import write_json

WORDS = (
    r"[A-Za-z0-9]+"  # the text encoder's word definition (lara_serve.model_export.models.text.word_chars), case-folded
)


def _linear(vectorizer: Any, c: float, norm: str | None = None) -> Any:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import Normalizer

    steps = [vectorizer] + ([Normalizer(norm)] if norm else []) + [LogisticRegression(C=c, max_iter=2000)]
    return make_pipeline(*steps)


def variants() -> dict[str, Callable[[], Any]]:
    """name -> a factory of unfitted classifiers, from the anchor down to a mean of word vectors."""
    from sklearn.feature_extraction.text import CountVectorizer, HashingVectorizer, TfidfTransformer, TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    return {
        "anchor: tf-idf word 1-2-grams, sublinear tf, L2, C=10": tfidf_classifier,
        # Features of the kind the text model's wide path reads (TfidfHead: ASCII words and their bigrams in
        # 262,139 hashed buckets; sklearn's hash, not the model's, and no min_df), fit by logistic regression.
        "hashed word 1-2-grams (262,139 buckets), sublinear tf-idf, L2, C=10": lambda: make_pipeline(
            HashingVectorizer(
                n_features=262_139, ngram_range=(1, 2), token_pattern=WORDS, alternate_sign=False, norm=None
            ),
            TfidfTransformer(sublinear_tf=True),
            LogisticRegression(C=10.0, max_iter=2000),
        ),
        "tf-idf words, sublinear tf, L2, C=10": lambda: _linear(
            TfidfVectorizer(sublinear_tf=True, min_df=2, token_pattern=WORDS), 10.0
        ),
        "sublinear tf words, no idf, L2, C=10": lambda: _linear(
            TfidfVectorizer(sublinear_tf=True, use_idf=False, min_df=2, token_pattern=WORDS), 10.0
        ),
        "word counts, L2, C=10": lambda: _linear(CountVectorizer(min_df=2, token_pattern=WORDS), 10.0, "l2"),
        # L1-normalized rows are ~1/length per word, far smaller than L2 ones: C scaled up to match.
        "word counts, L1 (mean of word vectors), C=1000": lambda: _linear(
            CountVectorizer(min_df=2, token_pattern=WORDS), 1000.0, "l1"
        ),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="news", choices=["news", "brown"])
    p.add_argument("--no-heads", action="store_true", help="fit on whole texts only (no first 512 B / 1 KB)")
    args = p.parse_args(argv)
    head_fit = () if args.no_heads else HEAD_FIT
    rows, results = [], {}
    for name, make in variants().items():
        kf = tfidf_kfold_truncation(args.dataset, head_fit, classifier=make)
        results[name] = kf
        g = kf[f"gap_{GAP_AT}"]
        t = kf["truncation"]
        rows.append([name] + [f"{100 * t[k]:.2f}" for k in t] + [f"{g['points']} ({g['ci95'][0]}-{g['ci95'][1]})"])
        print(rows[-1], flush=True)
    cuts = list(next(iter(results.values()))["truncation"])
    print(markdown_table(["classifier"] + cuts + [f"{GAP_AT} B gap (95%)"], rows))
    tag = "" if args.dataset == "news" else f"_{args.dataset}"
    path = write_json(
        f"anchor_parts{tag}{'_no_heads' if args.no_heads else ''}.json",
        {"environment": environment(), "dataset": args.dataset, "head_fit": list(head_fit), "variants": results},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
