"""Label-preserving text augmentation for training: casing, whitespace, markup, typos, and unrelated filler.

A byte-level model trained only on clean news articles learns that every byte of its input is article: a
document wrapped in a licence, a web page's navigation or an e-mail's quoted thread is then read as a
different kind of document. Training windows here get, with set probabilities, the kinds of noise real
inputs carry; the label stays the article's.

Filler for training comes from text installed on every machine that runs the trainer, never from the
evaluation sets (`benchmarks.robustness` keeps its own sources; `EVAL_LICENCE_FAMILIES` names the licence
texts it uses, which are kept out of training here):
- code: Python's standard library sources;
- prose: the descriptions (METADATA) of the installed Python packages;
- licence: the licence files those packages ship, less the families the evaluation uses;
- markup: generated web-page furniture (navigation, cookie notices, footers) around generated words;
- salad: words drawn at random from the prose source's vocabulary (text with no topic at all);
- pseudo: prose in a made-up language, a fresh one per sample (its own syllables, vocabulary and word
  frequencies; sometimes accented letters): the class of filler no installed text shows, text whose words
  the model has never seen (placeholder text, foreign languages, encoded or garbled passages).
"""

from __future__ import annotations

import random
import re
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# Licence families that benchmarks.robustness appends to articles (from /usr/share/common-licenses): a
# training licence containing one of these headings is skipped, so the evaluation's licences stay unseen.
EVAL_LICENCE_FAMILIES = (
    "GNU GENERAL PUBLIC LICENSE",
    "GNU LESSER GENERAL PUBLIC",
    "GNU LIBRARY GENERAL PUBLIC",
    "GNU FREE DOCUMENTATION",
    "Apache License",
    "Mozilla Public License",
    "Artistic License",
    "Creative Commons",
)
FILLER_KINDS = ("code", "prose", "licence", "markup", "salad", "pseudo")
_MAX_SOURCE_BYTES = 4_000_000  # per kind: enough variety, bounded start-up time and memory
_MAX_FILE_BYTES = 200_000


def read_text_files(
    paths: Sequence[Path], keep: Callable[[bytes, str], bool], file_bytes: int, total_bytes: int
) -> list[bytes]:
    """The text of each file (sorted paths; its first `file_bytes`, undecodable bytes dropped, as UTF-8) that
    `keep(raw, text)` accepts, until `total_bytes` are held. Unreadable files are passed over. Shared with
    `benchmarks.robustness.sources`, which reads its own (evaluation) files with its own `keep`."""
    out: list[bytes] = []
    total = 0
    for path in sorted(paths):
        try:
            raw = path.read_bytes()[:file_bytes]
        except OSError:
            continue
        text = raw.decode("utf-8", errors="ignore")
        if not keep(raw, text):
            continue
        out.append(text.encode("utf-8"))
        total += len(out[-1])
        if total >= total_bytes:
            break
    return out


def _read_files(paths: Sequence[Path], skip: Sequence[str] = ()) -> list[bytes]:
    """Each file's bytes (sorted paths, bounded sizes), skipping files that contain any of `skip`."""

    def keep(raw: bytes, text: str) -> bool:
        return len(raw) >= 200 and not any(s.lower() in text.lower() for s in skip)

    return read_text_files(paths, keep, _MAX_FILE_BYTES, _MAX_SOURCE_BYTES)


def _metadata_prose(raw: bytes) -> bytes:
    """A METADATA file without its RFC 822 header lines: the package's long description."""
    text = raw.decode("utf-8", errors="ignore")
    head, _, body = text.partition("\n\n")
    return (body or head).encode("utf-8")


def _words(texts: Sequence[bytes]) -> list[str]:
    vocab: set[str] = set()
    for t in texts:
        vocab.update(re.findall(r"\b[A-Za-z]{3,12}\b", t.decode("utf-8", errors="ignore")))
    return sorted(vocab)


