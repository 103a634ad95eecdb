"""Mutants of one Python module, made on its AST: each is the module with ONE small change.

Operators (the changes a slip of the keyboard or a careless refactor makes):
  cmp      a comparison flipped: < <=, > >=, == !=, is / is not, in / not in (each to its neighbour)
  arith    + -, * /, // *, % *
  const    an integer n -> n + 1 (and n - 1 for 0 and 1); a float x -> 2x (0.0 -> 1.0)
  bool     True <-> False, `not x` -> `x`, `and` <-> `or`
  loop     continue <-> break
  stmt     a raise, an expression call, an augmented assignment or an attribute assignment -> `pass`
  return   `return value` -> `return None`

Never mutated (they change no behaviour or only wording): docstrings, string and f-string constants, type
annotations, calls to the module logger `log`. What is left can still hold equivalent mutants; those are
listed by hand in equivalent.py with the reason.

A mutant's `key` names it without line numbers (function, operator, the source line's text, and the
occurrence of that triple), so the hand-made list survives edits elsewhere in the module.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

_CMP_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}  # fmt: skip
_ARITH_SWAP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
    ast.Mod: ast.Mult,
}  # fmt: skip
_SYMBOL = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
    ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
    ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.And: "and", ast.Or: "or",
}  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    module: str  # dotted name, e.g. lara_serve.server.batcher
    line: int
    function: str  # qualified name of the enclosing function or class ("<module>" at top level)
    operator: str  # cmp | arith | const | bool | loop | stmt | return
    change: str  # e.g. "> -> >="
    source_line: str  # the original line, stripped
    occurrence: int  # how many earlier mutants share (function, change, source_line)
    render: Callable[[], str] = field(repr=False, compare=False)

    @property
    def source(self) -> str:
        """The whole mutated module (rendered on demand: a module has hundreds of mutants)."""
        return self.render()

    @property
    def key(self) -> str:
        return f"{self.module}:{self.function}:{self.change}:{self.source_line}#{self.occurrence}"


# How a site is mutated: changes the node in place and returns it, or returns the node that replaces it.
Apply = Callable[[ast.AST], ast.AST]


def _sites(node: ast.AST) -> Iterator[tuple[str, str, Apply]]:
    """The mutations of one node: (operator, change, function that mutates a copy of the node)."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            new = _CMP_SWAP.get(type(op))
            if new is not None:
                yield "cmp", f"{_SYMBOL[type(op)]} -> {_SYMBOL[new]}", _set_cmp(i, new)
    elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _ARITH_SWAP:
        new_op = _ARITH_SWAP[type(node.op)]
        yield "arith", f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new_op]}", _set_attr("op", new_op)
    elif isinstance(node, ast.BoolOp):
        other = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield "bool", f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[other]}", _set_attr("op", other)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "bool", "not x -> x", lambda n: n.operand  # type: ignore[attr-defined]
    elif isinstance(node, ast.Constant):
        yield from _constant_sites(node.value)
    elif isinstance(node, ast.Continue):
        yield "loop", "continue -> break", lambda n: ast.Break()
    elif isinstance(node, ast.Break):
        yield "loop", "break -> continue", lambda n: ast.Continue()
    elif isinstance(node, ast.Return) and node.value is not None and not _is_none(node.value):
        yield "return", "return x -> return None", lambda n: ast.Return(value=ast.Constant(None))
    if isinstance(node, ast.Raise | ast.AugAssign) or _is_effect_call(node) or _is_attribute_assign(node):
        yield "stmt", f"{type(node).__name__} -> pass", lambda n: ast.Pass()


def _constant_sites(value: object) -> Iterator[tuple[str, str, Apply]]:
    if isinstance(value, bool):
        yield "bool", f"{value} -> {not value}", lambda n: ast.Constant(not value)
    elif isinstance(value, int):
        yield "const", f"{value} -> {value + 1}", lambda n: ast.Constant(value + 1)
        if value <= 1:  # 0 -> -1 (an index from the end), 1 -> 0; larger constants: one mutant is enough
            yield "const", f"{value} -> {value - 1}", lambda n: ast.Constant(value - 1)
    elif isinstance(value, float):
        new = value * 2 if value else 1.0
        yield "const", f"{value} -> {new}", lambda n: ast.Constant(new)


