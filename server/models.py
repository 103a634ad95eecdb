"""A served model: config + backend + batcher, and the registry of loaded models."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from server.backends import Backend, create_backend
from server.batcher import Batcher, BatchObserver, BatchPolicy, BatchResult
from server.errors import ErrorKind, ServeError, not_found
from server.metrics import Metrics
from server.preprocess import Item, collate, image_item, softmax, text_item
from server.repository import (
    ImagePreprocessing,
    ModelConfig,
    RepositoryError,
    TextPreprocessing,
    discover,
    read_config,
)
from server.settings import Settings

log = logging.getLogger(__name__)
RAW_INPUT = "raw"  # BYTES input: encoded image or UTF-8 text, one element per item


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
        self.batcher: Batcher[Item, np.ndarray] = Batcher(config.name, self._run_batch, policy, observer)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def version(self) -> str:
        return self.config.version

    def _run_batch(self, items: list[Item]) -> list[np.ndarray]:
        """Worker thread: pad, run, softmax; one probability row [n_labels] per item."""
        logits = self.backend.run(collate(items, self.config))  # [B, n_labels]
        return list(softmax(logits))

    async def classify(self, items: Sequence[Item], timeout_s: float) -> list[BatchResult[np.ndarray]]:
        """Queue the items, wait for all of them; on timeout the unfinished ones are dropped (504)."""
        futures = self.batcher.submit([(item, item.length) for item in items])
        try:
            return list(await asyncio.wait_for(asyncio.gather(*futures), timeout=timeout_s))
        except TimeoutError:
            raise ServeError(ErrorKind.TIMEOUT, f"request took longer than request_timeout_s={timeout_s:g} s") from None
        finally:
            for future in futures:  # no-op for finished ones; the batcher skips the others
                future.cancel()

    def item_from_bytes(self, data: bytes, truncate: bool, max_image_pixels: int) -> Item:
        prep = self.config.preprocessing
        if isinstance(prep, TextPreprocessing):
            return text_item(data, prep, truncate)
        return image_item(data, prep, max_image_pixels)

    def warmup(self) -> None:
        """Run the shapes a first request would, before the server reports ready."""
        prep = self.config.preprocessing
        if isinstance(prep, TextPreprocessing):
            items = [
                text_item(b"warm up", prep, True),
                text_item(b"w" * min(64, prep.max_length), prep, True),
            ]
        else:
            assert isinstance(prep, ImagePreprocessing)
            buffer = io.BytesIO()
            Image.new("L", (prep.width, prep.height)).save(buffer, format="PNG")
            items = [image_item(buffer.getvalue(), prep, prep.width * prep.height)] * 2
        self._run_batch(items)

    def v2_metadata(self) -> dict[str, Any]:
        raw = {"name": RAW_INPUT, "datatype": "BYTES", "shape": [-1]}
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": f"lara_{self.backend.name}",
            "inputs": [raw, *(spec.model_dump() for spec in self.config.inputs)],
            "outputs": [
                {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(self.config.labels)]},
                {"name": "label", "datatype": "BYTES", "shape": [-1]},
            ],
            "parameters": {"task": self.config.task, "labels": self.config.labels},
        }

    async def stop(self) -> None:
        await self.batcher.stop()
        self.backend.close()


class ModelRegistry:
    def __init__(self) -> None:
        self.models: dict[str, ServedModel] = {}

    def get(self, name: str, version: str | None = None) -> ServedModel:
        model = self.models.get(name)
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
        bucket_ratio=settings.length_bucket_ratio,
    )


def load_models(settings: Settings, metrics: Metrics | None = None) -> dict[str, ServedModel]:
    """Read configs, build backends, warm up. Blocking; raises on any unusable model (start-up fails)."""
    models: dict[str, ServedModel] = {}
    for name, model_dir in discover(settings.model_repository, settings.models or None).items():
        config = read_config(model_dir)
        if config.name != name:
            raise RepositoryError(f"{model_dir}/config.json names the model {config.name!r}, not {name!r}")
        backend = create_backend(settings.backend, Path(model_dir), config, settings.device, settings.num_threads)
        observer = metrics.observer(name) if metrics is not None else None
        model = ServedModel(config, backend, policy_from(settings), observer)
        if settings.warmup:
            model.warmup()
        log.info("loaded %s v%s (%s, %s on %s)", name, config.version, config.task, backend.name, backend.device)
        models[name] = model
    return models
