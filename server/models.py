"""A served model: config + backend + batcher, and the registry of loaded models."""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from lara_serve.server.backends import Backend, OrtOptions, create_backend, run_outputs
from lara_serve.server.batcher import Batcher, BatchObserver, BatchPolicy, BatchResult
from lara_serve.server.errors import ErrorKind, ServeError, clean_message, not_found
from lara_serve.server.inputs import image_for_text_model
from lara_serve.server.metrics import Metrics, ModelObserver
from lara_serve.server.preprocess import TRUNCATION_SIDES, DecodeBudget, Item, collate, image_item, softmax, text_item
from lara_serve.server.repository import (
    ImagePreprocessing,
    ModelConfig,
    RepositoryError,
    TextPreprocessing,
    discover,
    served_config,
)
from lara_serve.server.settings import Settings

log = logging.getLogger(__name__)
RAW_INPUT = "raw"  # BYTES input: encoded image or UTF-8 text, one element per item


@dataclass(frozen=True)
class Scored:
    """One item's answer: its probabilities and, for a model with an ood_score output, how unlike the
    training data it is (in_distribution when config.json's ood.threshold is set)."""

    probabilities: np.ndarray  # [n_labels] float32
    ood_score: float | None = None
    in_distribution: bool | None = None


class ServedModel:
    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        policy: BatchPolicy,
        observer: BatchObserver | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.batcher: Batcher[Item, Scored] = Batcher(config.name, self._run_batch, policy, observer)
        self.decode_budget: DecodeBudget | None = None  # shared by the app's models (lara_serve.server.app)
        self.max_input_bytes = config.max_input_bytes  # _load_one tightens it to settings.max_input_bytes
        self.observer = observer

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def version(self) -> str:
        return self.config.version

    @property
    def platform(self) -> str:
        """Triton's platform name, the same in v2 metadata, model config and gRPC (clients match on it)."""
        return "onnxruntime_onnx" if self.backend.name == "onnxruntime" else "pytorch_libtorch"

    def _run_batch(self, items: list[Item]) -> list[Scored]:
        """Worker thread: pad, run, softmax; one Scored (probabilities [n_labels], ood_score) per item."""
        outputs = run_outputs(self.backend, collate(items, self.config))  # non-finite values: classify refuses
        probabilities = softmax(outputs.logits)  # [B, n_labels]
        if outputs.ood_score is None:
            return [Scored(row) for row in probabilities]
        threshold = self.config.ood_threshold_of(self.backend.name)
        return [
            Scored(row, float(score), None if threshold is None else bool(score <= threshold))
            for row, score in zip(probabilities, outputs.ood_score, strict=True)
        ]

    async def classify(self, items: Sequence[Item], timeout_s: float) -> list[BatchResult[Scored]]:
        """Queue the items and wait for all of them.

        The timeout covers waiting, as Triton's queue policy does: items still queued when it passes, or
        that the batcher estimates could not finish by then, get 504 and are never computed; items
        already being computed finish and are answered, since dropping them would waste the work. If
        this task is cancelled (the client disconnected), its queued items are dropped.
        """
        deadline = time.perf_counter() + timeout_s
        futures = self.batcher.submit([(item, item.length) for item in items], deadline=deadline)
        try:
            _, pending = await asyncio.wait(futures, timeout=timeout_s, return_when=asyncio.FIRST_EXCEPTION)
            if pending and not all(self.batcher.running(f) for f in pending):
                raise ServeError(ErrorKind.TIMEOUT, f"request waited longer than request_timeout_s={timeout_s:g} s")
            results = list(await asyncio.gather(*futures))
            self._refuse_nonfinite(results)
            if isinstance(self.observer, ModelObserver):
                self.observer.out_of_distribution(sum(r.value.in_distribution is False for r in results))
            return results
        finally:
            for future in futures:  # no-op for finished ones; the batcher skips the others
                future.cancel()

    def _refuse_nonfinite(self, results: Sequence[BatchResult[Any]]) -> None:
        """NaN or Inf in an output is no answer (and no valid JSON): a 500 that says so, counted."""
        bad = sum(not _all_finite(r.value) for r in results)
        if not bad:
            return
        if isinstance(self.observer, ModelObserver):
            self.observer.nonfinite_outputs(bad)
        which = sorted(
            {
                "logits" if field == "probabilities" else field
                for r in results
                for field in getattr(r.value, "__dataclass_fields__", {})
                if not _all_finite(getattr(r.value, field))
            }
        )
        raise ServeError(
            ErrorKind.BACKEND_FAILURE,
            f"model {self.name!r} produced non-finite {' and '.join(which) or 'outputs'} (NaN or Inf) for {bad} of "
            f"{len(results)} items; "
            "no result is returned. Inputs far outside the training range (e.g. pixel_values of 1e38) cause this",
        )

    @property
    def default_truncation(self) -> str | None:
        """The side a text model cuts when a request says nothing of truncation (config.json's
        preprocessing.truncate), or None: 413 for a text over max_length."""
        prep = self.config.preprocessing
        return (prep.truncate or None) if isinstance(prep, TextPreprocessing) else None

    def item_from_bytes(self, data: bytes, truncate: str | None, max_image_pixels: int) -> Item:
        prep = self.config.preprocessing
        if isinstance(prep, TextPreprocessing):
            looks = image_for_text_model(data)
            if looks is not None:  # a clearer answer than "not UTF-8 ... 0x89" or a 413 on the base64
                raise ServeError(
                    ErrorKind.INVALID_INPUT,
                    f"this looks like an image ({looks}); {self.name!r} is a text model and takes UTF-8 text",
                )
            return text_item(data, prep, truncate)
        return image_item(data, prep, max_image_pixels, self.decode_budget)

    async def items_from_bytes(
        self, raw: Sequence[bytes], truncate: str | None, max_image_pixels: int, off_loop_bytes: int = 64 * 1024
    ) -> list[Item]:
        """Uploads -> items, keeping the event loop free: images decode on the decode budget's threads, one
        at a time per request, so a client that leaves stops its decoding at the next image and a request
        of many files cannot queue ahead of everyone; texts over `off_loop_bytes` in all are checked in a
        thread (UTF-8 validation of 16 MB takes tens of ms)."""
        self._refuse_oversized(raw)
        loop = asyncio.get_running_loop()
        if self.config.task == "image":
            executor = self.decode_budget.executor if self.decode_budget is not None else None
            items = []
            for data in raw:
                items.append(
                    await loop.run_in_executor(executor, self.item_from_bytes, data, truncate, max_image_pixels)
                )
            return items
        if sum(map(len, raw)) > off_loop_bytes:
            return await asyncio.to_thread(lambda: [self.item_from_bytes(d, truncate, max_image_pixels) for d in raw])
        return [self.item_from_bytes(data, truncate, max_image_pixels) for data in raw]

    def _refuse_oversized(self, raw: Sequence[bytes]) -> None:
        """413 before any decoding: a long document's memory grows with its bytes, whatever truncate says."""
        limit = self.max_input_bytes
        sizes = [len(data) for data in raw]
        if limit is None or max(sizes, default=0) <= limit:
            return
        index = next(i for i, n in enumerate(sizes) if n > limit)
        raise ServeError(
            ErrorKind.TOO_LARGE,
            f"input {index} is {sizes[index]} bytes; model {self.name!r} accepts at most max_input_bytes={limit} "
            "(config.json's max_input_bytes and the server's --max-input-bytes; the smaller applies)",
        )

    def check(self) -> None:
        """One smallest item through the whole path: the model must load, run, and answer one finite row
        per label. Runs at load even without warm-up, so a broken model is refused before ready."""
        prep = self.config.preprocessing
        if isinstance(prep, TextPreprocessing):
            item = text_item(b"a", prep, "head")
        else:
            item = image_item(_blank_png(prep), prep, prep.width * prep.height)
        expected = (1, len(self.config.labels))
        try:
            outputs = run_outputs(self.backend, collate([item], self.config))
            logits = outputs.logits
        except Exception as exc:
            raise RepositoryError(
                f"model {self.name!r} failed its one-item load check (config.json lists {expected[1]} labels): {exc}"
            ) from exc
        if np.shape(logits) != expected:
            raise RepositoryError(
                f"model {self.name!r} outputs shape {list(np.shape(logits))} for one item, but config.json "
                f"lists {expected[1]} labels (expected {list(expected)})"
            )
        if not np.isfinite(logits).all():
            raise RepositoryError(f"model {self.name!r} outputs non-finite logits for a one-item check")
        if outputs.ood_score is not None and not np.isfinite(outputs.ood_score).all():
            raise RepositoryError(f"model {self.name!r} outputs a non-finite ood_score for a one-item check")

    def warmup(self) -> None:
        """Run the shapes a first request would, before the server reports ready."""
        prep = self.config.preprocessing
        if isinstance(prep, TextPreprocessing):
            items = [
                text_item(b"warm up", prep, "head"),
                text_item(b"w" * min(64, prep.max_length), prep, "head"),
            ]
        else:
            items = [image_item(_blank_png(prep), prep, prep.width * prep.height)] * 2
        # Each shape alone, timed: the batcher's deadline estimate starts from these (lara_serve.server.batch_cost).
        times = []
        for item in items:
            start = time.perf_counter()
            self._run_batch([item])
            times.append(time.perf_counter() - start)
            self.batcher.cost.observe(item.length, times[-1])
        self.batcher.cost.set_floor(min(times))
        self._run_batch(items)

    def v2_metadata(self) -> dict[str, Any]:
        raw = {"name": RAW_INPUT, "datatype": "BYTES", "shape": [-1]}
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": self.platform,
            "inputs": [raw, *(spec.model_dump() for spec in self.config.inputs)],
            "outputs": [
                {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(self.config.labels)]},
                {"name": "label", "datatype": "BYTES", "shape": [-1]},
                *({"name": n, "datatype": t, "shape": [-1]} for n, t in self.ood_outputs().items()),
            ],
            "parameters": self.limits(),
        }

    def ood_outputs(self) -> dict[str, str]:
        """The v2 outputs (name -> datatype) that say how unlike the training data an item is."""
        if not self.config.has_ood_output:
            return {}
        return {"ood_score": "FP32", **({"in_distribution": "BOOL"} if self.config.ood_threshold is not None else {})}

    def limits(self) -> dict[str, Any]:
        """What a client must know before sending: task, labels, and for text the longest input accepted
        and the truncation sides it may ask for."""
        out: dict[str, Any] = {"task": self.config.task, "labels": self.config.labels}
        prep = self.config.preprocessing
        if isinstance(prep, TextPreprocessing):
            out["max_length"] = prep.max_length
            out["truncation_sides"] = list(TRUNCATION_SIDES)
            out["truncate_default"] = self.default_truncation or False
        if self.max_input_bytes is not None:
            out["max_input_bytes"] = self.max_input_bytes
        return out

    async def stop(self, grace_s: float = 30.0) -> None:
        """Every accepted item is answered (lara_serve.server.batcher.Batcher.stop); the backend is closed off the
        event loop, and only once no batch runs on it."""
        await self.batcher.stop(grace_s)
        if not self.batcher.busy:
            await asyncio.to_thread(self.backend.close)


