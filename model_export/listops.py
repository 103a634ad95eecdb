"""LRA ListOps generated in-project by the rules of shared/docs/data.md (seeded, fixed splits).

Samples are drawn in one seeded stream and de-duplicated; the first 2,000 are TEST, the next 2,000 VAL,
the rest TRAIN, so test and val do not depend on how many training samples are requested.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OPS = ("[MIN", "[MAX", "[MED", "[SM")
VOCAB = {str(d): d + 1 for d in range(10)} | {op: 11 + i for i, op in enumerate(OPS)} | {"]": 15}
VOCAB_SIZE = 16  # 0 = pad
MAX_DEPTH = 10
LEAF_P = 0.75
MIN_LEN, MAX_LEN = 500, 2000  # exclusive bounds on length (digit 1, operator 2)
N_TEST = N_VAL = 2000
CACHE = Path(__file__).resolve().parent.parent / "data_cache" / "listops"


def _tree(rng: random.Random, depth: int) -> int | tuple:
    if depth >= MAX_DEPTH or rng.random() < LEAF_P:
        return rng.randrange(10)
    return (rng.choice(OPS), [_tree(rng, depth + 1) for _ in range(rng.randint(2, 10))])


def evaluate(node: int | tuple) -> int:
    if isinstance(node, int):
        return node
    op, args = node
    vals = sorted(evaluate(a) for a in args)
    if op == "[MIN":
        return vals[0]
    if op == "[MAX":
        return vals[-1]
    if op == "[MED":
        n = len(vals)
        return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) // 2
    return sum(vals) % 10


def tokens(node: int | tuple) -> list[str]:
    if isinstance(node, int):
        return [str(node)]
    op, args = node
    out = [op]
    for a in args:
        out += tokens(a)
    return out + ["]"]


def _length(toks: list[str]) -> int:
    return len(toks)  # a digit is one token, an operator two (its opener and "]")


def generate(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """n unique (expression, label) pairs with MIN_LEN < length < MAX_LEN, deterministic in seed."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[str, int]] = []
    while len(out) < n:
        tree = _tree(rng, 1)
        toks = tokens(tree)
        if not MIN_LEN < _length(toks) < MAX_LEN:
            continue
        expr = " ".join(toks)
        if expr in seen:
            continue
        seen.add(expr)
        out.append((expr, evaluate(tree)))
    return out


def encode(expr: str) -> list[int]:
    return [VOCAB[t] for t in expr.split()]


def load_split(split: str, n_train: int = 2000, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """(token id lists, labels) of "train" | "val" | "test"; cached as JSON under data_cache/ (git-ignored)."""
    path = CACHE / f"seed{seed}-n{n_train}.json"
    if path.is_file():
        samples = json.loads(path.read_text())
    else:
        samples = generate(N_TEST + N_VAL + n_train, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(samples))
    part = {"test": samples[:N_TEST], "val": samples[N_TEST : N_TEST + N_VAL], "train": samples[N_TEST + N_VAL :]}
    if split not in part:
        raise ValueError(f"split must be train, val or test, got {split!r}")
    return [encode(e) for e, _ in part[split]], [y for _, y in part[split]]
