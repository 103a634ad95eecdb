"""What every route shares: app state, auth, request tracking, timing headers."""

from __future__ import annotations

import asyncio
import hmac
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, Request
from starlette.requests import ClientDisconnect

from lara_serve.server import request_context
from lara_serve.server.batcher import BatchResult
from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.inputs import model_bytes
from lara_serve.server.metrics import Metrics
from lara_serve.server.models import ModelRegistry, Scored, ServedModel
from lara_serve.server.preprocess import DecodeBudget, release_free_memory
from lara_serve.server.schemas import LabelScore, Prediction, run_sized
from lara_serve.server.settings import Settings


@dataclass
class AppState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    registry: ModelRegistry = field(default_factory=ModelRegistry)
    started: bool = False  # the lifespan loaded the models
    draining: bool = False  # SIGTERM/SIGINT: finish accepted work, take no new work
    inflight: int = 0  # inference requests inside `track`
    burst_peak: int = 0  # most requests in `track` at once since the server was last idle
    uploading: dict[asyncio.Task[Any], ClientWatch] = field(default_factory=dict)  # waiting for body bytes
    decode_budget: DecodeBudget = field(init=False)

    def __post_init__(self) -> None:
        self.decode_budget = DecodeBudget(self.settings.max_decode_pixels, self.settings.max_decode_threads)

    @property
    def ready(self) -> bool:
        """Readiness: serving at least one model and not draining."""
        return self.started and not self.draining and bool(self.registry.models)

    def model(self, name: str, version: str | None = None) -> ServedModel:
        if self.draining:
            raise ServeError(
                ErrorKind.NOT_READY,
                "server is shutting down; retry (another replica will answer)",
                retry_after_s=random.randint(1, 3),
            )
        if not self.started:
            raise ServeError(ErrorKind.NOT_READY, "models are loading", retry_after_s=random.randint(1, 3))
        return self.registry.get(name, version)


@dataclass
class ClientWatch:
    """Per request, set by lara_serve.server.app's disconnect watcher: did the client hang up?"""

    disconnected: bool = False
    shutdown: bool = False  # the drain ended while its body was still arriving (lara_serve.server.serving)


client_watch: ContextVar[ClientWatch | None] = ContextVar("lara_client_watch", default=None)
# The current request's (queue_s, compute_s), set by timing_headers and read by track for the statistics.
_request_times: ContextVar[tuple[float, float] | None] = ContextVar("lara_request_times", default=None)


# The dependencies below are coroutines although they never wait: FastAPI runs a plain `def` dependency in
# its thread pool, two thread hand-offs per request before the route runs, for work that takes microseconds.
# (Measured with the synthetic image over binary HTTP, load average 5.5: the same latency and CPU per request
# within the noise either way; kept as the cheaper path.) tests/server/test_dependencies.py.


async def get_state(request: Request) -> AppState:
    return app_state(request)


def app_state(request: Request) -> AppState:
    return request.app.state.lara


State = Annotated[AppState, Depends(get_state)]


async def require_api_key(request: Request, state: State) -> None:
    """`Authorization: Bearer <key>` or `X-API-Key: <key>`, compared in constant time."""
    check_api_key(request, state)


def check_api_key(request: Request, state: AppState) -> None:
    """require_api_key's check, for callers outside FastAPI's dependency injection."""
    key = state.settings.api_key
    if key is None:
        return
    given = request.headers.get("x-api-key")
    auth = request.headers.get("authorization", "")
    if given is None and auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
    if given is None or not hmac.compare_digest(given.encode(), key.get_secret_value().encode()):
        raise ServeError(
            ErrorKind.UNAUTHENTICATED,
            "missing or wrong API key: send 'Authorization: Bearer <key>' or 'X-API-Key'",
        )


async def read_body(request: Request) -> bytes:
    """`request.body()`, with a large body joined in the parser thread: joining 16 MB of chunks is a
    memcpy plus page faults that the event loop would wait for, while in a thread CPython's bytes.join
    releases the GIL (for joins over 1 MiB)."""
    chunks = [chunk async for chunk in request.stream()]
    body = await run_sized(sum(map(len, chunks)), b"".join, chunks)
    request._body = body  # what Request.body() returns from now on (the stream is consumed)
    return body


async def upload_bytes(model: ServedModel, request: Request) -> bytes:
    """A raw (not multipart) upload -> the model's bytes (`lara_serve.server.inputs.model_bytes`). A large text is
    sniffed or re-encoded in the parser thread: decoding 16 MB, to check it is UTF-8 or to convert its
    charset, must not hold the event loop."""
    body = await read_body(request)
    content_type = request.headers.get("content-type")
    return await run_sized(len(body), model_bytes, model.config.task, model.name, body, content_type)


