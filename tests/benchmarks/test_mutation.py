"""The mutation tool itself: each operator makes the mutant it names, wording and annotations are left
alone, and every hand-listed equivalent mutant still exists (a stale entry would hide nothing, silently)."""

from __future__ import annotations

import ast
from pathlib import Path

from benchmarks.mutation.config import COVERING_TESTS, EQUIVALENT
from benchmarks.mutation.operators import mutants

ROOT = Path(__file__).resolve().parents[2]

SOURCE = '''
"""Docstring."""
import logging
log = logging.getLogger(__name__)


def f(xs: list[int], limit: int = 3) -> int:
    total = 0
    for x in xs:
        if x > limit and not x == 7:
            continue
        if x < 0:
            break
        total += x * 2
        log.info("seen %d", x)
    if total >= 100:
        raise ValueError(f"too big: {total}")
    return total
'''


def changes() -> list[str]:
    return [m.change for m in mutants("toy", SOURCE)]


def test_each_operator_makes_its_mutant() -> None:
    found = changes()
    for change in ("> -> >=", "< -> <=", ">= -> >", "== -> !=", "and -> or", "not x -> x", "continue -> break",
                   "break -> continue", "* -> /", "+ -> -", "3 -> 4", "0 -> 1", "0 -> -1", "2 -> 3",
                   "Raise -> pass", "AugAssign -> pass", "return x -> return None"):  # fmt: skip
        assert change in found, change
    # wording, docstrings, annotations and the logger are never touched
    assert not any("seen" in m.source_line for m in mutants("toy", SOURCE))
    assert all("list[int]" in m.source for m in mutants("toy", SOURCE))


def test_a_mutant_differs_from_the_original_by_its_change_only() -> None:
    original = ast.unparse(ast.parse(SOURCE))
    for m in mutants("toy", SOURCE):
        assert m.source != original, m.key
        ast.parse(m.source)  # still Python
    flip = next(m for m in mutants("toy", SOURCE) if m.change == "> -> >=")
    assert flip.source == original.replace("if x > limit", "if x >= limit") and flip.line == 10


def test_keys_are_unique_and_equivalents_are_not_stale() -> None:
    keys: set[str] = set()
    for path in COVERING_TESTS:
        found = [m.key for m in mutants(path.removesuffix(".py").replace("/", "."), (ROOT / path).read_text())]
        assert len(found) == len(set(found)), path
        keys |= set(found)
    assert [k for k in EQUIVALENT if k not in keys] == []
    assert all(len(reason) > 30 for reason in EQUIVALENT.values())
