"""Triton's inference statistics, kept exactly (Prometheus histograms give sums, not per-batch-size rows).

Counted as Triton counts them, so the numbers add up:
- per request: success (wall time), fail, and for each successful request its queue time (its longest-
  waiting item) and compute time (its batch's backend call): success.count == queue.count ==
  compute_infer.count;
- per batch: execution_count batches of inference_count items, split by batch size in batch_stats:
  execution_count == sum of batch_stats counts, inference_count == sum of batch_size x count;
- last_inference: milliseconds since the epoch when the last batch finished.
The HTTP routes, the gRPC servicer and the batcher observer all write here; the Triton statistics route
and gRPC ModelStatistics read it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStatistics:
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    batches: dict[int, Duration] = field(default_factory=dict)  # batch size -> backend calls of that size

    def as_triton(self, name: str, version: str) -> dict[str, Any]:
        """Triton's ModelStatistics as JSON (compute_input/output are inside compute_infer here: 0)."""
        zero = {"count": 0, "ns": 0}
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": zero,
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": zero,
                "cache_hit": zero,
                "cache_miss": zero,
            },
            "batch_stats": [
                {"batch_size": size, "compute_input": zero, "compute_infer": d.as_dict(), "compute_output": zero}
                for size, d in sorted(self.batches.items())
            ],
        }


class Statistics:
    """Per model name; written from the event loop and the batcher's worker threads, hence the lock."""

    def __init__(self) -> None:
        self._models: dict[str, ModelStatistics] = {}
        self._lock = threading.Lock()

    def _get(self, model: str) -> ModelStatistics:
        return self._models.setdefault(model, ModelStatistics())

    def batch_done(self, model: str, size: int, seconds: float) -> None:
        with self._lock:
            s = self._get(model)
            s.inference_count += size
            s.execution_count += 1
            s.batches.setdefault(size, Duration()).add(seconds)
            s.last_inference_ms = int(time.time() * 1000)

    def request_done(self, model: str, ok: bool, wall_s: float, queue_s: float = 0.0, compute_s: float = 0.0) -> None:
        with self._lock:
            s = self._get(model)
            if not ok:
                s.fail.add(wall_s)
                return
            s.success.add(wall_s)
            s.queue.add(queue_s)
            s.compute_infer.add(compute_s)

    def snapshot(self, model: str) -> ModelStatistics:
        with self._lock:
            s = self._get(model)
            return ModelStatistics(
                s.last_inference_ms, s.inference_count, s.execution_count,
                Duration(**vars(s.success)), Duration(**vars(s.fail)), Duration(**vars(s.queue)),
                Duration(**vars(s.compute_infer)), {k: Duration(**vars(v)) for k, v in s.batches.items()},
            )  # fmt: skip
