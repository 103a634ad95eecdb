"""Python clients of LARA Serve: a typed library (v1, v2, classify), a CLI and a load tester."""

from __future__ import annotations

if __name__ == "clients":  # imported by the folder's bare name from the repository root: not ours to answer
    from lara_serve._package import defer_to_installed

    defer_to_installed(__name__, __file__)

from lara_serve._package import lazy_exports

_HOMES = {
    "LabelScore": "lara_serve.clients.client",
    "LaraClient": "lara_serve.clients.client",
    "LaraError": "lara_serve.clients.client",
    "Prediction": "lara_serve.clients.client",
    "V2Result": "lara_serve.clients.client",
}
__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
