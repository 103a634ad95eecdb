"""LARA Serve inference server: KServe v1/v2 REST and gRPC, TEI and TorchServe routes over dynamically batched
classifiers. Public API (imported on first use): `create_app`, `Settings`."""

from __future__ import annotations

if __name__ == "server":  # imported by the folder's bare name from the repository root: not ours to answer
    from lara_serve._package import defer_to_installed

    defer_to_installed(__name__, __file__)

from lara_serve._package import lazy_exports

_EXPORTS = {"lara_serve.server.settings": ("Settings",), "lara_serve.server.app": ("create_app",)}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
