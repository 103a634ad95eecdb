"""LARA Serve: the one import name this project installs.

The repository keeps its architecture as top-level folders (`kernels/`, `model_export/`, `server/`,
`clients/`); Python imports them as `lara_serve.kernels`, `lara_serve.model_export`, `lara_serve.server` and
`lara_serve.clients`, so the project can share an environment with packages that own the bare names
(Hugging Face's `kernels`, which transformers requires). A wheel maps the folders under `lara_serve/`
(pyproject's package-dir); in a source checkout the folders beside this one are this package's path.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

_CHECKOUT = Path(__file__).resolve().parent.parent
# A source checkout (this folder beside pyproject.toml and server/): import the top-level folders from there,
# with or without an editable install, whatever the working directory. An installed wheel has its
# subpackages inside this folder and site-packages is never added.
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "server" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))  # noqa: F821 - a package's __path__ is defined by the import system
