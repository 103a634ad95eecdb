"""Experiments that answered a question (see research/README.md); their results live in research/results/.

These are not product benchmarks: `benchmarks/` holds what a user or CI reruns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write one experiment's payload under research/results/ (RESULTS is read at call time, so tests redirect it)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
