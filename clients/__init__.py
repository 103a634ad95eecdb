"""Python clients of LARA Serve: a typed library (v1, v2, classify), a CLI and a load tester."""

from __future__ import annotations

if __name__ == "clients":  # imported by the folder's bare name from the repository root: not ours to answer
    from lara_serve._package import defer_to_installed

    defer_to_installed(__name__, __file__)

from lara_serve._package import lazy_exports

_EXPORTS = {"lara_serve.clients.client": ("LabelScore", "LaraClient", "LaraError", "Prediction", "V2Result")}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
