"""Python clients of LARA Serve: a typed library (v1, v2, classify), a CLI and a load tester."""

from clients.client import LabelScore, LaraClient, LaraError, Prediction, V2Result

__all__ = ["LabelScore", "LaraClient", "LaraError", "Prediction", "V2Result"]
