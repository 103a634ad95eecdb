"""A head that unrelated text around an article cannot outvote (issue 53: filler robustness).

The converted encoder's masked mean gives every word piece one vote: an article with 10 KB of filler around
it was read as the filler (26% correct, 19% at 20 KB). Here the head reads `bert_lara.AttentionPool`, whose
score is trained, with the head, on articles with filler around them, so that the pieces that carry the
topic outweigh the rest.

Training reads token vectors, not text: each training text (article, headline, lead, long form) and each
filler passage is read once by the frozen encoder, alone, and its final token vectors are kept (float16).
A composite is then the union of an article's vectors and a stretch of a filler's: the pool is order-free,
so where the filler sits does not matter to it. What this leaves out is the encoder's own mixing across the
two (an article's vectors read beside filler differ a little from its vectors read alone); the build checks
the result on real composites, read whole by the encoder (`classifier.real_composites`).

Filler is the trainer's own (`training.augment.FillerBank`: installed code, package descriptions, licences,
generated markup, word salad, made-up languages; translated manual pages; English prose of no news topic from
four Brown genres), never the robustness suite's sources; the holdout's composites use filler passages the fit
never saw.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm import tqdm

from lara_serve.model_export.models.bert import BertEncoder
from lara_serve.model_export.pretrained.teacher import WordPieces, pad_pieces

BATCH_PIECES = 4096  # pieces per encoder batch (texts sorted by length, so padding is small)


@dataclass
class TokenSet:
    """Final token vectors of many texts, flat: text i holds states[offsets[i]:offsets[i+1]] ([CLS] and [SEP]
    included, as the served model pools them)."""

    states: Tensor  # [T, D] float16
    offsets: Tensor  # [N + 1] int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def rows(self, i: int) -> Tensor:
        return self.states[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def lengths(self) -> Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def join(self, other: TokenSet) -> TokenSet:
        """This set's texts, then other's."""
        offsets = torch.cat([self.offsets, other.offsets[1:] + self.offsets[-1]])
        return TokenSet(torch.cat([self.states, other.states]), offsets)

    def means(self) -> Tensor:
        """Unit-length masked means [N, D] (what the mean readout and the ood score read)."""
        seg = torch.repeat_interleave(torch.arange(len(self)), self.lengths())
        sums = torch.zeros(len(self), self.states.shape[1]).index_add_(0, seg, self.states.float())
        return nn.functional.normalize(sums, dim=-1)


def length_batches(lengths: Sequence[int], desc: str) -> Iterator[list[int]]:
    """Indices of texts in batches of at most BATCH_PIECES padded pieces, shortest first (so padding is small),
    with a progress bar."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    with tqdm(total=len(order), desc=desc, unit="text", leave=False) as bar:
        i = 0
        while i < len(order):
            j = i + 1  # ascending lengths: the batch grows while its longest (last) text times its size fits
            while j < len(order) and (j - i + 1) * lengths[order[j]] <= BATCH_PIECES:
                j += 1
            yield order[i:j]
            bar.update(j - i)
            i = j


