"""`lara train DATA --out DIR --init lara-text-news`: a pretrained word-piece encoder kept frozen, a head on it.

The byte encoder of `lara train` is trained; a converted pretrained encoder (`lara-text-news`: all-MiniLM-L6-v2
read through LARA in every layer, lara_serve.model_export.pretrained) already reads English, so it stays frozen.
Every training, holdout and test document is read once, whole (its first max_length word pieces: the served
model reads a longer one the same way, config.json preprocessing.truncate = "head"), to the unit-length means of
the embeddings' output and of every layer's, concatenated (readout "layers", bert_lara.layer_means). A max_length
above the --init model's own (16,384) reads in windows of the encoder's 510 learned positions (each its own
[CLS] ... [SEP]), keeps the whole graph at 16,384 and exports a sliced program for longer documents
(Frozen.after_export, export.sliced_windows). A
logistic-regression head is fitted on them, its C chosen by holdout log-loss (pretrained.classifier.fit_head,
over LAYERS_C_GRID); the ood score reads the last layer's mean, as `lara-text-news`'s does; the temperature and
the ood score are those of
every `lara train` run (artifact.finish -> head.finalize), the ood fit on the bounded sample of budget.ood_sample.
The folder is a word-piece model as `lara-text-news` is: preprocessing kind "wordpiece", the --init model's
tokenizer.json, float16 storage (pretrained.classifier.save_half), the ONNX export with its parity check.

The wide path is the byte model's (Wide & Deep: a tf-idf logistic regression, min_df and C by cross-validation,
wide.fit_wide) over word-piece 1-2-grams instead of byte words (bert_lara.PieceTfidfHead: the graph reads pieces,
not bytes). It is blended with the encoder's head by holdout NLL, and the best of the blend and each part alone
on the holdout is served (wide.choose_served, the byte model's rule); config.json metrics.parts scores each part.

The budget: before any work every document is tokenized and a few training documents are embedded (the probe);
with the word pieces of each part that gives each phase's estimate (budget.Plan), and a budget that cannot
hold the whole run is refused with the least one that can. A frozen encoder has no epochs to cut short.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lara_serve.model_export.head.finalize import TEXT_HEADS
from lara_serve.model_export.models.bert_lara import LaraBertClassifier, PieceTfidfHead
from lara_serve.model_export.models.config import BertTextConfig
from lara_serve.model_export.models.hub import TOKENIZER_FILE, load_config, load_pretrained
from lara_serve.model_export.models.ood import ServingModel
from lara_serve.model_export.models.registry import get_config
from lara_serve.model_export.pretrained.classifier import fit_head, save_half
from lara_serve.model_export.pretrained.teacher import WordPieces, pad_pieces
from lara_serve.model_export.your_data import budget, recipe
from lara_serve.model_export.your_data import wide as userwide
from lara_serve.model_export.your_data.baseline import TEXT_BASELINE, text_baseline
from lara_serve.model_export.your_data.fit import BudgetTooSmall, FitState
from lara_serve.model_export.your_data.options import DEFAULT_ARCH, NOT_FOR_FROZEN, UsageError, resolve_init

WORD_PIECE_ARCH = BertTextConfig.arch  # config.json model.arch of a model this path takes as --init
BATCH_PIECES = 4096  # padded pieces per encoder batch (documents sorted by length), as the shipped build's
# What a run whose budget cannot read every document whole reads instead: the longest of these that fits (at
# least the teacher's own 512 positions; less would read a headline and little more).
FIT_LENGTHS = (8192, 4096, 2048, 1024, 512)
PROBE_PIECES, PROBE_DOCS = 4096, 32  # the probe embeds a seeded few training documents, this many at most
# CPU seconds of the phases that do not grow with the data, measured on one core of the shared machine and
# rounded up: the export of lara-text-news's 22 M parameters with its parity run up to 16,384 pieces (32 s).
EXPORT_S = 45.0
# The sliced program of a run reading past the whole graph (--max-length above 16,384): its export and its parity
# against torch at five lengths up to 3 slices, 50 s for lara-text-news's on one core of the shared machine.
PROGRAM_EXPORT_S = 60.0
# --int8 (your_data.quantized): quantizing the float graph (53 MB with the catalogs' wide table) and reading the
# holdout and test documents through the int8 graph took 8.6 s in all on one core (2,000 messages; 560 of them
# read), so 30 s for the fixed part leaves room for a slower machine; the reading is also charged at the probe's
# rate (the frozen float encoder's; the int8 graph reads 1.5-1.7x faster: benchmarks/results/train_int8_cost.json).
INT8_S, INT8_READ_FACTOR = 30.0, 1.0
# The head's fit: seven logistic regressions (LAYERS_C_GRID) on [N, 7 x 384] layer means, and the report's scoring
# of the wide path, per training document and class (at least 2): the fit alone measured 3.0 s for 1,440 subject
# lines of 2 classes, 8.3 s for 900 e-mails of 3, 36.6 s for 1,440 messages of 5 (5.1e-3 s; one thread); the
# whole phase 81 s for those messages in benchmarks.your_data, two runs sharing 2 cores (1.1e-2 s).
HEAD_S_PER_DOC_CLASS = 1.2e-2
# The head reads every hidden state's mean (7 x 384 columns for MiniLM-L6): chosen on the user-like sets' holdouts
# over the last layer's mean alone, the embeddings' and the last, and every other layer (research/
# frozen_layer_means.py). With 7x the columns the holdout picked C at the old grid's top (100) on the messages, so
# the grid goes on to 1,000.
READOUT = "layers"
LAYERS_C_GRID = (1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)


def applies(args: argparse.Namespace) -> bool:
    """Whether --init names a word-piece model (a converted pretrained encoder): then this path runs."""
    if not args.init or args.init == "none":
        return False
    model = load_config(resolve_init(args.init)).get("model") or {}
    return model.get("arch") == WORD_PIECE_ARCH


def check_options(args: argparse.Namespace, task: str) -> None:
    """UsageError for what a frozen word-piece encoder cannot do, before anything is loaded."""
    name = f"--init {args.init}"
    if task != "text":
        raise UsageError(f"{name} is a word-piece text encoder and {args.data} holds {task}s; for images use "
                         "--init none or an image model (lara-vit-fashion)")  # fmt: skip
    for key, why in NOT_FOR_FROZEN.items():
        if getattr(args, key) not in (None, False):
            raise UsageError(f"--{key.replace('_', '-')} does not apply to {name}: {why}; drop it")
    if args.pooling != recipe.POOLING:
        raise UsageError(f"--pooling {args.pooling} does not apply to {name}: the head reads the frozen encoder's "
                         "layer means (the mean of each of its hidden states); drop --pooling")  # fmt: skip


@dataclasses.dataclass
class Frozen:
    """A frozen-encoder run as artifact.finish reads it (the fields of prepare.Prepared it uses), plus each
    part's documents ("train", "holdout", "test", "heads": the ood sample's first TEXT_HEADS bytes) and pieces."""

    data: Any  # loader.UserData
    test: Any
    split: Any  # loader.Split
    names: list[str]
    model: LaraBertClassifier
    cfg: BertTextConfig
    init: Path
    hp: dict[str, Any]
    tok: WordPieces
    docs: dict[str, list[bytes]]
    labels: dict[str, np.ndarray]  # "train", "holdout", "test"
    ood_sample: list[int]  # indices into docs["train"]
    heads: list[tuple[int, int]]  # docs["heads"][j] is docs["train"][i][:n] for (i, n) = heads[j]
    no_wide: bool
    no_baseline: bool
    seed: int
    fit_length: bool = False  # no --max-length given: a budget too small to read whole reads each document's head
    whole_length: int = 16384  # the --init model's max_length: the longest document its whole graph reads
    int8: bool = False  # --int8: the graph served with int8 weights, the head refitted on it (your_data.quantized)
    seqs: dict[str, list[list[int]]] = dataclasses.field(default_factory=dict)
    full: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # whole lengths in pieces
    cached: dict[str, tuple[Tensor, Tensor, Tensor]] = dataclasses.field(default_factory=dict)
    baseline_result: tuple[np.ndarray, str, float] | None = None
    parts: dict[str, Any] | None = None
    input_scores: None = None  # the input-space ood score reads byte ids: a word-piece graph has none
    read: dict[str, Tensor] = dataclasses.field(default_factory=dict)  # what the head reads, per part (_fit_head)

    @property
    def test_y(self) -> np.ndarray:
        return self.labels["test"]

    @property
    def test_texts(self) -> list[bytes]:
        return self.docs["test"]

    def outputs(self, model: Any, part: str) -> tuple[Tensor, Tensor, Tensor]:
        """(logits [N, C], last-layer mean embeddings [N, D], labels [N]) of "train" (the ood sample, whole and its
        heads), "holdout" or "test", computed once by `fit`."""
        del model  # the frozen encoder's features are computed once; the head is the model's
        return self.cached[part]

    def baseline(self, secs: float) -> tuple[np.ndarray, str, float]:
        del secs  # a linear model, fitted before the encoder read the data
        assert self.baseline_result is not None
        return self.baseline_result

    def save(self, model: LaraBertClassifier, conf: dict[str, Any], out: Path, serving: ServingModel) -> None:
        """Weights as the shipped word-piece model stores them (float16 where exact) and its tokenizer. A run that
        read past the --init model's whole graph (--max-length above it) saves that length as the whole graph's:
        `after_export` gives the longer documents their sliced program."""
        if self.cfg.max_length > self.whole_length:
            conf["model"]["max_length"] = conf["preprocessing"]["max_length"] = self.whole_length
        save_half(model, conf, out, serving)
        shutil.copyfile(self.init / TOKENIZER_FILE, out / TOKENIZER_FILE)

    def after_export(self, out: Path) -> None:
        """Documents longer than the whole graph's length: the sliced program (int8 when the whole graph is, with
        --int8; float otherwise), and config.json preprocessing.max_length back to what this run read."""
        if self.cfg.max_length > self.whole_length:
            from lara_serve.model_export.export.sliced_windows import export_windows_dir

            export_windows_dir(out, max_length=self.cfg.max_length)  # int8 when the whole graph is (--int8)


def prepare(args: argparse.Namespace, d: Any) -> Frozen:
    """The frozen encoder with a new head for d's labels (d: prepare._Labelled), and every part's documents."""
    init = resolve_init(args.init)
    assert init is not None  # applies() said so
    check_options(args, d.data.task)
    if not (init / TOKENIZER_FILE).is_file():
        raise UsageError(f"--init {args.init}: a word-piece model needs its {TOKENIZER_FILE} in {init}")
    base = load_pretrained(init)
    # the layers' means over the whole document, as `embed` reads for the head: the --init model's pool and window
    # gate are its own head's readout (fitted on news with filler), not this one's. A run reading past the --init
    # model's length reads in windows of its learned positions instead: windows are what a sliced program can cut
    # (export.sliced_windows), and the whole graph never holds more than the --init model's length. Not by
    # default: windows cost 1.19x on e-mails read to 1,024 pieces, 1.10x to 4,096 (the last window of a text is
    # padded; research/frozen_windows_cost.py), and scored the same on the e-mails' holdout (93 vs 91%, n=100;
    # research/results/frozen_layer_means_windows.json).
    max_length = args.max_length or base.cfg.max_length
    window = base.cfg.max_positions - 2 if max_length > base.cfg.max_length else 0
    cfg = dataclasses.replace(base.cfg, num_classes=len(d.names), readout=READOUT, window=window, window_gate=0.0,
                              max_length=max_length)  # fmt: skip
    model = LaraBertClassifier(cfg, seed=int(load_config(init).get("seed", 0)))
    model.encoder.load_state_dict(base.encoder.state_dict(), strict=True)  # the head stays fresh (fitted later)
    model.requires_grad_(False).eval()
    data, test, split = d.data, d.test, d.split
    train = [data.texts[i] for i in split.train]
    sample = budget.ood_sample([len(r) for r in train], args.seed)
    heads = [(i, n) for n in TEXT_HEADS for i in sample if len(train[i]) > n]  # shorter: the whole text again
    docs = {"train": train, "holdout": [data.texts[i] for i in split.holdout],
            "test": [test.texts[i] for i in d.test_idx], "heads": [train[i][:n] for i, n in heads]}  # fmt: skip
    labels = {"train": d.y_all[split.train], "holdout": d.hold_y, "test": d.test_y}
    median = statistics.median(len(r) for r in train)
    hp = {
        "arch": init.name,
        "recipe": f"frozen word-piece encoder ({init.name}), each document read whole up to {cfg.max_length:,} "
        "pieces to the unit mean of each hidden state, a logistic-regression head (lara_serve.model_export.your_data."
        "pretrained_init)",
        "recipe_choice": {"recipe": f"frozen {init.name} encoder + logistic-regression head", "median_bytes": median,
                          "rule": "--init names a word-piece model: its encoder is read, not trained; a wide path on "
                          "word-piece grams is blended with it, and the holdout's best of the two and their blend "
                          "is served"},
        "schedule": "none (the encoder is frozen; the head is a logistic regression)",
        "augment": False,
        "ood_fit": {"documents": len(sample), "of": len(train), "bytes": sum(len(train[i]) for i in sample),
                    "at_most": {"documents": budget.OOD_FIT_DOCS, "bytes": budget.OOD_FIT_BYTES}},
    }  # fmt: skip
    return Frozen(data, test, split, d.names, model, cfg, init, hp, WordPieces.from_dir(init), docs, labels, sample,
                  heads, args.no_wide, args.no_baseline, args.seed, fit_length=args.max_length is None,
                  whole_length=base.cfg.max_length, int8=bool(getattr(args, "int8", False)))  # fmt: skip


# -- word pieces, embeddings, the probe ----------------------------------------------------------------------


def tokenize(prep: Frozen) -> dict[str, int]:
    """Every document's pieces as the server makes them: [CLS] + its first max_length - 2 pieces + [SEP]. Returns
    how many documents of each part were longer (read by their head)."""
    keep, cut = prep.cfg.max_length - 2, {}
    for part, raws in prep.docs.items():
        bodies = [prep.tok.pieces(r.decode("utf-8", errors="ignore")) for r in raws]  # heads may split a char
        prep.seqs[part] = [prep.tok.wrap(b[:keep]) for b in bodies]
        prep.full[part] = [len(b) + 2 for b in bodies]  # each document's whole length, [CLS] and [SEP] included
        cut[part] = sum(len(b) > keep for b in bodies)
    return cut


@torch.inference_mode()
def embed(prep: Frozen, seqs: Sequence[Sequence[int]], bar: Any = None) -> tuple[Tensor, Tensor]:
    """(what the head reads [N, blocks * D], the last layer's unit mean [N, D]) of piece sequences, batched by
    length as pretrained.classifier.embed is (a document's features do not depend on its batch: tested), in input
    order."""
    model = prep.model
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    read, pooled = torch.zeros(len(seqs), model.head.in_features), torch.zeros(len(seqs), prep.cfg.dim)
    i = 0
    while i < len(order):
        j = i + 1  # ascending lengths: the batch grows while its longest (last) text times its size fits
        while j < len(order) and (j - i + 1) * len(seqs[order[j]]) <= BATCH_PIECES:
            j += 1
        idx = order[i:j]
        ids, mask = pad_pieces([seqs[k] for k in idx], prep.tok.pad_id)
        x = model.forward_features(ids, mask)  # with windows: every window's slots, read_mask the real ones
        read[idx], pooled[idx] = model.head_features(x, model.read_mask(mask)), model.forward_pooled(x, mask)
        if bar is not None:
            bar.update(len(idx))
        i = j
    return read, pooled


def probe_rate(prep: Frozen, clock: Callable[[], float]) -> float:
    """Seconds per word piece of embedding here: a seeded few training documents (PROBE_PIECES at most, a long
    one cut), after one warm-up document (the first call pays one-time costs)."""
    order = list(range(len(prep.seqs["train"])))
    random.Random(prep.seed).shuffle(order)
    taken, pieces = [], 0
    for i in order[:PROBE_DOCS]:
        taken.append(prep.seqs["train"][i][: PROBE_PIECES - pieces])
        pieces += len(taken[-1])
        if pieces >= PROBE_PIECES:
            break
    embed(prep, taken[:1])
    t0 = clock()
    embed(prep, taken)
    return (clock() - t0) / max(pieces, 1)


def plan(prep: Frozen, phases: budget.Phases, budget_min: float, clock: str) -> budget.Plan:
    """Tokenize, probe, estimate every phase; BudgetTooSmall (with the least budget) before any work. When the
    whole read does not fit and --max-length was not given, each document is read by its first L pieces, L the
    longest of FIT_LENGTHS that fits (the served model reads the same L); a warning says so."""
    with phases.phase("probe"):
        cut = tokenize(prep)
        rate = probe_rate(prep, phases.clock)
    probe_s = phases.elapsed()  # imports, reading the data, loading the encoder, tokenizing, the probe
    est = _estimate(prep, rate, probe_s)
    whole = prep.cfg.max_length
    if est.least_budget_min() > budget_min and prep.fit_length:
        for length in (n for n in FIT_LENGTHS if n < whole):
            cut = _cut_to(prep, length)
            est = _estimate(prep, rate, probe_s)
            if est.least_budget_min() <= budget_min:
                print(f"warning: reading every document whole (up to {whole:,} word pieces) needs more than "
                      f"--time-budget {budget_min:g} min; this run reads each document's first {length:,} pieces "
                      f"and so does the served model (config.json preprocessing.max_length); give --time-budget "
                      f"{_estimate_at(prep, rate, probe_s, whole):g} to read them whole", file=sys.stderr)  # fmt: skip
                prep.hp["length_fitted_to_budget"] = {"max_length": length, "whole": whole}
                break
    least = est.least_budget_min()
    if least > budget_min:
        pieces, n = _pieces(prep), len(prep.docs["train"])
        raise BudgetTooSmall(
            f"--time-budget {budget_min:g} min is too small for the frozen {prep.init.name} encoder to read this "
            f"data with the rest of the run (estimated on the {clock} clock: {est.probe_s:.0f} s so far, reading the "
            f"{n:,} training documents ({pieces['train']:,} word pieces) {est.epoch_s:.0f} s, wide path "
            f"{est.wide_s:.0f} s, baseline {est.baseline_s:.0f} s, the holdout, test and ood documents, the head, "
            f"export{', the int8 step' if prep.int8 else ''} and report {est.after_s:.0f} s); use --time-budget "
            f"{least:g} or more",
            least,
        )
    prep.hp["budget_plan_s"] = {**est.record(), "seconds_per_piece": float(f"{rate:.3g}")}
    prep.hp["pieces"] = {**_pieces(prep), "longer_than_max_length": cut}
    _warn_long(prep, cut)
    return est


def _pieces(prep: Frozen) -> dict[str, int]:
    return {part: sum(map(len, seqs)) for part, seqs in prep.seqs.items()}


def _estimate(prep: Frozen, rate: float, probe_s: float, pieces: dict[str, int] | None = None) -> budget.Plan:
    """Each phase's seconds for `pieces` read in each part (default: what prep.seqs holds; reading is linear)."""
    pieces = pieces or _pieces(prep)
    n, classes = len(prep.docs["train"]), len(prep.names)
    train_bytes = sum(len(r[: _byte_length()]) for r in prep.docs["train"])
    return budget.Plan(
        probe_s=probe_s,
        wide_s=0.0 if prep.no_wide else budget.wide_s(train_bytes, n, classes),
        baseline_s=0.0 if prep.no_baseline else budget.baseline_s(train_bytes, n, classes),
        epoch_s=budget.SAFETY * rate * pieces["train"],
        after_s=budget.SAFETY * (rate * (pieces["holdout"] + pieces["test"] + pieces["heads"])
                                 + HEAD_S_PER_DOC_CLASS * n * max(classes, 2)) + EXPORT_S + budget.REPORT_S
                 + (PROGRAM_EXPORT_S if prep.cfg.max_length > prep.whole_length else 0.0)
                 + (INT8_S + budget.SAFETY * INT8_READ_FACTOR * rate * (pieces["holdout"] + pieces["test"])
                    if prep.int8 else 0.0),
    )  # fmt: skip


def _estimate_at(prep: Frozen, rate: float, probe_s: float, length: int) -> float:
    """The least budget (minutes) of reading every document up to `length` pieces (their lengths at tokenizing)."""
    pieces = {part: sum(min(n, length) for n in counts) for part, counts in prep.full.items()}
    return _estimate(prep, rate, probe_s, pieces).least_budget_min()


def _cut_to(prep: Frozen, length: int) -> dict[str, int]:
    """Every sequence cut to [CLS] + its first length - 2 pieces + [SEP]; the config reads the same. Returns how
    many documents of each part are now longer than that."""
    sep = prep.cfg.sep_id
    prep.seqs = {part: [s if len(s) <= length else [*s[: length - 1], sep] for s in seqs]
                 for part, seqs in prep.seqs.items()}  # fmt: skip
    prep.cfg = dataclasses.replace(prep.cfg, max_length=length)
    prep.model.cfg = prep.cfg
    return {part: sum(n > length for n in counts) for part, counts in prep.full.items()}


def _byte_length() -> int:
    """Bytes the wide path and the baseline read of a document: what the default byte model reads."""
    return get_config(DEFAULT_ARCH["text"]).max_length


def _warn_long(prep: Frozen, cut: dict[str, int]) -> None:
    total = cut["train"] + cut["holdout"] + cut["test"]
    if total:
        print(f"warning: {total} of {len(prep.data)} documents in {prep.data.source} are longer than the model's "
              f"{prep.cfg.max_length:,} word pieces; this run reads their first {prep.cfg.max_length:,} pieces, "
              "and so does the served model (config.json preprocessing.truncate = head; a request with "
              "truncate=false gets 413 instead); raise --max-length to read more", file=sys.stderr)  # fmt: skip


# -- the run -------------------------------------------------------------------------------------------------


def fit(prep: Frozen, phases: budget.Phases, progress: str) -> FitState:
    """The wide path (on word pieces) and the baseline, every document read once, the head, the served blend;
    tokenize() first."""
    wide = None
    if not prep.no_wide:
        with phases.phase("wide"):
            head = PieceTfidfHead.for_config(prep.cfg, userwide.wide_buckets(len(prep.names)))
            wide = head, userwide.fit_wide(head, prep.seqs["train"], prep.labels["train"].tolist(), len(prep.names))
    if not prep.no_baseline:
        with phases.phase("baseline"):
            probs, fit_s = text_baseline(prep.docs["train"], prep.labels["train"].tolist(), prep.docs["test"])
            prep.baseline_result = probs, TEXT_BASELINE, fit_s
    with phases.phase("embedding"):
        feats = _embed_all(prep, progress)
    with phases.phase("head"):
        z = _fit_head(prep, feats)
        if wide is not None:
            prep.parts = attach_wide(prep, *wide, z)
    return FitState(train_time_s=phases.seconds["embedding"] + phases.seconds["head"], history=[])


def _embed_all(prep: Frozen, progress: str) -> dict[str, tuple[Tensor, Tensor]]:
    total = sum(map(len, prep.seqs.values()))
    bar = None
    if progress == "bar":
        from tqdm import tqdm

        bar = tqdm(total=total, desc="reading documents", unit="doc", dynamic_ncols=True, mininterval=1.0,
                   leave=False)  # fmt: skip
    try:
        feats = {part: embed(prep, seqs, bar) for part, seqs in prep.seqs.items()}
    finally:
        if bar is not None:
            bar.close()
    if progress == "json":
        print(json.dumps({"event": "embedded", "documents": total, "pieces": prep.hp["pieces"]}), flush=True)
    return feats


def two_columns(weight: Tensor, bias: Tensor, classes: int) -> tuple[Tensor, Tensor]:
    """A binary logistic regression's one score column ([1, D], [1]) as two ([2, D], [2]): -z/2 for class 0,
    +z/2 for class 1, whose softmax is its sigmoid; any other head as it is."""
    if classes == 2 and weight.shape[0] == 1:
        return torch.cat([-weight / 2, weight / 2]), torch.cat([-bias / 2, bias / 2])
    return weight, bias


def _fit_head(prep: Frozen, feats: dict[str, tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    """The head on the training features (C by holdout log-loss), installed in the model; each part's
    (logits, last-layer means, labels) cached for the serving head (its ood score reads those means), and what
    the head reads in prep.read. Returns the holdout and test logits."""
    y = {part: torch.from_numpy(np.asarray(v)) for part, v in prep.labels.items()}
    prep.read = {part: f[0] for part, f in feats.items()}
    weight, bias, notes = fit_head(prep.read["train"], y["train"], prep.read["holdout"], y["holdout"], LAYERS_C_GRID)
    weight, bias = two_columns(weight, bias, len(prep.names))
    head = prep.model.head
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(bias)
        where = {pair: j for j, pair in enumerate(prep.heads)}

        def ood_rows(k: int) -> Tensor:  # the ood sample whole, then each of its heads (the whole if shorter)
            return torch.cat([feats["train"][k][prep.ood_sample]] + [
                torch.stack([feats["heads"][k][where[(i, n)]] if (i, n) in where else feats["train"][k][i]
                             for i in prep.ood_sample]) for n in TEXT_HEADS])  # fmt: skip

        y_ood = y["train"][prep.ood_sample].repeat(1 + len(TEXT_HEADS))
        prep.cached = {"train": (head(ood_rows(0)), ood_rows(1), y_ood)}
        for part in ("holdout", "test"):
            prep.cached[part] = (head(prep.read[part]), feats[part][1], y[part])
    prep.hp["head"] = notes
    return {part: prep.cached[part][0] for part in ("holdout", "test")}


def attach_wide(prep: Frozen, head: PieceTfidfHead, fit: userwide.WideFit, z: dict[str, Tensor]) -> dict[str, Any]:
    """Blend the frozen encoder's head with the wide path (weights by holdout NLL), serve the best of the blend
    and each part alone on the holdout (wide.choose_served, as the byte model does), install it in the model and
    its config, and re-cache the served holdout and test logits for the temperature. Returns config.json
    metrics.parts."""
    z_enc = {part: z[part].double().numpy() for part in ("holdout", "test")}
    f_wide = {part: userwide.features(head, prep.seqs[part]) for part in ("holdout", "test")}
    z_wide = {part: fit.logits(f_wide[part]) for part in ("holdout", "test")}
    (sa, sb), parts = userwide.blend_parts(z_enc, z_wide, prep.labels["holdout"], prep.labels["test"])
    if sb:  # the encoder alone (b = 0) leaves the graph without a wide path: nothing to compute
        prep.cfg = dataclasses.replace(prep.cfg, tfidf_buckets=head.buckets)
        prep.model.cfg = prep.cfg
        userwide.install(prep.model, head, fit, sa, sb)
    with torch.no_grad():  # the served logits: a * (encoder head) + b * (wide, its intercept in the head's bias)
        for part in ("holdout", "test"):
            _, f, y = prep.cached[part]
            wide_part = torch.from_numpy(sb * np.asarray(f_wide[part] @ fit.coef.T)).to(f.dtype)
            prep.cached[part] = (prep.model.head(prep.read[part]) + wide_part, f, y)
        # "train" keeps the encoder head's logits: the serving head reads only its features (the ood fit)
    parts["wide"].update(buckets=head.buckets, grams="word-piece 1-2-grams", **fit.choice.record())
    return parts