def _all_finite(value: Any) -> bool:
    """Every number in an output (an array, or a tuple / dataclass / dict of arrays and numbers)."""
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, tuple | list):
        return all(_all_finite(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        return all(_all_finite(getattr(value, f)) for f in value.__dataclass_fields__)
    if isinstance(value, np.ndarray | float | np.floating):
        return bool(np.isfinite(value).all())
    return True  # labels, flags, ints


def _blank_png(prep: TextPreprocessing | ImagePreprocessing) -> bytes:
    assert isinstance(prep, ImagePreprocessing)
    buffer = io.BytesIO()
    Image.new("L", (prep.width, prep.height)).save(buffer, format="PNG")
    return buffer.getvalue()


class ModelRegistry:
    def __init__(self) -> None:
        self.models: dict[str, ServedModel] = {}
        self.failed: dict[str, str] = {}  # name -> why it does not serve (strict_models=false)

    def get(self, name: str, version: str | None = None) -> ServedModel:
        model = self.models.get(name)
        if model is None and name in self.failed:
            raise ServeError(ErrorKind.NOT_READY, f"model {name!r} is not available: {self.failed[name]}")
        if model is None:
            raise not_found(f"unknown model {name!r}; available: {sorted(self.models)}")
        if version is not None and version != model.version:
            raise not_found(f"model {name!r} has no version {version!r}; available: [{model.version!r}]")
        return model


def policy_from(settings: Settings) -> BatchPolicy:
    return BatchPolicy(
        max_batch_size=settings.max_batch_size,
        max_batch_tokens=settings.max_batch_tokens,
        max_queue_delay_s=settings.max_queue_delay_ms / 1000.0,
        max_queue_size=settings.max_queue_size,
        max_queue_tokens=settings.max_queue_tokens,
        bucket_ratio=settings.length_bucket_ratio,
    )


class ModelLoadError(RuntimeError):
    """strict_models: a model failed to load; start-up stops."""


def load_models(settings: Settings, metrics: Metrics | None = None) -> dict[str, ServedModel]:
    """Every model or an exception (embedding, e.g. one Ray deployment per model)."""
    return {
        name: _load_one(name, Path(model_dir), settings, metrics)
        for name, model_dir in discover(settings.model_repository, settings.models or None).items()
    }


def load_repository(
    settings: Settings, metrics: Metrics | None = None
) -> tuple[dict[str, ServedModel], dict[str, str]]:
    """Read configs, build backends, check outputs, warm up. Blocking.

    Returns (loaded models, name -> reason for each model that failed). A failing model does not stop the
    others unless settings.strict_models, which raises ModelLoadError at the first failure.
    """
    models: dict[str, ServedModel] = {}
    failed: dict[str, str] = {}
    found = discover(settings.model_repository, settings.models or None)
    for typo in sorted(set(settings.model_backends) - set(found)):
        log.warning("model_backends names %r, which is not in the repository (or not in models); ignored", typo)
    for name, model_dir in found.items():
        try:
            models[name] = _load_one(name, Path(model_dir), settings, metrics)
        except Exception as exc:  # any failure of one model's artifacts: isolate it
            reason = _reason(exc)
            if settings.strict_models:
                raise ModelLoadError(f"model {name!r} failed to load (strict_models=true): {reason}") from exc
            log.error("model %s failed to load and will not serve: %s", name, reason)
            failed[name] = reason
        if metrics is not None:
            metrics.model_ready.labels(name).set(1 if name in models else 0)
            if name in failed:
                metrics.model_load_failures.labels(name).inc()
    return models, failed


# Request parameters of the Open Inference Protocol this server does not implement: refused, never ignored.
UNSUPPORTED_PARAMETERS = {
    "priority": "requests are served in arrival order within length buckets; there are no priority levels",
}


def refuse_unsupported(parameters: Mapping[str, Any] | None) -> None:
    """A 400 naming the parameter and why, so a client relying on it learns at once that it has no effect."""
    for key, why in UNSUPPORTED_PARAMETERS.items():
        if parameters and key in parameters:
            raise ServeError(ErrorKind.MALFORMED, f"parameter {key!r} is not supported: {why}; remove it")


def _load_one(name: str, model_dir: Path, settings: Settings, metrics: Metrics | None) -> ServedModel:
    config = served_config(name, model_dir)
    kind = settings.backend_for(name)
    if kind == "torch" and settings.keep_freed_memory:
        from lara_serve.server.backends.allocator import keep_freed_memory

        keep_freed_memory()
    ort_options = OrtOptions(
        settings.ort_attention, settings.ort_spinning, settings.ort_long_via_torch, settings.ort_shared_arena
    )
    backend = create_backend(kind, model_dir, config, settings.device, settings.num_threads, ort_options)
    observer = metrics.observer(name) if metrics is not None else None
    model = ServedModel(config, backend, policy_from(settings), observer)
    caps = [n for n in (config.max_input_bytes, settings.max_input_bytes) if n]
    model.max_input_bytes = min(caps) if caps else None
    try:
        model.check()
        if settings.warmup:
            model.warmup()
    except Exception:
        backend.close()
        raise
    kernel = getattr(backend, "attention_kernel", None)
    how = f", LaraAttention: {kernel}" if kernel else ""
    log.info("loaded %s v%s (%s, %s on %s%s)", name, config.version, config.task, backend.name, backend.device, how)
    return model


def _reason(exc: BaseException) -> str:
    """One line for logs and the ready route: backends may raise multi-line errors."""
    text = " ".join(clean_message(str(exc)).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:500]}"
