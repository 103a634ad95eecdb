"""Which passages decided a text's label: occlusion over passages cut at paragraph and sentence ends.

contribution(passage) = p(label | text) - p(label | text with the passage occluded), where label is the one
predicted for the whole text. Occluded means removed, except for a model that reads in fixed windows
(config model.window): there the passage's pieces are read as [PAD] in place. Why: removing a passage moves
every window boundary after it, so with unrelated text before an article each removal re-cut the whole
article, and that change outweighed what the article's own passages carry (research/explain_occlusion.py,
holdout articles with 10 KB of filler first: the top passage inside the article 61.5% removed, 96.2% padded).
The numbers are the model's own answers to the occluded inputs, so they are faithful by construction: a
client that posts the text without a passage to :predict (or, for a windowed model, the ids with the
passage's pieces set to the pad id to v2 infer) gets `score_without` back. The occluded variants
of a request go through the model's batcher together with the whole texts, as one request's items, so queue
limits, deadlines and cancellation apply to them as to any prediction.

Passages are byte ranges [start, end) of the text the model read (after truncation), in document order and
covering it: at most `max_passages`, none shorter than MIN_PASSAGE_BYTES except a document's only passage.
A text of one passage has nothing to compare with (removing it leaves no text): its contribution is null.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lara_serve.server.batcher import BatchResult
from lara_serve.server.errors import ErrorKind, ServeError, invalid, malformed, too_large
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
    """The bytes the model reads for a text item (after truncation): its ids less the byte offset, or the text
    a word-piece item keeps."""
    if item.text is not None:
        return item.text
    return (np.clip(item.arrays[IDS] - prep.byte_offset, 0, 255)).astype(np.uint8).tobytes()


def without(item: Item, passage: Passage, pad_in_place: int | None = None) -> Item:
    """The item with the passage occluded: its positions removed (what :predict gets for the text without
    it), or with pad_in_place, its ids set to that id and kept (a windowed model's grid stays where it was).
    One copy of each array, no index array."""
    start, end = positions(item, passage)
    if pad_in_place is not None:
        ids = item.arrays[IDS].copy()
        ids[start:end] = pad_in_place
        return Item({IDS: ids, MASK: item.arrays[MASK]}, length=item.length, truncated=item.truncated)
    arrays = {k: np.concatenate((item.arrays[k][:start], item.arrays[k][end:])) for k in (IDS, MASK)}
    return Item(arrays, length=item.length - (end - start), truncated=item.truncated)


def positions(item: Item, passage: Passage) -> tuple[int, int]:
    """The positions [start, end) a passage's bytes occupy: the same numbers for a byte model, the word pieces
    that start inside it for a word-piece model ([CLS] and [SEP] are never inside a passage)."""
    if item.piece_starts is None:
        return passage.start, passage.end
    starts = item.piece_starts
    return int(np.searchsorted(starts, passage.start)), int(np.searchsorted(starts, passage.end))


@dataclass(frozen=True)
class Plan:
    """What explaining one text costs: its passages and, when there are two or more, one model run each.
    The occluded variants are built only when their turn comes (`_variants`), never all at once."""

    item: Item
    doc: bytes
    passages: list[Passage]
    pad_in_place: int | None = None  # a windowed model's pad id: occluded pieces stay in place (`without`)

    @property
    def runs(self) -> int:
        return len(self.passages) if len(self.passages) > 1 else 0


def plan(items: Sequence[Item], prep: TextPreprocessing, max_passages: int, window: int = 0) -> list[Plan]:
    """window: the model's read window (ModelConfig.read_window); > 0 occludes in place with the pad id."""
    pad = prep.pad_id if window > 0 else None
    plans = []
    for item in items:
        doc = document_bytes(item, prep)
        plans.append(Plan(item, doc, split_passages(doc, max_passages), pad))
    return plans


def require_text(model: ServedModel) -> None:
    if model.config.task != "text":
        raise invalid(
            f"model {model.name!r} is an {model.config.task} model; only text models explain (:explain, v2 "
            "parameters.explain); use :predict for it"
        )


def log_odds(p: float) -> float:
    """log(p / (1 - p)), with p kept inside [1e-7, 1 - 1e-7] so a certain answer stays finite."""
    q = min(max(p, 1e-7), 1.0 - 1e-7)
    return math.log(q / (1.0 - q))


# Variants built on the event loop only while small: a chunk of more tokens than this is built in a thread.
_INLINE_TOKENS = 1 << 16


async def explain(
    model: ServedModel, items: list[Item], max_passages: int, timeout_s: float, max_items: int
) -> tuple[list[BatchResult[Scored]], list[list[dict[str, Any]]]]:
    """Run the texts, then their occluded variants a batch's token budget at a time. Returns (the whole
    texts' results, and for each text its passages as JSON-ready dicts with contribution and score_without).

    Admission before any per-passage memory: the number of model runs is checked against max_items first.
    Fair share: each chunk of variants is queued only when the one before it is answered, so requests of
    other clients that arrived meanwhile run between them, and at most one chunk's copies exist at a time.
    No wasted passes: before each chunk, if the batcher's measured time per run says the variants left cannot
    finish by the deadline, the request stops at once with a 504 naming the max_passages that would fit.
    Cancellation (the client left) drops the chunk in the queue and stops the loop."""
    require_text(model)
    prep = model.config.preprocessing
    assert isinstance(prep, TextPreprocessing)
    plans = plan(items, prep, max_passages, model.config.read_window)
    runs = len(items) + sum(p.runs for p in plans)
    if runs > max_items:
        raise too_large(
            f"explaining these {len(items)} texts takes {runs} model runs (one per text and one per passage); at "
            f"most max_queue_size={max_items}: send fewer texts or a smaller max_passages"
        )
    deadline = time.perf_counter() + timeout_s
    whole = await model.classify(items, timeout_s)
    probabilities: list[list[float]] = [[] for _ in plans]
    for index, chunk in _chunks(plans, model.batcher.policy.max_batch_tokens):
        _check_time_left(model, plans, index, deadline, timeout_s, max_passages)
        tokens = sum(plans[i].item.length for i, _ in chunk)
        build = functools.partial(_variants, plans, chunk)
        variants = build() if tokens <= _INLINE_TOKENS else await asyncio.to_thread(build)
        results = await model.classify(variants, max(1e-3, deadline - time.perf_counter()))
        del variants  # the copies go as soon as their answers are back
        for (i, _), result in zip(chunk, results, strict=True):
            probabilities[i].append(result.value.probabilities)
    return whole, [_rows(p, r, probs) for p, r, probs in zip(plans, whole, probabilities, strict=True)]


def _chunks(plans: Sequence[Plan], budget: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """(first pending run's position, [(plan index, passage index), ...]) per chunk: as many variants as the
    token budget holds (at least one), in document order."""
    pending = [(i, j) for i, p in enumerate(plans) if p.runs for j in range(len(p.passages))]
    out, start = [], 0
    while start < len(pending):
        end, tokens = start, 0
        while end < len(pending) and (end == start or tokens + plans[pending[end][0]].item.length <= budget):
            tokens += plans[pending[end][0]].item.length
            end += 1
        out.append((start, pending[start:end]))
        start = end
    return out


def _variants(plans: Sequence[Plan], chunk: Sequence[tuple[int, int]]) -> list[Item]:
    return [without(plans[i].item, plans[i].passages[j], plans[i].pad_in_place) for i, j in chunk]


def _check_time_left(
    model: ServedModel, plans: Sequence[Plan], done: int, deadline: float, timeout_s: float, max_passages: int
) -> None:
    """A 504 before the next chunk when recent batches say the runs left cannot finish by the deadline."""
    left = [p.item.length for p in plans for _ in range(p.runs)][done:]
    bounds = [model.batcher.cost.lower_bound_s(n) for n in left]
    if not left or any(t is None for t in bounds):
        return  # no evidence for these lengths: run and measure, as the batcher does
    need, remaining = sum(t for t in bounds if t is not None), deadline - time.perf_counter()
    if need > remaining:
        per_run = need / len(left)
        # runs that could have finished in this request: those done, and those the time left would hold
        fit = (done + int(max(remaining, 0.0) / per_run)) // max(1, len(plans))
        # fewer than two passages explain nothing: then only a shorter text or more time helps
        advice = (f"ask for max_passages <= {min(fit, max_passages - 1)} or a shorter text" if fit >= 2 else
                  "even max_passages 2 would not finish: send a shorter text, or raise request_timeout_s")  # fmt: skip
        raise ServeError(
            ErrorKind.TIMEOUT,
            f"explaining would need about {need:.1f} s more ({len(left)} runs of the text without one passage) "
            f"and {max(remaining, 0.0):.1f} s are left of request_timeout_s={timeout_s:g} s; {advice}",
        )


def _rows(p: Plan, result: BatchResult[Scored], occluded: list[Any]) -> list[dict[str, Any]]:
    label = int(np.argmax(result.value.probabilities))
    p_whole = float(result.value.probabilities[label])
    rows = []
    for k, passage in enumerate(p.passages):
        p_without = float(occluded[k][label]) if p.runs else None
        rows.append(
            {
                "start": passage.start,
                "end": passage.end,
                "text": p.doc[passage.start : passage.end].decode("utf-8", "replace"),
                "contribution": None if p_without is None else p_whole - p_without,
                # Unsaturated: at p = 0.999 a decisive passage moves the probability by 0.001 but the
                # log-odds by several units, so the deciding passage of a confident answer still shows.
                "log_odds": None if p_without is None else log_odds(p_whole) - log_odds(p_without),
                "score_without": p_without,
            }
        )
    return rows


def documents(items: Sequence[Item], passages: Sequence[list[dict[str, Any]]]) -> list[bytes]:
    """v2's `explanation` output: per item the JSON {"method", "length", "passages"} of v1 :explain."""
    docs = [
        {"method": "occlusion", "length": i.length, "passages": rows} for i, rows in zip(items, passages, strict=True)
    ]
    return [json.dumps(d).encode() for d in docs]