def _set_cmp(index: int, new: type[ast.cmpop]) -> Apply:
    def apply(node: ast.AST) -> ast.AST:
        ops = list(node.ops)  # type: ignore[attr-defined]  # a new list: the original is restored as it was
        ops[index] = new()
        node.ops = ops  # type: ignore[attr-defined]
        return node

    return apply


def _set_attr(name: str, new: type[ast.AST]) -> Apply:
    def apply(node: ast.AST) -> ast.AST:
        setattr(node, name, new())
        return node

    return apply


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_effect_call(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call | ast.Await)):
        return False
    call = node.value.value if isinstance(node.value, ast.Await) else node.value
    func = getattr(call, "func", None)
    # log.info(...) and friends: dropping a log line changes no behaviour a test should pin.
    return not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "log")


def _is_attribute_assign(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and all(isinstance(t, ast.Attribute) for t in node.targets)


def _skipped_children(node: ast.AST) -> set[int]:
    """ids of child nodes never walked: annotations, docstrings, f-strings, logger calls."""
    skip: set[int] = set()
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        skip.update(id(a.annotation) for a in ast.walk(node.args) if isinstance(a, ast.arg) and a.annotation)
        if node.returns is not None:
            skip.add(id(node.returns))
    if isinstance(node, ast.AnnAssign):
        skip.add(id(node.annotation))
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        skip.add(id(body[0]))  # docstring
    if isinstance(node, ast.Expr) and not _is_effect_call(node) and isinstance(node.value, ast.Call):
        skip.add(id(node.value))  # a log call: its arguments are wording
    if isinstance(node, ast.JoinedStr):
        skip.update(id(v) for v in node.values)
    if isinstance(node, ast.ClassDef):
        skip.update(id(b) for b in node.bases)
    return skip


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Every mutable node in a fixed order, with the qualified name of its enclosing scope."""

    def visit(node: ast.AST, scope: str) -> Iterator[tuple[ast.AST, str]]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope = node.name if scope == "<module>" else f"{scope}.{node.name}"
        yield node, scope
        skip = _skipped_children(node)
        for child in ast.iter_child_nodes(node):
            if id(child) not in skip and not (isinstance(child, ast.Constant) and isinstance(child.value, str)):
                yield from visit(child, scope)

    yield from visit(tree, "<module>")


def mutants(module: str, source: str) -> list[Mutant]:
    """All mutants of `source` (the text of module `module`); each renders its source only when asked."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parents = _parents(tree)
    found: list[Mutant] = []
    seen: dict[tuple[str, str, str], int] = {}
    for node, scope in _walk(tree):
        for operator, change, apply in _sites(node):
            line = getattr(node, "lineno", 0)
            text = lines[line - 1].strip() if line else ""
            n = seen.get((scope, change, text), 0)
            seen[(scope, change, text)] = n + 1
            render = functools.partial(_render, tree, parents, node, apply)
            found.append(Mutant(module, line, scope, operator, change, text, n, render))
    return found


_Slot = tuple[ast.AST, str, int | None]  # parent, field, index in the field's list (None: not a list)


def _parents(tree: ast.AST) -> dict[int, _Slot]:
    slots: dict[int, _Slot] = {}
    for parent in ast.walk(tree):
        for name, value in ast.iter_fields(parent):
            if isinstance(value, list):
                slots.update((id(item), (parent, name, i)) for i, item in enumerate(value) if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                slots[id(value)] = (parent, name, None)
    return slots


def _put(slot: _Slot, node: ast.AST) -> None:
    parent, name, index = slot
    if index is None:
        setattr(parent, name, node)
    else:
        getattr(parent, name)[index] = node


def _render(tree: ast.Module, parents: dict[int, _Slot], node: ast.AST, apply: Apply) -> str:
    """The module's source with `node` mutated by `apply`; the shared tree is restored afterwards."""
    saved = dict(vars(node))
    slot = parents[id(node)]
    try:
        replacement = apply(node)
        if replacement is not node:
            _put(slot, replacement)
        return ast.unparse(tree)
    finally:
        _put(slot, node)
        vars(node).clear()
        vars(node).update(saved)
