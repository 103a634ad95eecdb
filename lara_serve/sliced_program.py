"""One long text document through its model's sliced program (`<model>/<version>/sliced/`, written by
lara_serve.model_export.export.sliced): small onnxruntime graphs over slices of rows, so the document's
memory is its residual stream (D x 4 bytes per token) plus one slice's temporaries, not the whole graph's
~7.5 KB per token. Here, beside the package's other shared helpers, because both sides read the format:
the onnxruntime backend (lara_serve.server.backends.onnx_runtime) serves with it, and the export checks
its graphs' parity with it; neither layer may import the other's modules for that (style.md's layers).

This module holds no model arithmetic: `manifest.json` lists the passes in order and the running state's
initial values; each graph maps (slice, state) to the next state. Input names a graph may read: `x` (the
slice's rows of the residual stream), `ids` (the slice's window: its rows plus the manifest's halo),
`rows` (the slice's rows within that window), `offset` (the window's first position), `start` (the
slice's first row), `n` (the document's length) and any state name. Output names: `next_x` (written back
over the slice's rows), `next_<s>` (replaces state s), `append_<s>` (concatenated to state s along its
second axis once the pass is over), anything else (a result: `logits`, `ood_score`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

FOLDER = "sliced"
MANIFEST = "manifest.json"
FORMAT = 1

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class SlicedError(RuntimeError):
    """A sliced program's folder that cannot be served (the whole graph serves instead)."""


class SlicedProgram:
    """A model's sliced program: the manifest and one runner (graph) per file."""

    def __init__(self, spec: dict[str, Any], runners: dict[str, Runner]) -> None:
        if spec.get("format") != FORMAT:
            raise SlicedError(f"{MANIFEST} format {spec.get('format')!r}; this server reads format {FORMAT}")
        missing = [p["file"] for p in spec["passes"] if p["file"] not in runners]
        if missing:
            raise SlicedError(f"no graph for passes {missing}")
        self.spec, self._runners = spec, runners
        self.chunk = int(spec["chunk"])
        self.left, self.right = (int(v) for v in spec["halo"])
        # Documents longer than this run here (manifest "long_from"; None: the backend's own threshold): a
        # windowed word-piece model's whole graph holds every piece's activations, so its program takes over
        # past the whole graph's max_length (lara_serve.model_export.export.sliced_windows).
        self.long_from: int | None = int(spec["long_from"]) if spec.get("long_from") else None

    def run(self, ids: np.ndarray, float_dtype: type = np.float32) -> dict[str, np.ndarray]:
        """One unpadded document's ids [n] int64 -> its results ({"logits": [1, C], "ood_score": [1]}).

        float_dtype: the residual stream's and the float32 state's type (tests run the program in float64)."""
        n = len(ids)
        if n < 1:
            raise ValueError("a sliced document needs at least one token")
        ids = np.ascontiguousarray(ids, dtype=np.int64)[None]  # [1, n]
        x = np.empty((1, n, int(self.spec["dim"])), dtype=float_dtype)  # the residual stream
        state = {name: _initial(s, float_dtype) for name, s in self.spec["state"].items()}
        results: dict[str, np.ndarray] = {}
        for step in self.spec["passes"]:
            run = self._runners[step["file"]]
            appended: dict[str, list[np.ndarray]] = {}
            cuts = self._slices(n) if step["over"] == "slices" else iter([(0, n)])
            for s, e in cuts:
                outs = run(self._feeds(ids, x, state, s, e, n))
                for name, value in outs.items():
                    if name == "next_x":
                        x[:, s:e] = value
                    elif name.startswith("next_"):
                        state[name[5:]] = value
                    elif name.startswith("append_"):
                        appended.setdefault(name[7:], []).append(value)
                    else:
                        results[name] = value
            for name, parts in appended.items():
                state[name] = np.concatenate([state[name], *parts], axis=1)
        return results

    def _slices(self, n: int) -> Iterator[tuple[int, int]]:
        return ((s, min(n, s + self.chunk)) for s in range(0, n, self.chunk))

    def _feeds(
        self, ids: np.ndarray, x: np.ndarray, state: dict[str, np.ndarray], s: int, e: int, n: int
    ) -> dict[str, np.ndarray]:
        a, z = max(0, s - self.left), min(n, e + self.right)
        feeds = {
            "x": x[:, s:e],
            "ids": ids[:, a:z],
            "rows": np.arange(s - a, e - a, dtype=np.int64),
            "offset": np.array(a, dtype=np.int64),
            "start": np.array(s, dtype=np.int64),
            "n": np.array(n, dtype=np.int64),
        }
        return {**feeds, **state}


def _initial(spec: dict[str, Any], float_dtype: type) -> np.ndarray:
    dtype = np.float64 if spec["dtype"] == "float64" else float_dtype
    return np.full(spec["shape"], spec["fill"], dtype=dtype)


def read_manifest(folder: Path) -> dict[str, Any]:
    try:
        spec = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise SlicedError(f"{folder / MANIFEST}: {exc}") from None
    if not isinstance(spec, dict) or not {"format", "chunk", "halo", "dim", "state", "passes"} <= set(spec):
        raise SlicedError(f"{folder / MANIFEST} lacks format, chunk, halo, dim, state or passes")
    return spec


def ort_runners(folder: Path, spec: dict[str, Any], make_session: Callable[[Path], Any]) -> dict[str, Runner]:
    """One onnxruntime session per graph of the manifest, each as a Runner fed only the inputs it declares."""

    def runner(session: Any) -> Runner:
        inputs = [i.name for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]

        def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(outputs, session.run(outputs, {k: feeds[k] for k in inputs}), strict=True))

        return run

    files = sorted({p["file"] for p in spec["passes"]})
    return {f: runner(make_session(folder / f)) for f in files}
