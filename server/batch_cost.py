"""How long a batch takes: a fixed cost per batch plus a cost per padded token, learned from what ran.

The batcher refuses an item before computing it only when the evidence says it could not finish in time
even alone. One per-token average cannot say that: after a few two-token batches (fixed cost dominates)
it extrapolates a 64 KB document to a minute and refuses it, the refused item never runs, and the
estimate never learns otherwise. So the model keeps recent (padded tokens, seconds) samples and:

- fits seconds = fixed + per_token x tokens by least squares (both >= 0), for messages and Retry-After;
- bounds that fit from above by the fastest recent batch at least as large (a batch of one item cannot be
  slower than a measured batch with more padded tokens, up to noise), and from below by a floor measured
  at start-up (the warm-up batches);
- never refuses by extrapolation: with no recent batch at least as large as the item, the item runs, and
  its batch becomes the measurement. Samples age out, so a slow spell cannot lock a length out for long.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class _Sample:
    tokens: int  # padded length x items of the batch
    seconds: float  # its run_batch wall time
    at: float  # time.perf_counter() when it finished


class BatchCostModel:
    """Seconds for a batch of `tokens` padded tokens, from the last `window` batches of this model."""

    def __init__(self, window: int = 64, evidence_max_age_s: float = 60.0) -> None:
        if window < 2 or evidence_max_age_s <= 0:
            raise ValueError("need window >= 2 and evidence_max_age_s > 0")
        self._samples: deque[_Sample] = deque(maxlen=window)
        self._evidence_max_age_s = evidence_max_age_s
        self._floor_s = 0.0
        self._fit: tuple[float, float] | None = None  # (fixed_s, per_token_s), cached until the next sample

    def observe(self, tokens: int, seconds: float, now: float | None = None) -> None:
        """Record one batch that ran: `tokens` padded tokens in `seconds`."""
        if tokens < 1 or not seconds >= 0:  # also refuses NaN
            return
        self._samples.append(_Sample(tokens, seconds, time.perf_counter() if now is None else now))
        self._fit = None

    def set_floor(self, seconds: float) -> None:
        """The least a batch costs here (the fastest warm-up batch): no estimate goes below it."""
        self._floor_s = max(0.0, seconds)

    @property
    def floor_s(self) -> float:
        return self._floor_s

    def fit(self) -> tuple[float, float]:
        """(fixed seconds per batch, seconds per padded token), least squares over the window, both >= 0."""
        if self._fit is None:
            self._fit = _least_squares([(s.tokens, s.seconds) for s in self._samples])
        return self._fit

    def estimate_s(self, tokens: int) -> float:
        """Best guess of a batch's time (may extrapolate; use `lower_bound_s` to refuse work)."""
        if not self._samples:
            return self._floor_s
        fixed, per_token = self.fit()
        return max(self._floor_s, fixed + per_token * tokens)

    def lower_bound_s(self, tokens: int, now: float | None = None) -> float | None:
        """The time below which a batch of `tokens` will not finish, by recent evidence; None if there is
        none (no batch at least this large ran within evidence_max_age_s: run it and measure)."""
        now = time.perf_counter() if now is None else now
        larger = [s.seconds for s in self._samples if s.tokens >= tokens and now - s.at <= self._evidence_max_age_s]
        if not larger:
            return None
        return min(min(larger), self.estimate_s(tokens))


def _least_squares(points: list[tuple[int, float]]) -> tuple[float, float]:
    """y = a + b x with a, b >= 0. One distinct x (or none) cannot separate a from b: all of it is fixed
    cost, which under-estimates larger batches rather than locking them out."""
    if not points:
        return 0.0, 0.0
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_x = sum((x - mean_x) ** 2 for x, _ in points)
    if var_x == 0:
        return mean_y, 0.0
    per_token = sum((x - mean_x) * (y - mean_y) for x, y in points) / var_x
    if per_token <= 0:  # noise (or a pause on a small batch) made larger batches look cheaper
        return mean_y, 0.0
    fixed = mean_y - per_token * mean_x
    if fixed < 0:  # the line through the origin fits better: refit the slope alone
        return 0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    return fixed, per_token
