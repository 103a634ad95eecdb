"""The gRPC port behind the same limits as HTTP: connections, the API key, calls and bytes in flight.

- Connections: grpc core caps them (grpc.max_allowed_incoming_connections) inside the one open-file budget
  that lara_serve.server.serving.fit_all splits between HTTP and gRPC; a connection must finish its
  handshake within header_timeout_s and is closed after grpc_idle_timeout_s without calls.
- The key: checked from metadata before the message is read. grpc receives and deserialises a unary
  request before its handler runs, so a call without the key gets a client-streaming handler that aborts
  before reading anything (and whose deserialiser does nothing), as an HTTP 401 leaves the body unread.
- Calls: beyond grpc_max_concurrent_calls KServe calls in flight a call is UNAVAILABLE (retryable) at once,
  never queued until a client gives up (CANCELLED). Health and reflection are not counted.
- Bytes: messages over large_body_bytes count their size against a byte budget (max_large_bodies x
  grpc_max_message_bytes, HTTP's large-body memory bound); beyond it RESOURCE_EXHAUSTED, retryable.
Every refusal is counted in lara_requests{protocol="grpc"} with its outcome.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from lara_serve.server.errors import ErrorKind
from lara_serve.server.routes.common import AppState

SERVICE = "inference.GRPCInferenceService"
PUBLIC = frozenset({"ServerLive", "ServerReady"})  # like /v2/health/*: probes carry no key
KEY_MESSAGE = "missing or wrong API key: send metadata 'authorization: Bearer <key>' or 'x-api-key: <key>'"
STREAMS_PER_CONNECTION = 128  # HTTP/2 streams one connection may open; the call cap bounds the total


def channel_options(state: AppState, max_connections: int) -> list[tuple[str, int]]:
    """grpc.aio.server options: message size, connection cap, handshake and idle timeouts."""
    settings = state.settings
    limit = settings.grpc_max_message_bytes
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.max_allowed_incoming_connections", max_connections),
        ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
        # Calls that arrived before the server asked for them: grpc core cancels some beyond 1000 (its
        # default), and CANCELLED is neither retryable nor counted. Every stream the caps allow may wait
        # here; CallGuard refuses beyond grpc_max_concurrent_calls with UNAVAILABLE instead.
        ("grpc.server.max_pending_requests", max_connections * STREAMS_PER_CONNECTION),
        ("grpc.server.max_pending_requests_hard_limit", max_connections * STREAMS_PER_CONNECTION),
        ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(settings.grpc_idle_timeout_s * 1000)),
    ]


def key_matches(expected: str, metadata: Sequence[tuple[str, Any]] | None) -> bool:
    """The key from 'x-api-key' or 'authorization: Bearer', compared in constant time."""
    headers = {k.lower(): v for k, v in metadata or ()}
    given = headers.get("x-api-key")
    auth = headers.get("authorization", "")
    if given is None and isinstance(auth, str) and auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


class ByteBudget:
    """Bytes of large messages in flight. take() never waits: gRPC clients retry RESOURCE_EXHAUSTED."""

    def __init__(self, limit: int, threshold: int) -> None:
        self.limit, self.threshold = limit, threshold
        self.held = 0

    def take(self, size: int) -> int:
        """The bytes taken (0 for a small message), or -1: over the budget, refuse."""
        if size <= self.threshold:
            return 0
        if self.held and self.held + size > self.limit:  # one message alone always fits (it is <= the max)
            return -1
        self.held += size
        return size

    def give(self, taken: int) -> None:
        self.held -= taken


def _refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that ends the call before its message is read. Registered as client-streaming (the wire is
    the same for a unary call): grpc then runs it at once instead of first receiving the whole message, so
    a refused 15 MB call costs a flow-control window, not 15 MB. Its deserialiser would drop any bytes."""

    async def refuse(requests: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.stream_unary_rpc_method_handler(refuse, request_deserializer=lambda raw: None)


class CallGuard(grpc.aio.ServerInterceptor):
    """The key before the message is read, and a cap on KServe calls in flight (counted when refused)."""

    def __init__(self, state: AppState, max_calls: int) -> None:
        self.state, self.max_calls = state, max_calls
        self.in_flight = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        prefix, _, name = details.method.rpartition("/")
        if prefix != f"/{SERVICE}":
            return await continuation(details)  # health, reflection: public and not capped
        key = self.state.settings.api_key
        needs_key = name not in PUBLIC and key is not None
        if needs_key and not key_matches(key.get_secret_value(), details.invocation_metadata):  # type: ignore[union-attr]
            self._count(ErrorKind.UNAUTHENTICATED)
            return _refusal(grpc.StatusCode.UNAUTHENTICATED, KEY_MESSAGE)
        if self.in_flight >= self.max_calls:  # refused before its message is parsed
            self._count(ErrorKind.QUEUE_FULL)
            return _refusal(grpc.StatusCode.UNAVAILABLE, self._full_message())
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        return handler._replace(unary_unary=self._counted(handler.unary_unary))

    def _counted(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            # Counted here, where a finally is sure to run: calls admitted together above may overshoot.
            if self.in_flight >= self.max_calls:
                self._count(ErrorKind.QUEUE_FULL)
                await context.abort(grpc.StatusCode.UNAVAILABLE, self._full_message())
            self.in_flight += 1
            try:
                return await behavior(request, context)
            finally:
                self.in_flight -= 1

        return call

    def _full_message(self) -> str:
        return f"{self.max_calls} gRPC calls are in flight (grpc_max_concurrent_calls); retry"

    def _count(self, kind: ErrorKind) -> None:
        self.state.metrics.requests.labels("", kind.value, "grpc").inc()
