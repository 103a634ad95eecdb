"""One access-log line per gRPC call, as HTTP requests get one (uvicorn's, and lara_serve.server.middleware's):

    127.0.0.1:53412 - "gRPC /inference.GRPCInferenceService/ModelInfer" 0 OK model=lara-text-news-bytes 12.3ms

peer, the full method, the status code (number and name, as HTTP's "200 OK"), the model ("-" when the
call names none; the service name for health checks) and the time from the call's start to its end.
INFO on the HTTP access lines' logger `lara_serve.access`, with their record fields for `--log-format
json` (method "gRPC", path = the full method, status = the gRPC code's number, duration_ms), so
`--log-level warning` silences both. Streams (health Watch, reflection) log once, when they end.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import grpc

log = logging.getLogger("lara_serve.access")  # the HTTP access lines' logger
# The handler below fills in the model once it has parsed the request: the interceptor only sees bytes.
_model: ContextVar[list[str] | None] = ContextVar("lara_grpc_model", default=None)


def note_model(name: str) -> None:
    """The model (or health service) this call is about, for its access-log line."""
    slot = _model.get()
    if slot is not None:
        slot.append(name)


def peer_address(peer: str | None) -> str:
    """grpc's "ipv4:127.0.0.1:53412" / "ipv6:[::1]:53412" -> the address as uvicorn prints it."""
    if not peer:
        return "-"
    kind, _, address = peer.partition(":")
    return address if kind in ("ipv4", "ipv6") else peer


def log_call(peer: str, method: str, code: grpc.StatusCode, model: str, seconds: float) -> None:
    number, ms = code.value[0], round(seconds * 1000, 3)
    extra = {"method": "gRPC", "path": method, "status": number, "duration_ms": ms}
    log.info('%s - "gRPC %s" %d %s model=%s %.1fms', peer, method, number, code.name, model or "-", ms, extra=extra)


@contextmanager
def _logged(method: str, context: Any) -> Iterator[None]:
    slot: list[str] = []
    token = _model.set(slot)
    start = time.perf_counter()
    code = grpc.StatusCode.OK
    try:
        yield
    except asyncio.CancelledError:
        code = grpc.StatusCode.CANCELLED  # the client cancelled or its deadline passed
        raise
    except BaseException:
        code = context.code() or grpc.StatusCode.UNKNOWN  # abort() set the code before it raised
        raise
    else:
        code = context.code() or grpc.StatusCode.OK
    finally:
        _model.reset(token)
        if log.isEnabledFor(logging.INFO):  # off (--log-level warning): no formatting work per call
            seconds, model = time.perf_counter() - start, slot[-1] if slot else ""
            log_call(peer_address(context.peer()), method, _status(code), model, seconds)


def _status(code: Any) -> grpc.StatusCode:
    """context.code() is a StatusCode once set, but may be the raw integer in some grpc versions."""
    if isinstance(code, grpc.StatusCode):
        return code
    return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)


def _timed(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: Any) -> Any:
            with _logged(method, context):
                async for response in behavior(request, context):
                    yield response

        return stream

    async def call(request: Any, context: Any) -> Any:
        with _logged(method, context):
            return await behavior(request, context)

    return call


_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class AccessLog(grpc.aio.ServerInterceptor):
    """Wraps every handler (KServe, health, reflection) so each call ends with one log line."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:  # no such method: grpc answers UNIMPLEMENTED without a handler
            if log.isEnabledFor(logging.INFO):
                log_call("-", details.method, grpc.StatusCode.UNIMPLEMENTED, "", 0.0)
            return None
        for kind in _KINDS:
            behavior = getattr(handler, kind)
            if behavior is not None:
                return handler._replace(**{kind: _timed(details.method, behavior)})
        return handler