def read_tokens(reader: nn.Module, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(token vectors, which rows the readout pools) of padded rows: an encoder's rows are the pieces; a
    windowed classifier's are its windows' (LaraBertClassifier.forward_features and read_mask)."""
    if isinstance(reader, BertEncoder):
        return reader(x, mask), mask
    return reader.forward_features(x, mask), reader.read_mask(mask)


@torch.no_grad()
def token_states(reader: nn.Module, tok: WordPieces, texts: Sequence[str], max_length: int, desc: str) -> TokenSet:
    """Each text read alone (whole as `classifier.embed` by an encoder, or in windows by a windowed
    classifier), the token vectors its readout pools kept."""
    ids = [tok.encode(t, max_length) for t in texts]
    kept: list[Tensor | None] = [None] * len(ids)
    for idx in length_batches([len(i) for i in ids], desc):
        x, mask = pad_pieces([ids[k] for k in idx], tok.pad_id)
        h, read = read_tokens(reader, x, mask)
        for row, k in enumerate(idx):
            kept[k] = h[row][read[row].bool()].half()
    lengths = torch.tensor([len(t) for t in kept if t is not None])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return TokenSet(torch.cat([k for k in kept if k is not None]), offsets)


@dataclass(frozen=True)
class CompositeRecipe:
    """Per training item: with probability `prob`, filler of `min_ratio` to `max_ratio` times the text's own
    pieces (log-uniform) is added from one or more filler passages (a random stretch of each)."""

    prob: float = 0.5
    min_ratio: float = 0.25
    max_ratio: float = 8.0


def filler_rows(fillers: TokenSet, count: int, rng: random.Random) -> Tensor:
    """`count` filler token vectors: random stretches of random passages until enough."""
    parts, got = [], 0
    while got < count:
        f = fillers.rows(rng.randrange(len(fillers)))
        take = min(count - got, len(f))
        start = rng.randrange(len(f) - take + 1)
        parts.append(f[start : start + take])
        got += take
    return torch.cat(parts)


def composite_batch(
    texts: TokenSet, items: Sequence[int], fillers: TokenSet | None, recipe: CompositeRecipe, rng: random.Random
) -> tuple[Tensor, Tensor]:
    """(token vectors [T, D] float32, segment of each row [T]) of the items, some with filler added."""
    rows, seg = [], []
    for b, i in enumerate(items):
        own = texts.rows(i)
        parts = [own]
        if fillers is not None and rng.random() < recipe.prob:
            ratio = math.exp(rng.uniform(math.log(recipe.min_ratio), math.log(recipe.max_ratio)))
            parts.append(filler_rows(fillers, max(1, round(ratio * len(own))), rng))
        n = sum(len(p) for p in parts)
        rows.extend(parts)
        seg.append(torch.full((n,), b, dtype=torch.long))
    return torch.cat(rows).float(), torch.cat(seg)


def pooled_logits(pool_w: Tensor, pool_b: Tensor, head: nn.Linear, x: Tensor, seg: Tensor, n: int) -> Tensor:
    """AttentionPool + head over segments (flat rows): the same arithmetic as the served graph's padded form."""
    s = x @ pool_w + pool_b  # [T]
    top = torch.full((n,), -torch.inf).scatter_reduce(0, seg, s, "amax")
    e = torch.exp(s - top[seg])
    num = torch.zeros(n, x.shape[1]).index_add(0, seg, e[:, None] * x)
    den = torch.zeros(n).index_add(0, seg, e)
    return head(nn.functional.normalize(num / den[:, None], dim=-1))


@dataclass
class FittedPool:
    pool_weight: Tensor  # [1, D]
    pool_bias: Tensor  # [1]
    head_weight: Tensor  # [C, D]
    head_bias: Tensor  # [C]
    notes: dict


def fit_pool(
    fit: tuple[TokenSet, Tensor],
    val: tuple[TokenSet, Tensor],
    fillers: tuple[TokenSet, TokenSet],
    init: tuple[Tensor, Tensor],
    recipe: CompositeRecipe = CompositeRecipe(),
    steps: int = 3000,
    batch: int = 32,
    lr: float = 2e-3,
    weight_decay: float = 1e-4,
    seed: int = 0,
) -> FittedPool:
    """Train the pool's score and the head (from `init`, the mean-pool head: the score starts at zero, the
    mean) on `fit` texts with filler from fillers[0]; every 250 steps the holdout's log-loss is measured on
    its texts with filler from fillers[1] (a fixed draw), and the best state is kept."""
    (fit_set, y_fit), (val_set, y_val) = fit, val
    torch.manual_seed(seed)
    rng = random.Random(seed)
    d = fit_set.states.shape[1]
    pool_w, pool_b = torch.zeros(d, requires_grad=True), torch.zeros((), requires_grad=True)
    head = nn.Linear(d, init[0].shape[0])
    with torch.no_grad():
        head.weight.copy_(init[0])
        head.bias.copy_(init[1])
    opt = torch.optim.AdamW([pool_w, pool_b, *head.parameters()], lr=lr, weight_decay=weight_decay)
    # the holdout's draw, fixed: the same composites at every check
    val_rng = random.Random(seed + 1)
    val_batches = [
        composite_batch(val_set, range(i, min(i + 64, len(val_set))), fillers[1], recipe, val_rng)
        for i in range(0, len(val_set), 64)
    ]

    def val_loss() -> tuple[float, float]:
        with torch.no_grad():
            z = torch.cat([pooled_logits(pool_w, pool_b, head, x, s, int(s.max()) + 1) for x, s in val_batches])
            return float(nn.functional.cross_entropy(z, y_val)), float((z.argmax(1) == y_val).double().mean())

    best = (*val_loss(), 0, _state(pool_w, pool_b, head))
    history = [{"step": 0, "holdout_log_loss": round(best[0], 4), "holdout_accuracy": round(best[1], 4)}]
    for step in tqdm(range(1, steps + 1), desc="pool", leave=False):
        items = [rng.randrange(len(fit_set)) for _ in range(batch)]
        x, seg = composite_batch(fit_set, items, fillers[0], recipe, rng)
        loss = nn.functional.cross_entropy(pooled_logits(pool_w, pool_b, head, x, seg, batch), y_fit[items])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 250 == 0:
            vl, va = val_loss()
            history.append({"step": step, "holdout_log_loss": round(vl, 4), "holdout_accuracy": round(va, 4)})
            if vl < best[0]:
                best = (vl, va, step, _state(pool_w, pool_b, head))
    _, _, best_step, state = best
    notes = {"steps": steps, "best_step": best_step, "batch": batch, "lr": lr, "weight_decay": weight_decay,
             "recipe": recipe.__dict__, "history": history}  # fmt: skip
    return FittedPool(*state, notes=notes)


def _state(pool_w: Tensor, pool_b: Tensor, head: nn.Linear) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (pool_w.detach().clone()[None], pool_b.detach().clone().reshape(1),
            head.weight.detach().clone(), head.bias.detach().clone())  # fmt: skip


def pool_logits(fitted: FittedPool, texts: TokenSet, chunk: int = 256) -> Tensor:
    """The fitted pool and head on each text alone (no filler) -> logits [N, C]."""
    head = nn.Linear(fitted.head_weight.shape[1], fitted.head_weight.shape[0])
    with torch.no_grad():
        head.weight.copy_(fitted.head_weight)
        head.bias.copy_(fitted.head_bias)
        out = []
        for i in range(0, len(texts), chunk):
            items = range(i, min(i + chunk, len(texts)))
            x, seg = composite_batch(texts, items, None, CompositeRecipe(prob=0.0), random.Random(0))
            out.append(pooled_logits(fitted.pool_weight[0], fitted.pool_bias[0], head, x, seg, len(items)))
        return torch.cat(out)


def filler_passages(count: int, seed: int, min_bytes: int = 1000, max_bytes: int = 24_000) -> list[str]:
    """`count` passages of the trainer's filler, lengths log-uniform, each of one kind drawn evenly: every
    FillerBank.installed kind, and where installed two kinds more, translated manual pages (non-English prose)
    and English prose of no news topic (`english_prose`)."""
    from lara_serve.model_export.training.augment import FILLER_KINDS, FillerBank

    bank, rng = FillerBank.installed(), random.Random(seed)
    extra = [texts for texts in (translated_man_pages(), english_prose()) if texts]
    sizes = [round(math.exp(rng.uniform(math.log(min_bytes), math.log(max_bytes)))) for _ in range(count)]
    out = []
    for n in sizes:
        kind = rng.randrange(len(FILLER_KINDS) + len(extra))
        if kind >= len(FILLER_KINDS):
            out.append(_cut_from(extra[kind - len(FILLER_KINDS)], n, rng))
        else:
            out.append(bank.sample(rng, n).decode("utf-8", errors="ignore"))
    return out


# Brown's genre letters whose text the trainer may use as filler: religion (d), skills and hobbies (e), popular
# lore (f) and learned prose (j). Left out: press (a-c, the news itself), government documents (h: politics in
# all but name), fiction (k-r, the robustness suite's out-of-distribution set) and belles-lettres (g), kept
# apart so that a recipe can be chosen on English filler that no build has seen (research/filler_selection.py).
ENGLISH_FILLER_GENRES = "defj"
SELECTION_GENRES = "g"


@cache
def english_prose(letters: str = ENGLISH_FILLER_GENRES) -> tuple[str, ...]:
    """English prose about no news topic in particular: the Brown corpus files of these genre letters (both of
    its splits: here it is filler, not a task). Empty where the corpus is not installed."""
    from lara_serve.model_export.training.brown import BrownUnavailable, load_brown

    try:
        docs = load_brown("all")
    except BrownUnavailable:
        return ()
    return tuple(d.text for d in docs if d.doc_id[1] in letters)


_TROFF_ESCAPE = re.compile(r"\\(?:\(..|\*\(..|\*.|f\[[^]]*\]|f.|s[-+]?\d|[-&|^ e0])")


@cache
def translated_man_pages(root: Path = Path("/usr/share/man"), per_language: int = 200_000) -> tuple[str, ...]:
    """Non-English prose: the installed manual pages' translations (root/<language>/man*/, at most
    `per_language` characters of each language), troff requests and escapes removed. The robustness suite's
    non-English filler is another source (gettext catalogues). Empty where no translation is installed."""
    out, size = [], dict[str, int]()
    for path in sorted(root.glob("[a-z][a-z]*/man*/*.gz")):
        lang = path.parent.parent.name
        if size.get(lang, 0) >= per_language:
            continue
        text = man_page_text(path)
        if len(text) > 500:
            out.append(text)
            size[lang] = size.get(lang, 0) + len(text)
    return tuple(out)


@cache
def english_man_pages(count: int, root: Path = Path("/usr/share/man/man1")) -> tuple[str, ...]:
    """About `count` English section-1 manual pages (every k-th of the sorted list: variety at a bounded
    start-up), troff removed, those of more than 500 characters. Empty where none is installed."""
    paths = sorted(root.glob("*.gz"))
    texts = [man_page_text(p) for p in paths[:: max(1, len(paths) // count)]]
    return tuple(t for t in texts if len(t) > 500)


def man_page_text(path: Path) -> str:
    """A gzipped manual page's text, troff requests and escapes removed ("" when it cannot be read)."""
    import gzip

    try:
        raw = gzip.decompress(path.read_bytes()).decode("utf-8", errors="ignore")
    except (OSError, EOFError):
        return ""
    lines = [_TROFF_ESCAPE.sub("", ln) for ln in raw.splitlines() if ln and ln[0] not in ".'"]
    return "\n".join(ln for ln in lines if ln.strip())


def _cut_from(texts: Sequence[str], n: int, rng: random.Random) -> str:
    """About n characters from a random place, continued by further random texts."""
    parts, size = [], 0
    while size < n:
        parts.append(texts[rng.randrange(len(texts))])
        size += len(parts[-1]) + 1
    joined = "\n".join(parts)
    start = rng.randrange(max(1, len(joined) - n + 1))
    return joined[start : start + n]


def cached(cache: Path | None, name: str, texts: Sequence[str], make: Callable[[], TokenSet]) -> TokenSet:
    """make(), kept under cache/<name>-<sha256 of the texts>.pt when a cache folder is given (the encoder's
    identity is the caller's: one cache folder per student)."""
    if cache is None:
        return make()
    digest = hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()[:16]
    path = cache / f"{name}-{digest}.pt"
    if path.exists():
        d = torch.load(path)
        return TokenSet(d["states"], d["offsets"])
    ts = make()
    cache.mkdir(parents=True, exist_ok=True)
    torch.save({"states": ts.states, "offsets": ts.offsets}, path)
    return ts


# Filler passages read for the fit and (other passages) for the holdout. With 240 / 80 the pool's holdout loss
# was lowest at step 750 of 3,000: each passage came back in about 50 composites.
FIT_FILLERS, VAL_FILLERS = 720, 160


def robust_readout(
    classifier: nn.Module,
    encoder: nn.Module,
    tok: WordPieces,
    tokens: dict[str, TokenSet],
    labels: tuple[Tensor, Tensor],
    max_length: int,
    cache: Path | None,
    seed: int,
    recipe: CompositeRecipe = CompositeRecipe(),
) -> FittedPool:
    """Fit the pool and head (from the classifier's mean-pool head) and set them on the classifier. notes gain
    "holdout_with_filler": (logits, labels) of the holdout with its fixed filler draw, for the temperature."""
    fill = {}
    for name, count, s in (("fillers-fit", FIT_FILLERS, seed + 11), ("fillers-val", VAL_FILLERS, seed + 12)):
        texts = filler_passages(count, s)
        fill[name] = cached(cache, name, texts, lambda t=texts, n=name: token_states(encoder, tok, t, max_length, n))
    init = (classifier.head.weight.detach().clone(), classifier.head.bias.detach().clone())
    fitted = fit_pool((tokens["fit"], labels[0]), (tokens["val"], labels[1]),
                      (fill["fillers-fit"], fill["fillers-val"]), init, recipe, seed=seed)  # fmt: skip
    with torch.no_grad():
        classifier.pool.score.weight.copy_(fitted.pool_weight)
        classifier.pool.score.bias.copy_(fitted.pool_bias)
        classifier.head.weight.copy_(fitted.head_weight)
        classifier.head.bias.copy_(fitted.head_bias)
    fitted.notes["fillers"] = {
        "fit": FIT_FILLERS,
        "holdout": VAL_FILLERS,
        "man_page_texts": len(translated_man_pages()),
        "english_texts": len(english_prose()),
        "english_genres": ENGLISH_FILLER_GENRES,
    }
    fitted.notes["holdout_with_filler"] = holdout_draw(fitted, tokens["val"], labels[1], fill["fillers-val"], seed)
    return fitted


def holdout_draw(fitted: FittedPool, texts: TokenSet, y: Tensor, fillers: TokenSet, seed: int) -> tuple[Tensor, Tensor]:
    """(logits, labels) of the holdout texts, each alone and once more with filler: what the temperature fits."""
    head = nn.Linear(fitted.head_weight.shape[1], fitted.head_weight.shape[0])
    rng = random.Random(seed + 2)
    with torch.no_grad():
        head.weight.copy_(fitted.head_weight)
        head.bias.copy_(fitted.head_bias)
        out = []
        for i in range(0, len(texts), 64):
            items = range(i, min(i + 64, len(texts)))
            x, seg = composite_batch(texts, items, fillers, CompositeRecipe(prob=1.0), rng)
            out.append(pooled_logits(fitted.pool_weight[0], fitted.pool_bias[0], head, x, seg, len(items)))
    return torch.cat([pool_logits(fitted, texts), *out]), torch.cat([y, y])


@torch.no_grad()
def real_composites(
    classifier: nn.Module, tok: WordPieces, texts: Sequence[str], labels: Sequence[int], kb: int, seed: int
) -> dict[str, float | int]:
    """The classifier on holdout articles with `kb` KB of (holdout) filler before or after them, each read
    whole by the encoder, as the server reads it: the check of the token-vector shortcut the fit takes."""
    from lara_serve.model_export.training.augment import FillerBank, insert_filler

    bank, rng = FillerBank.installed(), random.Random(seed)
    correct = 0
    for text, y in zip(texts, labels, strict=True):
        raw = insert_filler(text.encode("utf-8"), bank.sample(rng, kb * 1024), rng.choice(["start", "end"]), rng)
        ids = torch.tensor([tok.encode(raw.decode("utf-8", errors="ignore"), classifier.cfg.max_length)])
        correct += int(classifier(ids, torch.ones_like(ids)).argmax(1).item() == y)
    return {"kb": kb, "n": len(texts), "accuracy": round(correct / max(len(texts), 1), 4)}
