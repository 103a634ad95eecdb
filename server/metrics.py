"""Prometheus metrics, on a registry per app (several apps can live in one process, e.g. in tests)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from lara_serve.server.statistics import Statistics

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = tuple(2**k for k in range(4, 21))
_LENGTH_BUCKETS = tuple(2**k for k in range(0, 17))


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.statistics = Statistics()  # Triton's exact counts (statistics routes, gRPC)
        r = self.registry
        counter, gauge, histogram = _bound(Counter, r), _bound(Gauge, r), _bound(Histogram, r)
        self.requests = counter(
            "lara_requests",
            "Inference requests by model, outcome (ok or error kind) and protocol (v1, v2, tei, torchserve, grpc, ...)",
            ["model", "outcome", "protocol"],
        )
        self.request_time = histogram(
            "lara_request_seconds", "Wall time of inference requests", ["model", "protocol"], buckets=_LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "lara_queue_seconds", "Time an item waited for its batch", ["model"], buckets=_LATENCY_BUCKETS
        )
        self.inference_time = histogram(
            "lara_inference_seconds", "Backend time per batch", ["model"], buckets=_LATENCY_BUCKETS
        )
        self.batch_size = histogram("lara_batch_size", "Items per batch", ["model"], buckets=_SIZE_BUCKETS)
        self.batch_tokens = histogram(
            "lara_batch_tokens", "Padded tokens per batch (padded length x items)", ["model"], buckets=_TOKEN_BUCKETS
        )
        self.queue_depth = gauge("lara_queue_depth", "Items waiting per model", ["model"])
        self.items_dropped = counter(
            "lara_items_dropped",
            "Items removed from the queue without being computed: reason cancelled (client disconnected "
            "or request timed out while queued) or deadline (could not finish before request_timeout_s)",
            ["model", "reason"],
        )
        self.items_orphaned = counter(
            "lara_items_orphaned",
            "Items computed although their request had gone (disconnected or timed out mid-batch)",
            ["model"],
        )
        self.model_ready = gauge(
            "lara_model_ready", "1 if the model serves, 0 if it failed to load (see the start-up log)", ["model"]
        )
        self.model_load_failures = counter(
            "lara_model_load_failures", "Models that failed to load or to pass the load-time check", ["model"]
        )
        self.connections_refused = counter(
            "lara_connections_refused", "Connections closed at once because max_connections were open"
        )
        self.large_bodies_refused = counter(
            "lara_large_bodies_refused",
            "Requests answered 503 because max_large_bodies requests with large bodies were in flight",
        )
        self.client_timeouts = counter(
            "lara_client_timeouts",
            "Connections closed because the client was too slow: phase header or body (408)",
            ["phase"],
        )
        self.nonfinite_outputs = counter(
            "lara_nonfinite_outputs",
            "Items whose model output held NaN or Inf (answered 500, never as a result)",
            ["model"],
        )
        self.out_of_distribution = counter(
            "lara_out_of_distribution",
            "Items answered with in_distribution false (ood_score above the model's ood.threshold): the signal of "
            "inputs unlike the training data; compare with lara_input_length_count (items computed)",
            ["model"],
        )
        self.in_flight = gauge("lara_requests_in_flight", "Inference requests being served now")
        self.draining = gauge("lara_draining", "1 while the server drains after SIGTERM/SIGINT")
        self.input_length = histogram(
            "lara_input_length",
            "Tokens per item the model ran on (text: UTF-8 bytes after truncation; image: 1)",
            ["model"],
            buckets=_LENGTH_BUCKETS,
        )
        self.item_time = histogram(
            "lara_item_seconds",
            "Queue + inference time per item, by input length (label length: the power of two at or above it)",
            ["model", "length"],
            buckets=_LATENCY_BUCKETS,
        )
        # The version of the server (the model versions are on lara_model_info), and the process's own
        # CPU, memory, open files and GC, as every Prometheus client exports them by default.
        Info("lara_build", "Server version", registry=r).info({"version": server_version()})
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)

    def observe_items(self, model: str, lengths: Sequence[int], seconds: Sequence[float]) -> None:
        """Per item: its length, and its queue + inference time by length (the /ui latency-vs-length chart)."""
        for length, s in zip(lengths, seconds, strict=True):
            self.input_length.labels(model).observe(length)
            bucket = next((b for b in _LENGTH_BUCKETS if length <= b), _LENGTH_BUCKETS[-1] * 2)
            self.item_time.labels(model, str(bucket)).observe(s)

    def track_models(self, served: Callable[[], Iterable[tuple[str, str, str, str]]]) -> None:
        """lara_model_info{model, version, backend, task} = 1 for each model `served()` yields, read at scrape
        time, so loads and unloads show without bookkeeping."""
        self.registry.register(_ModelInfoCollector(served))

    def observer(self, model: str) -> ModelObserver:
        return ModelObserver(self, model)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelObserver:
    """The batcher's view of the metrics (lara_serve.server.batcher.BatchObserver)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._metrics, self._model = metrics, model

    def batch_done(self, size: int, padded_tokens: int, inference_s: float) -> None:
        m = self._metrics
        m.batch_size.labels(self._model).observe(size)
        m.batch_tokens.labels(self._model).observe(padded_tokens)
        m.inference_time.labels(self._model).observe(inference_s)
        m.statistics.batch_done(self._model, size, inference_s)

    def queue_depth(self, depth: int) -> None:
        self._metrics.queue_depth.labels(self._model).set(depth)

    def items_dropped(self, reason: str, count: int) -> None:
        self._metrics.items_dropped.labels(self._model, reason).inc(count)

    def items_orphaned(self, count: int) -> None:
        self._metrics.items_orphaned.labels(self._model).inc(count)

    def nonfinite_outputs(self, count: int) -> None:
        self._metrics.nonfinite_outputs.labels(self._model).inc(count)

    def out_of_distribution(self, count: int) -> None:
        if count:
            self._metrics.out_of_distribution.labels(self._model).inc(count)


_M = TypeVar("_M", Counter, Gauge, Histogram)


def _bound(kind: Callable[..., _M], registry: CollectorRegistry) -> Callable[..., _M]:
    """`kind` on this app's registry: every metric of an app lives on its own registry (see the module doc)."""
    return functools.partial(kind, registry=registry)


def server_version() -> str:
    try:
        return version("lara-serve")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class _ModelInfoCollector(Collector):
    def __init__(self, served: Callable[[], Iterable[tuple[str, str, str, str]]]) -> None:
        self._served = served

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "lara_model_info", "1 per served model, with its version", labels=["model", "version", "backend", "task"]
        )
        for labels in self._served():
            family.add_metric(list(labels), 1.0)
        yield family
