"""Which passages decided a text's label: occlusion over passages cut at paragraph and sentence ends.

contribution(passage) = p(label | text) - p(label | text with the passage removed), where label is the one
predicted for the whole text. The numbers are the model's own answers to the occluded texts, so they are
faithful by construction: a client that posts the text without a passage to :predict gets `score_without`
back. The occluded variants of a request go through the model's batcher together with the whole texts, as
one request's items, so queue limits, deadlines and cancellation apply to them as to any prediction.

Passages are byte ranges [start, end) of the text the model read (after truncation), in document order and
covering it: at most `max_passages`, none shorter than MIN_PASSAGE_BYTES except a document's only passage.
A text of one passage has nothing to compare with (removing it leaves no text): its contribution is null.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lara_serve.server.batcher import BatchResult
from lara_serve.server.errors import invalid, malformed, too_large
from lara_serve.server.models import Scored, ServedModel
from lara_serve.server.preprocess import IDS, MASK, Item
from lara_serve.server.repository import TextPreprocessing
from lara_serve.server.schemas import (
    MAX_PASSAGES_RANGE,  # what a request may ask for; the default: settings.explain_passages
)

MIN_PASSAGE_BYTES = 64
# Ends of paragraphs (blank lines), lines, and sentences (., ! or ? with any closing quote or bracket, then
# whitespace): the next passage starts at the end of a match.
_BREAK = re.compile(rb"(?:\r?\n[ \t]*){2,}|\r?\n|(?<=[.!?])[\"')\]]*[ \t]+")
_SPACE = re.compile(rb"\s")


@dataclass(frozen=True)
class Passage:
    start: int
    end: int


def check_max_passages(value: object) -> int:
    """A request's max_passages -> int, or a 400 that names the allowed range."""
    low, high = MAX_PASSAGES_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise malformed(f"max_passages must be an integer in [{low}, {high}], got {value!r}")
    return value


def split_passages(doc: bytes, max_passages: int, min_bytes: int = MIN_PASSAGE_BYTES) -> list[Passage]:
    """Cut `doc` into at most `max_passages` contiguous passages at paragraph/sentence ends.

    Each passage but the last is at least `target` = max(min_bytes, ceil(n / max_passages)) long, which
    bounds the count; a stretch with no sentence end longer than `target` is cut at whitespace, else at a
    UTF-8 character boundary. A last passage shorter than min_bytes joins the one before it.
    """
    n = len(doc)
    target = max(min_bytes, math.ceil(n / max_passages))
    cuts = sorted(set(m.end() for m in _BREAK.finditer(doc) if 0 < m.end() < n) | set(_forced_cuts(doc, target)))
    starts = [0]
    for cut in cuts:
        if cut - starts[-1] >= target:
            starts.append(cut)
    if len(starts) > 1 and n - starts[-1] < min_bytes:
        starts.pop()
    ends = [*starts[1:], n]
    return [Passage(s, e) for s, e in zip(starts, ends, strict=True)]


def _forced_cuts(doc: bytes, target: int) -> list[int]:
    """Cut points every ~target bytes inside stretches without a sentence end (whitespace preferred)."""
    bounds = [0, *(m.end() for m in _BREAK.finditer(doc)), len(doc)]
    out = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        pos = lo
        while hi - pos > 2 * target:
            window = doc[pos + target : pos + 2 * target]
            space = [m.end() for m in _SPACE.finditer(window)]
            cut = pos + target + (space[0] if space else 0)
            while cut < hi and 0x80 <= doc[cut] < 0xC0:  # never inside a UTF-8 character
                cut += 1
            out.append(cut)
            pos = cut
    return out


def document_bytes(item: Item, prep: TextPreprocessing) -> bytes:
    """The bytes the model reads for a text item (after truncation): its ids less the byte offset."""
    return (np.clip(item.arrays[IDS] - prep.byte_offset, 0, 255)).astype(np.uint8).tobytes()


def without(item: Item, passage: Passage) -> Item:
    """The item with the passage's positions removed (what :predict gets for the text without it)."""
    keep = np.r_[0 : passage.start, passage.end : item.length]
    arrays = {IDS: item.arrays[IDS][keep], MASK: item.arrays[MASK][keep]}
    return Item(arrays, length=len(keep), truncated=item.truncated)


@dataclass(frozen=True)
class Plan:
    """What explaining one text costs: its passages and, when there are two or more, one variant each."""

    doc: bytes
    passages: list[Passage]
    variants: list[Item]


def plan(items: Sequence[Item], prep: TextPreprocessing, max_passages: int) -> list[Plan]:
    plans = []
    for item in items:
        doc = document_bytes(item, prep)
        passages = split_passages(doc, max_passages)
        variants = [without(item, p) for p in passages] if len(passages) > 1 else []
        plans.append(Plan(doc, passages, variants))
    return plans


def require_text(model: ServedModel) -> None:
    if model.config.task != "text":
        raise invalid(
            f"model {model.name!r} is an {model.config.task} model; only text models explain (:explain, v2 "
            "parameters.explain); use :predict for it"
        )


async def explain(
    model: ServedModel, items: list[Item], max_passages: int, timeout_s: float, max_items: int
) -> tuple[list[BatchResult[Scored]], list[list[dict[str, Any]]]]:
    """Run the texts and their occluded variants as one request. Returns (the whole texts' results, and for
    each text its passages as JSON-ready dicts with contribution and score_without)."""
    require_text(model)
    prep = model.config.preprocessing
    assert isinstance(prep, TextPreprocessing)
    plans = plan(items, prep, max_passages)
    variants = [v for p in plans for v in p.variants]
    if len(items) + len(variants) > max_items:
        raise too_large(
            f"explaining these {len(items)} texts takes {len(items) + len(variants)} model runs (one per text and "
            f"one per passage); at most max_queue_size={max_items}: send fewer texts or a smaller max_passages"
        )
    results = await model.classify([*items, *variants], timeout_s)
    whole, occluded = results[: len(items)], iter(results[len(items) :])
    out = []
    for result, p in zip(whole, plans, strict=True):
        label = int(np.argmax(result.value.probabilities))
        p_whole = float(result.value.probabilities[label])
        rows = []
        for passage in p.passages:
            p_without = float(next(occluded).value.probabilities[label]) if p.variants else None
            rows.append(
                {
                    "start": passage.start,
                    "end": passage.end,
                    "text": p.doc[passage.start : passage.end].decode("utf-8", "replace"),
                    "contribution": None if p_without is None else p_whole - p_without,
                    "score_without": p_without,
                }
            )
        out.append(rows)
    return whole, out


def documents(items: Sequence[Item], passages: Sequence[list[dict[str, Any]]]) -> list[bytes]:
    """v2's `explanation` output: per item the JSON {"method", "length", "passages"} of v1 :explain."""
    docs = [
        {"method": "occlusion", "length": i.length, "passages": rows} for i, rows in zip(items, passages, strict=True)
    ]
    return [json.dumps(d).encode() for d in docs]
