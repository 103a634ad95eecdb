"""LARA Serve inference server: KServe v1/v2 REST over dynamically batched classifiers."""

from server.app import create_app
from server.settings import Settings

__all__ = ["Settings", "create_app"]