_NAV = ("Home", "About us", "Contact", "Sign in", "Subscribe", "Search", "Menu", "Privacy policy", "Terms of use",
        "Cookie settings", "Accessibility", "Help", "Careers", "Advertise", "Share", "Print", "Email this page",
        "Skip to content", "Log out", "Newsletter", "Follow us", "Related links", "Back to top", "Sitemap")  # fmt: skip


def _markup(rng: random.Random, words: Sequence[str], length: int) -> bytes:
    """Web-page furniture: nav lists, cookie notices, footers, tags and attributes, around random words."""
    parts: list[str] = []
    size = 0
    while size < length:
        kind = rng.randrange(4)
        if kind == 0:
            items = "".join(f'<li><a href="/{rng.choice(words).lower()}">{rng.choice(_NAV)}</a></li>' for _ in range(6))
            parts.append(f'<nav class="menu"><ul>{items}</ul></nav>')
        elif kind == 1:
            parts.append(
                '<div id="cookie">We use cookies to improve your experience. By continuing you accept our '
                f"{rng.choice(_NAV).lower()}. <button>Accept</button> <button>Manage</button></div>"
            )
        elif kind == 2:
            parts.append(f"<footer>&copy; {rng.randrange(1990, 2030)} {' | '.join(rng.sample(_NAV, 5))}</footer>")
        else:
            text = " ".join(rng.choice(words) for _ in range(rng.randrange(5, 30)))
            parts.append(f'<div class="{rng.choice(words).lower()}"><span>{text}</span></div>')
        size += len(parts[-1]) + 1
    return "\n".join(parts).encode("utf-8")


def _salad(rng: random.Random, words: Sequence[str], length: int) -> bytes:
    out: list[str] = []
    size = 0
    while size < length:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randrange(4, 18)))
        out.append(sentence[:1].upper() + sentence[1:] + rng.choice(".?!;"))
        size += len(out[-1]) + 1
    return " ".join(out).encode("utf-8")


_CONSONANTS = "bcdfghjklmnpqrstvwxyz"
_VOWELS = "aeiou"
_ACCENTED = "áàâäãåçéèêëíìîïñóòôöõúùûüýøæœßšžčřłęą"


def _pseudo(rng: random.Random, length: int) -> bytes:
    """Prose in a language made up for this call: syllables from a random inventory, a vocabulary of 50-400
    words used with Zipf-like frequencies, sentences and paragraphs. No word need exist in any real language."""
    consonants = rng.sample(_CONSONANTS, rng.randrange(6, len(_CONSONANTS) + 1))
    vowels = rng.sample(_VOWELS, rng.randrange(2, len(_VOWELS) + 1))
    if rng.random() < 0.3:  # a language with accented letters (multi-byte UTF-8)
        vowels += rng.sample(_ACCENTED, rng.randrange(1, 6))
    max_syllables = rng.randrange(2, 6)

    def word() -> str:
        return "".join(
            rng.choice(consonants) * (rng.random() < 0.8)
            + rng.choice(vowels)
            + rng.choice(consonants) * (rng.random() < 0.3)
            for _ in range(rng.randrange(1, max_syllables + 1))
        )

    vocab = [word() for _ in range(rng.randrange(50, 400))]
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]
    out: list[str] = []
    size = 0
    while size < length:
        words = rng.choices(vocab, weights, k=rng.randrange(4, 20))
        sentence = " ".join(words)
        sentence = sentence[:1].upper() + sentence[1:] + rng.choice("..........?!;:")
        sentence += "\n\n" if rng.random() < 0.15 else " "
        out.append(sentence)
        size += len(sentence.encode("utf-8"))
    return "".join(out).encode("utf-8")


