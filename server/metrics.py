"""Prometheus metrics, on a registry per app (several apps can live in one process, e.g. in tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = tuple(2**k for k in range(4, 21))


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "lara_requests",
            "Inference requests by model and outcome (ok or error kind)",
            ["model", "outcome"],
            registry=r,
        )
        self.request_time = Histogram(
            "lara_request_seconds",
            "Wall time of inference requests",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "lara_queue_seconds",
            "Time an item waited for its batch",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_time = Histogram(
            "lara_inference_seconds",
            "Backend time per batch",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram("lara_batch_size", "Items per batch", ["model"], buckets=_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram(
            "lara_batch_tokens",
            "Padded tokens per batch (padded length x items)",
            ["model"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("lara_queue_depth", "Items waiting per model", ["model"], registry=r)

    def observer(self, model: str) -> ModelObserver:
        return ModelObserver(self, model)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelObserver:
    """The batcher's view of the metrics (server.batcher.BatchObserver)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._metrics, self._model = metrics, model

    def batch_done(self, size: int, padded_tokens: int, inference_s: float) -> None:
        m = self._metrics
        m.batch_size.labels(self._model).observe(size)
        m.batch_tokens.labels(self._model).observe(padded_tokens)
        m.inference_time.labels(self._model).observe(inference_s)

    def queue_depth(self, depth: int) -> None:
        self._metrics.queue_depth.labels(self._model).set(depth)
