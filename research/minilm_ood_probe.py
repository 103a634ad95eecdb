"""Does `lara-text-news`'s ood_score flag logs, JSON dumps, base64, chat logs and the suite's non-text, and
keep wrapped articles in distribution? (issue 53: AUROC >= 0.95 between wrapped articles and non-news; "a",
random bytes and logs flagged)

    .venv/bin/python -m research.minilm_ood_probe [--n 40] [--threads 1]

The served graph through the server's own preprocessing. Wrapped articles: BBC test documents as a web page,
e-mail, JSON record, Markdown or with a table (pretrained.wrappers, the forms the head's holdout saw, on test
documents). Non-news: machine text generated here from seeded generators (written for this probe: server
logs, JSON dumps of records, base64 blocks, chat logs), and the robustness suite's random bytes, Python
code, non-English prose and lorem ipsum, each 1-8 KB; English prose that is not news: the Brown corpus's test
split by coarse genre (general prose, learned, fiction; the press genre left out), each text's first 1-8 KB
(data_cache/brown, `make setup`; skipped without it). Writes research/results/minilm_ood_probe.json.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.robustness import sources
from benchmarks.robustness.stats import auroc
from lara_serve.model_export.export.exporter import make_session
from lara_serve.model_export.pretrained.wrappers import wrapped
from lara_serve.model_export.training.brown import GENRES, BrownUnavailable, load_brown
from lara_serve.model_export.training.data import load_news
from lara_serve.server.preprocess import IDS, text_item
from lara_serve.server.repository import read_config

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "model_repository" / "lara-text-news"
RESULTS = ROOT / "research" / "results" / "minilm_ood_probe.json"
LONG_FORMS = ("web_page", "email", "json_record", "markdown", "with_table")
WORDS = [
    "alpha",
    "beta",
    "cache",
    "queue",
    "worker",
    "item",
    "order",
    "user",
    "session",
    "token",
    "region",
    "shard",
    "batch",
    "node",
]


def server_log(rng: random.Random, n_bytes: int) -> bytes:
    lines = []
    while sum(map(len, lines)) < n_bytes:
        level = rng.choice(["INFO", "INFO", "INFO", "WARN", "ERROR", "DEBUG"])
        lines.append(
            f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
            f"{rng.randint(0, 59):02d},{rng.randint(0, 999):03d} {level} [{rng.choice(WORDS)}-{rng.randint(1, 9)}] "
            f"{rng.choice(['GET', 'POST', 'PUT'])} /api/v{rng.randint(1, 3)}/{rng.choice(WORDS)}s/{rng.randint(1, 99999)} "
            f"status={rng.choice([200, 200, 201, 404, 500])} latency_ms={rng.randint(1, 900)} id={rng.getrandbits(48):012x}\n"
        )
    return "".join(lines).encode()


def json_dump(rng: random.Random, n_bytes: int) -> bytes:
    rows = []
    while sum(map(len, rows)) < n_bytes:
        row = {w: rng.choice([rng.randint(0, 10**6), round(rng.random() * 100, 3), rng.choice(WORDS), None, True])
               for w in rng.sample(WORDS, 6)}  # fmt: skip
        rows.append(json.dumps(row))
    return ("[" + ",\n".join(rows) + "]").encode()


def base64_block(rng: random.Random, n_bytes: int) -> bytes:
    text = base64.b64encode(rng.randbytes(n_bytes * 3 // 4)).decode()
    return "\n".join(text[i : i + 76] for i in range(0, len(text), 76)).encode()


CHAT = ("hey", "are we still on for lunch?", "running late, sorry", "lol", "sure thing", "can you send the file",
        "ok", "brb", "did you see my message", "thanks!!", "np", "see you at 6", "which room?")  # fmt: skip


def chat_log(rng: random.Random, n_bytes: int) -> bytes:
    lines = []
    while sum(map(len, lines)) < n_bytes:
        lines.append(
            f"[{rng.randint(8, 22):02d}:{rng.randint(0, 59):02d}] {rng.choice(['ana', 'bo', 'kim', 'raj'])}: {rng.choice(CHAT)}\n"
        )
    return "".join(lines).encode()


MACHINE = {"server_logs": server_log, "json_dumps": json_dump, "base64": base64_block, "chat_logs": chat_log}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=40, help="items per set")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", type=Path, default=MODEL, help="a lara-text-news model folder")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    model_dir = args.model
    conf = json.loads((model_dir / "config.json").read_text())
    threshold = float(conf["ood"]["threshold"])
    prep = read_config(model_dir).preprocessing
    session = make_session(model_dir / "1" / "model.onnx", threads=args.threads, fused=True)

    def score(raw: bytes) -> float:
        ids = text_item(raw.decode("utf-8", "ignore").encode(), prep, "head").arrays[IDS][None]
        return float(session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[1][0])

    docs = load_news("test")
    rng = random.Random(0)
    picks = rng.sample(range(len(docs)), args.n)
    news = {form: [score(wrapped(docs[i].text, form, i).encode()) for i in picks] for form in ("whole", *LONG_FORMS)}
    wrapped_scores = np.asarray([s for form in LONG_FORMS for s in news[form]])
    sets: dict[str, list[float]] = {}
    for name, gen in MACHINE.items():
        sets[name] = [score(gen(random.Random(f"{name}:{i}"), rng.randint(1024, 8192))) for i in range(args.n)]
    for name in sources.OOD_TEXT_SOURCES:
        draw = sources.sampler(name)
        sets[name] = [score(draw(random.Random(f"ood:{name}:{i}"), rng.randint(1024, 8192))) for i in range(args.n)]
    try:
        brown = load_brown("test")
    except BrownUnavailable as e:
        print(f"no Brown sets: {e}", flush=True)
        brown = []
    for g, genre in enumerate(GENRES):
        if genre == "press":  # Brown's news genre: not non-news
            continue
        texts = [d.text.encode() for d in brown if d.label == g][: args.n]
        if texts:
            sets[f"brown_{genre}"] = [score(t[: rng.randint(1024, 8192)]) for t in texts]
    sets["a"] = [score(b"a")]
    result: dict[str, Any] = {
        "command": "python -m research.minilm_ood_probe" + (f" --n {args.n}" if args.n != 40 else ""),
        "threshold": threshold,
        "news_in_distribution": {f: round(float((np.asarray(v) <= threshold).mean()), 4) for f, v in news.items()},
        "non_news": {},
    }
    for name, vals in sets.items():
        v = np.asarray(vals)
        result["non_news"][name] = {
            "n": len(v),
            "flagged": round(float((v > threshold).mean()), 4),
            "auroc_vs_wrapped_articles": auroc(wrapped_scores, v),
            "median_score": round(float(np.median(v)), 1),
        }  # fmt: skip
        print(name, json.dumps(result["non_news"][name]), flush=True)
    print(json.dumps(result["news_in_distribution"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