class FillerBank:
    """Unrelated text for training, by kind. `sample(rng, length)` returns `length` bytes (whole UTF-8
    characters, cut at a random place of a random source) of a random kind."""

    def __init__(self, sources: dict[str, list[bytes]], words: Sequence[str]) -> None:
        empty = [k for k in ("code", "prose", "licence") if not sources.get(k)]
        if empty:
            raise ValueError(f"filler sources found no text for {empty}; is the Python installation complete?")
        self.sources = sources
        self.words = list(words)

    @classmethod
    @lru_cache(maxsize=1)
    def installed(cls) -> FillerBank:
        """The bank built from this machine's installed Python (stdlib sources, packages' metadata and licences)."""
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        purelib = Path(sysconfig.get_paths()["purelib"])
        code = _read_files(list(stdlib.glob("*.py")))
        prose = [_metadata_prose(t) for t in _read_files(list(purelib.glob("*.dist-info/METADATA")))]
        licence_paths = [p for p in purelib.glob("*.dist-info/**/*") if p.is_file() and "licen" in str(p).lower()]
        licence = _read_files(licence_paths, skip=EVAL_LICENCE_FAMILIES)
        sources = {"code": code, "prose": [p for p in prose if len(p) > 200], "licence": licence}
        return cls(sources, _words(sources["prose"]))

    def sample(self, rng: random.Random, length: int, kind: str | None = None) -> bytes:
        kind = kind or rng.choice(FILLER_KINDS)
        if kind == "markup":
            raw = _markup(rng, self.words, length)
        elif kind == "salad":
            raw = _salad(rng, self.words, length)
        elif kind == "pseudo":
            raw = _pseudo(rng, length)
        else:
            pool = self.sources[kind]
            parts, size = [], 0
            while size < length:  # concatenate random files until long enough
                parts.append(pool[rng.randrange(len(pool))])
                size += len(parts[-1]) + 1
            raw = b"\n".join(parts)
        start = rng.randrange(max(1, len(raw) - length + 1))
        return _whole_chars(raw[start : start + length])


def _whole_chars(raw: bytes) -> bytes:
    """Drop partial UTF-8 sequences at either end of a cut."""
    return raw.decode("utf-8", errors="ignore").encode("utf-8")


# -- perturbations of the article itself ----------------------------------------------------------------


