"""ONNX Runtime backend over `<model>/<version>/model.onnx`.

LaraAttention nodes run either as their ONNX function body (inlined by onnxruntime at load) or, on the
CPU, as the fused C++ kernel registered as a custom op (`lara_serve.kernels.ort_library`); `attention_kernel` says
which. The kernel is CPU-only: on CUDA the body runs on the GPU.

Text documents longer than LONG_TOKENS go, on the CPU and unless `OrtOptions.long_via_torch` is off, to the same model's
torch forward (lara_serve.model_export.models.long_forward: the residual stream kept in place, everything per token on
slices): onnxruntime holds ~7.6 KB per token of such a document where ~2.7 KB is live (research.memory_per_byte;
8 GB at 1 MiB), the sliced forward ~1.7 KB. Each row takes its path by its own length, never by its batch's,
so a document's answer does not depend on what it was batched with.

A model that ships its sliced program (`<version>/sliced/`, lara_serve.model_export.export.sliced; both
shipped text models do) runs such documents on it instead, on the CPU, with or without torch: small graphs
over slices of rows, the residual stream (512 B per token) the only full-length tensor: 810 MiB peak for the
backend at 1 MiB against 7.5 GB (lara_serve.sliced_program, benchmarks/memory_one_mib.py).

A windowed word-piece model (lara-text-news) ships a program of its own kind
(lara_serve.model_export.export.sliced_windows: groups of windows and the pool's running sums) whose manifest
names where it takes over, `long_from` (its whole graph's max_length, 16,384 pieces), instead of LONG_TOKENS.

Without either (a model without sliced/, no torch), documents over LONG_TOKENS run on a second session
without onnxruntime's arena and memory patterns. Every long document runs one at a time over all models,
and the heap is trimmed after each: the process returns to its idle size instead of keeping the peak.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lara_serve.server.backends.allocator import trim_freed_memory
from lara_serve.server.backends.base import (
    Backend,
    BackendBase,
    BackendUnavailable,
    Device,
    ModelOutputs,
    OrtAttention,
    OrtOptions,
)
from lara_serve.server.backends.pytorch import HUB_VERSION, file_digests
from lara_serve.server.repository import ONNX_FILE, OOD_OUTPUT, TORCH_FILE, ModelConfig, confined
from lara_serve.sliced_program import FOLDER, SlicedError, SlicedProgram, ort_runners, read_manifest

# lara_serve.model_export.models.long_forward.LONG_FROM: from here on the torch forward runs on slices (kept equal by a test).
LONG_TOKENS = 65536

# One document over LONG_TOKENS runs at a time in the process, over all models (each has its own batcher
# thread): the memory a pod needs is then one long document's peak, not one per text model (docs/deploy.md).
_LONG_AT_ONCE = threading.Semaphore(1)

# onnxruntime's session config keys for busy-waiting worker threads (onnxruntime_session_options_config_keys.h).
SPIN_KEYS = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def not_supported_reasons(model_dir: Path, config: ModelConfig, device: Device) -> list[str]:
    reasons = []
    path = model_dir / config.version / ONNX_FILE
    if not path.is_file():
        reasons.append(f"{path} does not exist")
    try:
        import onnxruntime as ort
    except ImportError:
        return [*reasons, "onnxruntime is not installed (pip install onnxruntime or onnxruntime-gpu)"]
    if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        reasons.append(
            f"device=cuda but onnxruntime offers only {ort.get_available_providers()} "
            "(install onnxruntime-gpu, not onnxruntime, and check the CUDA libraries)"
        )
    return reasons


class OnnxRuntimeBackend(BackendBase):
    name = "onnxruntime"

    def __init__(
        self,
        model_dir: Path,
        config: ModelConfig,
        device: Device,
        num_threads: int = 0,
        ort_options: OrtOptions = OrtOptions(),
        lean_long: bool = True,
        sliced: bool = True,
    ) -> None:
        reasons = not_supported_reasons(model_dir, config, device)
        if reasons:
            raise BackendUnavailable(f"onnxruntime cannot serve {config.name!r}: " + "; ".join(reasons))
        import onnxruntime as ort

        super().__init__(model_dir, config, device)

        def session(arena: bool, at: Path | None = None) -> Any:
            options, kernel = _session_options(ort, device, num_threads, ort_options)
            if not arena:
                options.enable_cpu_mem_arena = False
                options.enable_mem_pattern = False
            elif device == "cpu" and ort_options.shared_arena:
                _share_cpu_arena(ort, options)
            self.attention_kernel = kernel
            return ort.InferenceSession(str(at or path), sess_options=options, providers=providers)

        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        path = self.artifact(ONNX_FILE)
        self.session = session(arena=True)
        # Documents over LONG_TOKENS on the CPU: a second session without the arena and memory patterns, made
        # at the first one; the arena would keep a long document's peak for the life of the process, and the
        # pattern planner allocates every activation of the graph at once (benchmarks/memory_one_mib.py).
        lean = lean_long and device == "cpu" and config.task == "text"
        self._lean_session = _Lazy(_same_file(path, lambda: session(arena=False), self.session)) if lean else None
        self._input_names = [i.name for i in self.session.get_inputs()]
        declared = [spec.name for spec in config.inputs]
        if sorted(self._input_names) != sorted(declared):
            raise BackendUnavailable(f"{path} has inputs {self._input_names} but config.json declares {declared}")
        graph_outputs = [o.name for o in self.session.get_outputs()]
        # By name when the graph has both; else the first output is the logits, as before ood_score existed.
        logits_name = "logits" if "logits" in graph_outputs else graph_outputs[0]
        self._output_names = [logits_name]
        if config.has_ood_output:
            if OOD_OUTPUT not in graph_outputs:
                raise BackendUnavailable(
                    f"config.json declares output {OOD_OUTPUT!r} but {path} has outputs {graph_outputs}"
                )
            self._output_names.append(OOD_OUTPUT)
        text_cpu = device == "cpu" and config.task == "text" and "attention_mask" in declared
        # Its graphs' temporaries are one slice's (~10 MB): no arena to keep them after the document.
        self._sliced = _sliced_program(path, lambda p: session(False, p)) if text_cpu and sliced else None
        handoff = ort_options.long_via_torch and text_cpu and self._sliced is None
        self._long = _TorchForLong(model_dir, config, num_threads) if handoff else None

    def run_outputs(self, inputs: dict[str, np.ndarray]) -> ModelOutputs:
        if self._config.rows_alone and len(next(iter(inputs.values()))) > 1:
            return self._rows_alone(inputs)
        if self._sliced is not None or self._long is not None:
            lengths = inputs["attention_mask"].sum(1)
            if (lengths > self._long_from).any() and (run_long := self._long_runner()) is not None:
                return self._split(inputs, lengths, run_long)
        return self._run_ort(inputs)

    @property
    def _long_from(self) -> int:
        """Rows longer than this take the long path: the program's own threshold, else LONG_TOKENS (read at each
        call, so tests can lower it)."""
        return (self._sliced.long_from if self._sliced is not None else None) or LONG_TOKENS

    def _long_runner(self) -> Callable[[dict[str, np.ndarray]], ModelOutputs] | None:
        """What runs rows over LONG_TOKENS: the sliced program, else the torch forward, else None (the lean session)."""
        if self._sliced is not None:
            return self._run_sliced
        torch_backend = self._long.get() if self._long is not None else None
        return None if torch_backend is None else torch_backend.run_outputs

    def _run_sliced(self, inputs: dict[str, np.ndarray]) -> ModelOutputs:
        """Each row alone over its own valid ids, one long document at a time in the process."""
        assert self._sliced is not None
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        logits = np.zeros((len(ids), len(self._config.labels)), dtype=np.float32)
        ood = np.zeros(len(ids), dtype=np.float32) if self._config.has_ood_output else None
        with _LONG_AT_ONCE:
            try:
                for i in range(len(ids)):
                    out = self._sliced.run(ids[i][mask[i] > 0])
                    logits[i] = out["logits"][0]
                    if ood is not None:
                        ood[i] = out["ood_score"][0]
            finally:
                trim_freed_memory()  # the residual stream is freed by now; give the heap back
        return self._checked(logits, ood, len(ids))

    def _run_ort(self, inputs: dict[str, np.ndarray]) -> ModelOutputs:
        batch, width = next(iter(inputs.values())).shape[:2]
        long = self._lean_session is not None and width > LONG_TOKENS
        session = self._lean_session.get() if long and self._lean_session is not None else self.session
        with _LONG_AT_ONCE if long else contextlib.nullcontext():
            try:
                outs = session.run(self._output_names, {name: inputs[name] for name in self._input_names})
            finally:
                if long:  # glibc keeps freed blocks in its heap; a trim returns the document's memory now
                    trim_freed_memory()
        return self._checked(outs[0], outs[1] if len(outs) > 1 else None, batch)

    def _rows_alone(self, inputs: dict[str, np.ndarray]) -> ModelOutputs:
        """Each row through the graph alone, cut to its own length: the answer a request sent alone gets, bit
        for bit (an int8 graph's activation scale is computed over everything in one call)."""
        batch = len(next(iter(inputs.values())))
        mask = inputs.get("attention_mask")
        lengths = mask.sum(1) if mask is not None else None
        parts = []
        for i in range(batch):
            width = slice(None) if lengths is None else slice(0, int(lengths[i]))
            parts.append(
                self.run_outputs({name: np.ascontiguousarray(v[i : i + 1, width]) for name, v in inputs.items()})
            )
        ood = None if parts[0].ood_score is None else np.concatenate([p.ood_score for p in parts])  # type: ignore[misc]
        return self._checked(np.concatenate([p.logits for p in parts]), ood, batch)

    def _split(
        self,
        inputs: dict[str, np.ndarray],
        lengths: np.ndarray,
        run_long: Callable[[dict[str, np.ndarray]], ModelOutputs],
    ) -> ModelOutputs:
        """Rows longer than LONG_TOKENS through `run_long`, the rest through onnxruntime, each group cut to its
        own longest row (padding does not change a row's answer), reassembled in the batch's order."""
        long = lengths > self._long_from
        logits = np.zeros((len(lengths), len(self._config.labels)), dtype=np.float32)
        ood = np.zeros(len(lengths), dtype=np.float32) if self._config.has_ood_output else None
        for rows, run in ((np.flatnonzero(long), run_long), (np.flatnonzero(~long), self._run_ort)):
            if not len(rows):
                continue
            width = int(lengths[rows].max())
            part = run({name: np.ascontiguousarray(value[rows, :width]) for name, value in inputs.items()})
            logits[rows] = part.logits
            if ood is not None and part.ood_score is not None:
                ood[rows] = part.ood_score
        return self._checked(logits, ood, len(lengths))

    def close(self) -> None:
        del self.session
        self._sliced = None
        if self._lean_session is not None:
            self._lean_session.value = None
        if self._long is not None:
            self._long.close()


class _TorchForLong:
    """The model's torch backend for documents longer than LONG_TOKENS, made at the first one (a server that
    never sees one never imports torch). Its files (config.json, model.safetensors) are fingerprinted when the
    model loads and checked before and after the torch forward reads them: files changed on disk since are
    refused, so every answer comes from the version that was loaded. Without torch, model_export or a
    loadable, unchanged model.safetensors: onnxruntime runs them (a warning says why, once)."""

    def __init__(self, model_dir: Path, config: ModelConfig, num_threads: int, loader: Any = None) -> None:
        self._model_dir, self._config, self._threads, self._loader = model_dir, config, num_threads, loader
        self._backend: Backend | None = None
        self._warned = False
        weights = model_dir / config.version / TORCH_FILE
        self._digests: dict[Path, str] = {}
        self.unavailable: str | None = None
        if loader is None and not weights.is_file():
            self.unavailable = f"{weights} does not exist"
        elif loader is None and config.version != HUB_VERSION:  # load_pretrained reads <model>/1/ only
            self.unavailable = (
                f"the torch loader reads version {HUB_VERSION}'s weights; version {config.version} is served"
            )
        elif loader is None:
            self._digests = file_digests([model_dir / "config.json", weights])

    def get(self) -> Backend | None:
        if self._backend is None and self.unavailable is None:
            self._backend = self._load()
        if self.unavailable is not None and not self._warned:
            self._warned = True
            warnings.warn(
                f"{self._config.name}: documents longer than {LONG_TOKENS} tokens run on onnxruntime "
                f"(about 4.5x the memory of the torch sliced forward): {self.unavailable}",
                stacklevel=2,
            )
        return self._backend

    def _load(self) -> Backend | None:
        try:
            from lara_serve.server.backends.pytorch import TorchBackend, use_threads

            if self._digests and file_digests(list(self._digests)) != self._digests:
                raise _Changed
            backend = TorchBackend(self._model_dir, self._config, "cpu", self._loader)
            if self._digests and file_digests(list(self._digests)) != self._digests:  # changed while read
                backend.close()
                raise _Changed
            use_threads(self._threads)
            return backend
        except _Changed:
            self.unavailable = (
                f"{TORCH_FILE} or config.json changed on disk since the model was loaded; reload the model "
                "(restart, or POST /v2/repository/models/<name>/load) to serve the new files"
            )
        except ImportError as exc:
            self.unavailable = f"the torch forward needs torch and model_export ({exc}); pip install '.[train]'"
        except Exception as exc:  # noqa: BLE001 - any failure: onnxruntime still serves these documents
            self.unavailable = f"the torch forward could not be loaded ({type(exc).__name__}: {exc})"
        return None

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()


def _sliced_program(onnx_path: Path, make_session: Callable[[Path], Any]) -> SlicedProgram | None:
    """The sliced program beside `onnx_path` (its sessions made now, at load), or None: no folder, or one
    that cannot serve this model.onnx (a warning says why; the whole graph then serves long documents)."""
    folder = onnx_path.parent / FOLDER
    if not folder.is_dir():
        return None
    try:
        spec = read_manifest(confined(onnx_path.parents[2], folder))
        wanted = spec.get("model_onnx_sha256")
        if wanted != file_digests([onnx_path])[onnx_path]:
            raise SlicedError(
                f"it was exported for another model.onnx (sha256 {wanted}); re-export it (python -m lara_serve.model_export.export.sliced)"
            )
        for step in spec["passes"]:
            confined(onnx_path.parents[2], folder / step["file"])
        return SlicedProgram(spec, ort_runners(folder, spec, make_session))
    except Exception as exc:  # noqa: BLE001 - any unusable folder: the whole graph still serves
        warnings.warn(f"{folder} is not used ({type(exc).__name__}: {exc}); documents over {LONG_TOKENS} tokens "
                      "run on the whole graph (several GB at 1 MiB)", stacklevel=2)  # fmt: skip
        return None


def _same_file(path: Path, make: Callable[[], Any], loaded: Any) -> Callable[[], Any]:
    """`make`, for a second session of `path` made later, only while `path` holds what it held now (sha256);
    once it changed on disk, the session made at load (`loaded`) serves instead, with a warning: every
    answer from the version that was loaded."""
    digests = file_digests([path])

    def made_or_loaded() -> Any:
        if file_digests([path]) == digests:
            session = make()
            if file_digests([path]) == digests:
                return session
        warnings.warn(f"{path.name} changed on disk since the model was loaded: the loaded session serves "
                      "long documents too (reload the model to serve the new file)", stacklevel=2)  # fmt: skip
        return loaded

    return made_or_loaded


class _Changed(Exception):
    """A model file's content differs from what it held when the model was loaded."""


class _Lazy:
    """A value made at its first use (a session only documents over LONG_TOKENS need)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make, self.value = make, None

    def get(self) -> Any:
        if self.value is None:
            self.value = self._make()
        return self.value


def _session_options(ort: Any, device: Device, num_threads: int, ort_options: OrtOptions) -> tuple[Any, str]:
    """SessionOptions and how LaraAttention runs on them ("fused" or "body")."""
    options = ort.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = num_threads
    # One batch runs at a time per model (the batcher's worker thread): no inter-op parallelism.
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Spinning keeps each idle intra-op thread busy-waiting after every parallel section, so a request
    # burned about twice its compute in CPU time (settings.ort_spinning): cores the event loop, the other
    # models and everything else on the machine need.
    for key in SPIN_KEYS:
        options.add_session_config_entry(key, "1" if ort_options.spinning else "0")
    kernel = "body"
    if device == "cpu" and ort_options.attention != "body":
        kernel = _fused_or_body(options, ort_options.attention)
    return options, kernel


_SHARED_ARENA = threading.Lock()
_shared_arena_registered = False


def _share_cpu_arena(ort: Any, options: Any) -> None:
    """Let the session allocate from the process's one CPU arena (settings.ort_shared_arena), registered with
    onnxruntime's environment at the first such session. An arena keeps what its largest run took; per model,
    the process would keep every text model's largest batch at once (benchmarks/memory_one_mib.py)."""
    global _shared_arena_registered
    with _SHARED_ARENA:
        if not _shared_arena_registered:
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            # OrtArenaCfg(max_mem, extend strategy, initial chunk, max dead bytes): 0 and -1 are the defaults
            # (no cap, next power of two) of a session's own arena.
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
            _shared_arena_registered = True
    options.add_session_config_entry("session.use_env_allocators", "1")


def _fused_or_body(options: object, attention: OrtAttention) -> str:
    """Register the fused LaraAttention kernel on `options`; "fused", or "body" when it cannot be had."""
    try:
        from lara_serve.kernels import ort_library
    except ImportError:  # an install that copied server/ alone
        why = "the kernels package is not installed"
        if attention == "auto":
            warnings.warn(f"{why}; onnxruntime runs LaraAttention's ONNX function body", stacklevel=2)
    else:
        if ort_library.register(options):
            return "fused"
        why = ort_library.unavailable_reason() or "unknown"
    if attention == "fused":
        raise BackendUnavailable(f"ort_attention=fused but the fused kernel is unavailable: {why}")
    return "body"
