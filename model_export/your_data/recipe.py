"""The robust text recipe of `lara train`, as the shipped lara-text-news-bytes was trained (its config.json's
"model" and "training" sections): case folding in the graph, a filler-resistant readout (attention pooling,
or --pooling passages as the shipped model reads now), and label-preserving noise
plus unrelated filler on every training window (lara_serve.model_export.training.augment.TextAugment).

A user's documents reach the server in shapes the training file rarely shows: upper-cased, re-wrapped,
saved from a web page, with typos, inside a signature, a quoted thread or a licence. A model trained on
clean text only reads such wrapping as content; this recipe trains on it. `--no-augment` turns the
augmentation off (the architecture stays); `--no-case-fold` keeps letter case as a signal.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import statistics
from collections.abc import Callable
from typing import Any

from torch import nn

from lara_serve.model_export.models.config import TextConfig
from lara_serve.model_export.training.augment import FillerBank, TextAugment
from lara_serve.model_export.training.train import LENGTH_MIX

# The encoder's side of the recipe: fixed by the architecture, so the exported graph carries it.
# --pooling chooses the readout (lara_serve.model_export.models.config.TextConfig.pooling); passages take the shipped
# lara-text-news-bytes model's passage_bytes (512) unless --init's model says otherwise.
POOLING = "attention"


# Short texts (a median training document under this many bytes: subject lines, descriptions, messages)
# get the short recipe: whole documents in large batches, filler at most as long as the text, no same-label
# composites. The robust recipe's composites of 4-16 KB and filler up to 8x a window train a model for
# documents these data never have, at 10-50x the cost of an epoch of them (issue 54: 8.3 min an epoch of 60
# texts of 400 B).
SHORT_MEDIAN_BYTES = 1024
SHORT_WINDOW = 2048  # the short recipe's longest training window, bytes (the served max_length stays)
SHORT_FILLER_RATIO = 1.0  # filler at most as long as the window it joins


def choose(lengths: list[int]) -> dict[str, Any]:
    """The recipe for training documents of these lengths (bytes), as config.json's training.recipe_choice
    records it: "short" when their median is under SHORT_MEDIAN_BYTES, else "robust"."""
    median = float(statistics.median(lengths)) if lengths else 0.0
    kind = "short" if median < SHORT_MEDIAN_BYTES else "robust"
    return {"recipe": kind, "median_bytes": median, "rule": f"short when the median training document is under "
            f"{SHORT_MEDIAN_BYTES:,} bytes, else robust"}  # fmt: skip


def recipe_line(pooling: str = POOLING, kind: str = "robust") -> str:
    """config.json's training.recipe: what the recipe did to this model."""
    if kind == "short":
        return (
            f"short text (lara_serve.model_export.your_data.recipe): {pooling} pooling, case folding unless "
            f"--no-case-fold, windows up to {SHORT_WINDOW:,} bytes, no composites, TextAugment with filler at most "
            f"{SHORT_FILLER_RATIO:g}x the window unless --no-augment"
        )
    return (
        f"robust text (lara_serve.model_export.your_data.recipe): {pooling} pooling, case folding unless --no-case-fold, "
        "TextAugment on every training window unless --no-augment"
    )


RECIPE = recipe_line()


def length_mix(max_length: int, kind: str = "robust") -> dict[str, Any]:
    """The shipped news recipe's windows (lara_serve.model_export.training.long_docs.LengthMixTask: 256 B-8 KB log-uniform, same-label
    composites of 4-16 KB for 15% of the examples, head-anchored windows half the time, 24 K tokens a batch),
    every length capped at the model's max_length: no training input is longer than a served one may be.
    Unlike the shipped run, a batch holds at least 2 examples (a long window gets a partner past the token
    budget), so `torchrun --nproc_per_node 2` gives both processes work every step."""
    mix = {**LENGTH_MIX["news"], "head_prob": 0.5, "composite_min": 4096, "composite_max": 16384, "min_examples": 2}
    if kind == "short":  # whole short documents, many to a batch (the token budget stays)
        mix.update(min_length=64, max_length=SHORT_WINDOW, composite_prob=0.0)
    for key in ("max_length", "min_length", "composite_max", "composite_min"):
        mix[key] = min(mix[key], max_length)
    return mix


def text_config(cfg: TextConfig, case_fold: bool = True, pooling: str = POOLING) -> TextConfig:
    """`cfg` with the recipe's pooling and case folding (whatever the --init model or --arch had)."""
    return dataclasses.replace(cfg, pooling=pooling, case_fold=case_fold)


def text_augment(
    max_length: int, enabled: bool = True, bank: FillerBank | None = None, kind: str = "robust"
) -> TextAugment | None:
    """The shipped news recipe's augmentation (TextAugment's defaults), the augmented window capped at the
    model's max_length: filler never makes a training input longer than a served one may be. The short
    recipe's filler is at most as long as the window, the window with it at most SHORT_WINDOW."""
    if not enabled:
        return None
    if kind == "short":
        return TextAugment(filler_max_ratio=SHORT_FILLER_RATIO, max_total=min(SHORT_WINDOW, max_length), bank=bank)
    return TextAugment(max_total=min(TextAugment.max_total, max_length), bank=bank)


def filler_bank(share: Callable[[object], object] = lambda x: x) -> tuple[FillerBank, str]:
    """(the filler text this run trains with, its sha256). Read from the installed packages now, not taken from
    a bank an earlier run in this process cached: a `pip install` in between changes the packages' texts, and
    with them every augmented batch. `share` hands process 0's bank to every process of a torchrun group
    (lara_serve.model_export.your_data.dist.Group.share), so all of them draw the same batches."""
    FillerBank.installed.cache_clear()
    local = FillerBank.installed()
    sources, words = share((local.sources, local.words))  # type: ignore[misc]
    h = hashlib.sha256()
    for kind in sorted(sources):
        for text in sources[kind]:
            h.update(kind.encode() + b"\0" + len(text).to_bytes(8, "little") + text)
    h.update("\n".join(words).encode())
    return FillerBank(sources, words), h.hexdigest()


def capped(aug: TextAugment, max_length: int) -> Callable[[bytes, random.Random], bytes]:
    """`aug` then a cut at max_length bytes (the head kept, as the server's truncation keeps it): case and
    whitespace changes and markup can lengthen a window that was already max_length long."""

    def run(raw: bytes, rng: random.Random) -> bytes:
        return aug(raw, rng)[:max_length]

    return run


def augment_record(aug: TextAugment | None) -> dict[str, Any] | None:
    """What config.json's "training" records of the augmentation (as lara_serve.model_export.training.train writes it)."""
    if aug is None:
        return None
    settings = {f.name: getattr(aug, f.name) for f in dataclasses.fields(aug) if f.name != "bank"}
    return {
        **settings,
        "where": list(settings["where"]),
        "filler": "lara_serve.model_export.training.augment.FillerBank.installed()",
    }


def copy_matching(model: nn.Module, source: dict[str, Any]) -> dict[str, Any]:
    """Copy every tensor of `source` whose name and shape fit `model`; returns what config.json records:
    how many were taken and which stayed fresh (the new head; the pooling scores when --init pooled by mean)."""
    own = model.state_dict()
    taken = {k: v for k, v in source.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(taken, strict=False)
    return {"copied": len(taken), "of": len(own), "fresh": sorted(set(own) - set(taken))}
