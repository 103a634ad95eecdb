"""Load points and arrival schedules.

Closed loop: C workers, each sends its next request when its last answer arrives (the load adapts to the
server). Open loop: requests are sent at scheduled times, Poisson or evenly spaced, whatever the server
does; latency is counted from the scheduled time, so a stalled server (or a saturated client) shows up
as latency instead of silently lowering the offered load (no coordinated omission).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Mode = Literal["closed", "open"]
Arrival = Literal["poisson", "constant"]


@dataclass(frozen=True)
class LoadPoint:
    mode: Mode
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, requests/s
    arrival: Arrival = "poisson"
    max_in_flight: int | None = None  # open loop: requests beyond this wait (and their wait counts)

    def __post_init__(self) -> None:
        if self.mode == "closed" and (self.concurrency is None or self.concurrency < 1):
            raise ValueError(f"closed loop needs concurrency >= 1, got {self.concurrency}")
        if self.mode == "open" and (self.rate is None or self.rate <= 0):
            raise ValueError(f"open loop needs a rate > 0 requests/s, got {self.rate}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")

    @classmethod
    def closed(cls, concurrency: int) -> LoadPoint:
        return cls("closed", concurrency=concurrency)

    @classmethod
    def open(cls, rate: float, arrival: Arrival = "poisson", max_in_flight: int | None = None) -> LoadPoint:
        return cls("open", rate=rate, arrival=arrival, max_in_flight=max_in_flight)

    @property
    def label(self) -> str:
        if self.mode == "closed":
            return f"c={self.concurrency}"
        cap = f", max {self.max_in_flight} in flight" if self.max_in_flight else ""
        return f"{self.rate:g}/s {self.arrival}{cap}"

    @property
    def x(self) -> float:
        """Position on a 'vs load' axis: concurrency or rate."""
        return float(self.concurrency if self.mode == "closed" else self.rate)  # type: ignore[arg-type]


def arrival_offsets(rate: float, arrival: Arrival, max_requests: int, max_seconds: float, seed: int) -> list[float]:
    """Send times in seconds from the cell's start: at most max_requests, none after max_seconds."""
    rng = random.Random(seed)
    offsets: list[float] = []
    t = 0.0
    while len(offsets) < max_requests:
        # Poisson process: exponential gaps of mean 1/rate. The first request goes at t=0 either way.
        if offsets:
            t += rng.expovariate(rate) if arrival == "poisson" else 1.0 / rate
        if t > max_seconds:
            break
        offsets.append(t)
    return offsets
