"""The import graph of `lara_serve` read from the source (ast; nothing is imported): tests/test_house.py's data.

Every `import` and `from ... import` counts, at module level or inside a function (a lazy import still ties
two modules together), except those under `if TYPE_CHECKING:`. An import of `a.b.c` is an edge to module
`a.b.c`; the parent packages it implicitly runs are not edges (every module would otherwise depend on its
package's `__init__`, and every `__init__` that re-exports on its modules).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("kernels", "model_export", "server", "clients")
PACKAGE = "lara_serve"


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for lara_serve and every module of the four folders."""
    found = {PACKAGE: ROOT / PACKAGE / "__init__.py"}
    for path in sorted((ROOT / PACKAGE).glob("*.py")):
        if path.name != "__init__.py":
            found[f"{PACKAGE}.{path.stem}"] = path
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((PACKAGE, *parts))] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from _imports(ast.Module(body=node.orelse, type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from` import names (relative imports resolved against the importing module)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports."""
    files = module_files()
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(name, path.name == "__init__.py", node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in files else base)
            for target in targets:
                # the longest module of ours that the dotted name starts with
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


if __name__ == "__main__":
    g = import_graph()
    for c in cycles(g):
        print("cycle:", c)
