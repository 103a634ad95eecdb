"""What the four folders' `__init__` files share: handing a bare-name import to its owner, and lazy exports.

A top-level folder imported by its bare name hands the import to the package that owns that name.

From the repository root (`python -m ...`, `python -c`, pytest) the working directory is on sys.path, so
`import kernels` would find our `kernels/` folder before Hugging Face's installed `kernels`, and
transformers would fail. Each of our folders' `__init__` calls `defer_to_installed` when it runs under its
bare name: the installed package of that name replaces it in sys.modules, or the import fails as if the
folder were not there. Our code always imports `lara_serve.<folder>`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def defer_to_installed(name: str, init_file: str) -> None:
    """Load the package `name` from sys.path without the folder that holds our `name/` and put it in its place."""
    ours = Path(init_file).resolve().parent.parent
    path = [p for p in sys.path if Path(p or ".").resolve() != ours]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(
            f"No module named {name!r} (LARA Serve's {name}/ folder imports as lara_serve.{name})", name=name
        )
    module = importlib.util.module_from_spec(spec)
    # The import system returns sys.modules[name] after this __init__ runs, so the installed package wins.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]) -> tuple[list[str], Callable[[str], Any]]:
    """(`__all__`, a PEP 562 `__getattr__`) for `package`, from {home module: its public names}: each name is
    imported from its home on first use, so importing a subpackage (`lara_serve.server.settings`,
    `lara_serve.kernels.ort_library` in the lean install) does not import the whole package, and a bare-name
    import that was handed on runs nothing."""
    homes = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return sorted(homes), __getattr__