def change_case(raw: bytes, rng: random.Random) -> bytes:
    text = raw.decode("utf-8", errors="ignore")
    mode = rng.randrange(4)
    if mode == 0:
        return text.upper().encode("utf-8")
    if mode == 1:
        return text.lower().encode("utf-8")
    if mode == 2:
        return text.title().encode("utf-8")
    # random spans upper-cased, as headlines and shouted phrases are
    out = list(text)
    for _ in range(max(1, len(text) // 500)):
        a = rng.randrange(len(text) + 1)
        b = min(len(text), a + rng.randrange(10, 200))
        out[a:b] = list(text[a:b].upper())
    return "".join(out).encode("utf-8")


def change_whitespace(raw: bytes, rng: random.Random) -> bytes:
    text = raw.decode("utf-8", errors="ignore")
    mode = rng.randrange(3)
    if mode == 0:  # collapse: everything on one line
        return " ".join(text.split()).encode("utf-8")
    if mode == 1:  # hard-wrapped at a random width, as e-mails and plain-text pages are
        return "\n".join(wrap_words(text.split(), rng.randrange(40, 100))).encode("utf-8")
    # widened: tabs, runs of spaces and blank lines
    return re.sub(r" ", lambda _: rng.choice((" ", "  ", "\t", " \n")), text).encode("utf-8")


def add_markup(raw: bytes, rng: random.Random) -> bytes:
    """Paragraphs wrapped in HTML tags (an article saved from a web page)."""
    paras = [p for p in raw.decode("utf-8", errors="ignore").split("\n") if p.strip()]
    tag = rng.choice(("p", "div", "span", "td"))
    body = "\n".join(f"<{tag}>{p}</{tag}>" for p in paras)
    return f"<html><body><article>\n{body}\n</article></body></html>".encode()


def wrap_words(words: Sequence[str], width: int) -> list[str]:
    """Words joined by single spaces into lines of at most `width` characters (a longer word: a line alone).
    Shared with `benchmarks.robustness.perturb`, which wraps each paragraph at a fixed width."""
    lines, line = [], ""
    for w in words:
        if line and len(line) + len(w) + 1 > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    lines.append(line)
    return lines


def typo_text(
    text: str, rng: random.Random, rate: float, substitute: Callable[[str], str], *, draw_always: bool = False
) -> str:
    """Each letter, with probability `rate`, swapped with the next character, dropped, doubled or replaced by
    `substitute(letter)` (also the fate of a swap drawn for the last character).

    draw_always: call `substitute` for every typo, used or not. `benchmarks.robustness.perturb` does, so that
    its seeded inputs (and the published robustness numbers) stay what they were; training does not.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c.isalpha() and rng.random() < rate:
            op = rng.randrange(4)
            if op == 0 and i + 1 < len(text):
                out += [text[i + 1], c]
                i += 2
                continue
            sub = substitute(c) if draw_always or op in (0, 3) else ""
            out += [] if op == 1 else [c, c] if op == 2 else [sub]
        else:
            out.append(c)
        i += 1
    return "".join(out)


def add_typos(raw: bytes, rng: random.Random, rate: float = 0.02) -> bytes:
    """Character-level typos at `rate` per character: swaps, deletions, insertions and substitutions."""
    text = raw.decode("utf-8", errors="ignore")
    return typo_text(text, rng, rate, lambda _: rng.choice("abcdefghijklmnopqrstuvwxyz")).encode("utf-8")


def insert_filler(article: bytes, filler: bytes, where: str, rng: random.Random) -> bytes:
    """`where`: 'start', 'end', 'both' (filler split around the article) or 'middle' (the article split once
    at a line or sentence break, the filler between its parts)."""
    sep = b"\n\n"
    if where == "start":
        return filler + sep + article
    if where == "end":
        return article + sep + filler
    if where == "both":
        cut = rng.randrange(len(filler) + 1)
        return filler[:cut] + sep + article + sep + filler[cut:]
    if where == "middle":
        breaks = [m.end() for m in re.finditer(rb"[.!?\n]\s", article)] or [len(article) // 2]
        cut = rng.choice(breaks)
        return article[:cut] + sep + filler + sep + article[cut:]
    raise ValueError(f"where must be 'start', 'end', 'both' or 'middle', got {where!r}")


@dataclass
class TextAugment:
    """Per training window, each perturbation with its probability; filler of `filler_min_ratio` to
    `filler_max_ratio` times the window's length (log-uniform), the whole window capped at `max_total` bytes."""

    case_prob: float = 0.2
    whitespace_prob: float = 0.2
    markup_prob: float = 0.1
    typo_prob: float = 0.1
    filler_prob: float = 0.5
    filler_min_ratio: float = 0.25
    filler_max_ratio: float = 8.0
    max_total: int = 24576
    where: tuple[str, ...] = ("start", "end", "both", "middle")
    bank: FillerBank | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("case_prob", "whitespace_prob", "markup_prob", "typo_prob", "filler_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {getattr(self, name)}")
        if not 0.0 < self.filler_min_ratio <= self.filler_max_ratio:
            raise ValueError("filler ratios must satisfy 0 < filler_min_ratio <= filler_max_ratio")

    def __call__(self, raw: bytes, rng: random.Random) -> bytes:
        if not raw:
            return raw
        if rng.random() < self.case_prob:
            raw = change_case(raw, rng)
        if rng.random() < self.whitespace_prob:
            raw = change_whitespace(raw, rng)
        if rng.random() < self.markup_prob:
            raw = add_markup(raw, rng)
        if rng.random() < self.typo_prob:
            raw = add_typos(raw, rng, rate=rng.uniform(0.005, 0.04))
        if rng.random() < self.filler_prob and len(raw) < self.max_total:
            bank = self.bank or FillerBank.installed()
            lo, hi = self.filler_min_ratio, self.filler_max_ratio
            ratio = lo * (hi / lo) ** rng.random()
            n = min(int(len(raw) * ratio), self.max_total - len(raw))
            if n > 0:
                raw = insert_filler(raw, bank.sample(rng, n), rng.choice(self.where), rng)
        return raw