@contextmanager
def track(state: AppState, model: str) -> Iterator[None]:
    """Count the request by outcome and time it (metrics); the drain waits for `state.inflight` to be 0."""
    start = time.perf_counter()
    outcome = "ok"
    times = _request_times.set(None)
    state.inflight += 1
    state.burst_peak = max(state.burst_peak, state.inflight)
    state.metrics.in_flight.inc()
    try:
        yield
    except ServeError as exc:
        outcome = exc.kind.value
        raise
    except RecursionError:  # a body nested too deeply for a parser (lara_serve.server.app answers 400)
        outcome = ErrorKind.MALFORMED.value
        raise
    except ClientDisconnect:  # hung up while sending the body
        outcome = ErrorKind.CLIENT_CLOSED.value
        raise
    except asyncio.CancelledError:
        watch = client_watch.get()
        outcome = ErrorKind.CLIENT_CLOSED.value if watch is not None and watch.disconnected else "cancelled"
        raise
    except Exception:
        outcome = ErrorKind.BACKEND_FAILURE.value
        raise
    finally:
        state.inflight -= 1
        state.metrics.in_flight.dec()
        if state.inflight == 0:
            _after_burst(state)
        # Unknown names are user input: do not let them create unbounded label values.
        known = model in state.registry.models or model in state.registry.failed
        label = model if known else "_unknown"
        wall_s = time.perf_counter() - start
        protocol = request_context.protocol.get()
        state.metrics.requests.labels(label, outcome, protocol).inc()
        state.metrics.request_time.labels(label, protocol).observe(wall_s)
        if known:
            queue_s, compute_s = _request_times.get() or (0.0, 0.0)
            state.metrics.statistics.request_done(model, outcome == "ok", wall_s, queue_s, compute_s)
        _request_times.reset(times)


# A burst of this many requests at once leaves enough freed memory to hand back once the server is idle;
# idle means no request in `track` for TRIM_IDLE_S, so a trim never lands between two waves of a burst.
TRIM_AFTER_CONCURRENT = 32
TRIM_IDLE_S = 1.0


def _after_burst(state: AppState) -> None:
    """No request in flight: after a burst, hand the allocator's free memory back to the OS once the
    server has stayed idle for TRIM_IDLE_S. Without this glibc keeps what the burst's bodies and buffers
    used (1,000 concurrent 64 KB texts: RSS 99 -> 202 MiB, still 202 MiB later; docs/reliability.md)."""
    if state.burst_peak >= TRIM_AFTER_CONCURRENT:
        asyncio.get_running_loop().call_later(TRIM_IDLE_S, _trim_if_idle, state)
    else:
        state.burst_peak = 0


def _trim_if_idle(state: AppState) -> None:
    if state.inflight == 0 and state.burst_peak >= TRIM_AFTER_CONCURRENT:
        state.burst_peak = 0
        # malloc_trim walks every arena: in a thread (ctypes releases the GIL), not on the event loop.
        asyncio.get_running_loop().run_in_executor(None, release_free_memory)


def timing_headers(state: AppState, model: str, results: Sequence[BatchResult[Any]]) -> dict[str, str]:
    queue_s = max(r.queue_s for r in results)
    inference_s = max(r.inference_s for r in results)
    for r in results:
        state.metrics.queue_time.labels(model).observe(r.queue_s)
    _request_times.set((queue_s, inference_s))
    return {
        "X-Queue-Time-Ms": f"{queue_s * 1000:.3f}",
        "X-Inference-Time-Ms": f"{inference_s * 1000:.3f}",
        "X-Batch-Size": str(max(r.batch_size for r in results)),
    }


def bool_param(params: dict[str, Any], name: str) -> bool:
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise ServeError(ErrorKind.MALFORMED, f"parameter {name!r} must be true or false, got {value!r}")
    return value


def predictions(model: ServedModel, scored: Sequence[Scored], top_k: int) -> list[Prediction]:
    """One Prediction per item; ties keep label order (stable sort)."""
    labels = model.config.labels
    k = min(top_k, len(labels))
    out = []
    for item in scored:
        row = item.probabilities
        order = np.argsort(-row, kind="stable")[:k]
        top = [LabelScore(label=labels[i], score=float(row[i])) for i in order]
        out.append(Prediction(label=top[0].label, score=top[0].score, top_k=top, ood_score=item.ood_score,
                              in_distribution=item.in_distribution))  # fmt: skip
    return out
