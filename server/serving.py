"""uvicorn glue: drain on SIGTERM/SIGINT, a cap on open connections, and slow-client timeouts.

Drain: the first signal turns readiness 503 and new inference requests 503 (JSON, Retry-After) while the
listener stays open, so a load balancer sees the pod leave instead of refused connections; accepted
requests finish (up to graceful_timeout_s), then uvicorn closes the listener and exits. Work still queued
when the time is up is answered 503 JSON, never left for uvicorn to cancel into a plain-text 500. A
second SIGINT (Ctrl+C twice) exits at once; a second SIGTERM ends the drain early.

Connections (h11, the protocol uvicorn uses here): beyond max_connections a new connection's request
head is read (for up to REFUSE_READ_S), answered 503 with Retry-After, and the connection closed once the
client has it (closing with the request unread would reset it before the client reads the answer). A
client gets header_timeout_s to send a request's headers (from connecting, or from the previous
response) and is closed after that, with a 408 if it had started sending. A request answered before its
body was read (404, 405, 413, 401, ...) may finish sending its body until body_timeout_s from its headers
(so the client can read the answer); then the connection is closed, however slowly bytes still trickle.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import signal
import time
from http import HTTPStatus
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.routes.common import AppState

log = logging.getLogger(__name__)
FD_RESERVE = 64  # descriptors kept for model files, logs, the listener and library threads
SHUTDOWN_BACKSTOP_S = 5.0  # after the drain: responses still being written get this long
# At the final shutdown an idle connection may have a request on its way (a client that just connected,
# or reused a keep-alive connection): closing at once would drop it unanswered, so it gets this long to
# arrive and be answered with the drain's 503.
IDLE_LINGER_S = 0.5
REFUSE_READ_S = 1.0  # over the connection cap: time to read the request head before answering 503
REFUSE_HEAD_BYTES = 16 * 1024  # ... and at most this much of it
EARLY_LINGER_S = 0.5  # least time after an early answer for the client to read it before the close
ACCEPT_LOG_EVERY_S = 10.0  # accept() failures (EMFILE): one log line per this many seconds, with a count


def fit_connections(requested: int, backlog: int = 2048) -> tuple[int, int]:
    """(max_connections, listen backlog) that fit the open-file limit, raising the soft limit first.

    asyncio accepts up to `backlog` pending connections in one go before any is refused, so a burst can
    hold max_connections + backlog descriptors at once; both must fit, or accept() fails with EMFILE.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = requested + backlog + FD_RESERVE
    if needed > soft and (hard == resource.RLIM_INFINITY or hard > soft):
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    budget = max(2, soft - FD_RESERVE)
    if requested + backlog <= budget:
        return requested, backlog
    fitted_backlog = max(1, min(backlog, budget // 4))
    fitted = max(1, min(requested, budget - fitted_backlog))
    log.warning("open-file limit %d: max_connections %d -> %d, listen backlog %d -> %d",
                soft, requested, fitted, backlog, fitted_backlog)  # fmt: skip
    return fitted, fitted_backlog


def fit_all(settings: Any) -> tuple[int, int, int]:
    """(HTTP max_connections, gRPC max connections, listen backlog) in the one open-file budget.

    HTTP and gRPC share the process's descriptors: each gets its cap, and when both do not fit they
    shrink in proportion, so idle connections on one port cannot starve the other (or the health checks).
    """
    grpc_wanted = settings.grpc_max_connections if settings.grpc_port else 0
    total = settings.max_connections + grpc_wanted
    fitted, backlog = fit_connections(total)
    if not grpc_wanted:
        return fitted, 0, backlog
    if fitted == total:
        return settings.max_connections, grpc_wanted, backlog
    grpc_fitted = max(1, fitted * grpc_wanted // total)
    return max(1, fitted - grpc_fitted), grpc_fitted, backlog


class AcceptErrorFilter(logging.Filter):
    """At most one accept() failure line per `every_s` seconds, with the count of those not written:
    out of descriptors, the accept loop fails as fast as clients connect, and a line each fills the disk."""

    def __init__(self, every_s: float = ACCEPT_LOG_EVERY_S) -> None:
        super().__init__()
        self.every_s, self.suppressed, self._last = every_s, 0, -every_s

    def filter(self, record: logging.LogRecord) -> bool:
        if "accept" not in str(record.msg):
            return True
        now = time.monotonic()
        if now - self._last < self.every_s:
            self.suppressed += 1
            return False
        self._last = now
        if self.suppressed:
            record.msg = f"{record.msg} ({self.suppressed} more like it in the last {self.every_s:g} s not logged)"
            self.suppressed = 0
        record.exc_info, record.exc_text = None, None  # the traceback says nothing new each time
        return True


def raw_response(status: int, message: str, extra: dict[str, str] | None = None) -> bytes:
    """A complete JSON error response written straight to a transport, for connections the app never sees."""
    body = json.dumps({"error": message}).encode()
    headers = {"content-type": "application/json", "content-length": str(len(body)), "connection": "close",
               **(extra or {})}  # fmt: skip
    head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"\r\n" + body


def guarded_protocol(state: AppState, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a connection cap and a header timeout (counted in state.metrics)."""
    header_timeout_s = state.settings.header_timeout_s
    body_timeout_s = state.settings.body_timeout_s
    metrics = state.metrics

    class GuardedH11Protocol(H11Protocol):
        _refused: _Refusal | None = None
        _header_timer: asyncio.TimerHandle | None = None
        _body_deadline = 0.0  # loop time by which the current request's body must be in

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = _StrictConnection(h11.SERVER, self.conn._max_incomplete_event_size)

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to a request h11 cannot parse (or _StrictConnection refuses), in the project's
            JSON error shape instead of text/plain; the connection is closed, as uvicorn does."""
            reason = getattr(self.conn, "refusal", None) or f"{msg.rstrip('.')}: malformed request line or headers"
            cycle = self.cycle  # the previous request's, on a keep-alive connection
            if cycle is None or cycle.response_complete or not cycle.response_started:  # else mid-answer: close
                self.transport.write(raw_response(400, reason))
            self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                metrics.connections_refused.inc()
                message = f"too many open connections (max_connections={max_connections}); retry"
                self._refused = _Refusal(transport, raw_response(503, message, {"retry-after": "1"}))
                return
            super().connection_made(transport)
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if self._refused is not None:
                return self._refused.data_received(data)
            super().data_received(data)

        def eof_received(self) -> bool | None:  # type: ignore[override]
            if self._refused is not None:
                return self._refused.eof_received()
            return super().eof_received()  # type: ignore[func-returns-value]

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused is not None:
                return self._refused.connection_lost()
            self._disarm_header_timer()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            before = self.conn.their_state
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
                self._disarm_header_timer()
                if before is h11.IDLE:
                    self._body_deadline = self.loop.time() + body_timeout_s
            elif self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm_header_timer()  # the body of an early-answered request ended: the next one's clock

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if self.conn.their_state is h11.IDLE:
                self._arm_header_timer()  # the next request's headers get the same time
            elif self.conn.their_state is h11.SEND_BODY:  # answered before the body was read
                delay = max(EARLY_LINGER_S, self._body_deadline - self.loop.time())
                self.loop.call_later(delay, self._close_unfinished, self.cycle)

        def _close_unfinished(self, cycle: object) -> None:
            """The body of an answered request still trickles in past body_timeout_s: close."""
            if self.cycle is cycle and not self.transport.is_closing() and self.conn.their_state is h11.SEND_BODY:
                metrics.client_timeouts.labels("body").inc()
                self.transport.close()

        def shutdown(self) -> None:
            if self.cycle is None or self.cycle.response_complete:
                self.loop.call_later(IDLE_LINGER_S, self._shutdown_now)
            else:
                super().shutdown()  # a response is under way: close after it

        def _shutdown_now(self) -> None:
            if not self.transport.is_closing():
                super().shutdown()

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            waiting = self.cycle is None or self.cycle.response_complete
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE or not waiting:
                return
            if self.conn.trailing_data[0]:  # it started a request and is too slow: say why
                metrics.client_timeouts.labels("header").inc()
                message = f"request headers not received within header_timeout_s={header_timeout_s:g}"
                self.transport.write(raw_response(408, message))
            self.transport.close()

    return GuardedH11Protocol


class _StrictConnection(h11.Connection):
    """h11 with RFC 9112's rule for a request carrying both Content-Length and Transfer-Encoding (section
    6.1: "ought to be handled as an error", and the connection closed): h11 alone frames such a request by
    Transfer-Encoding and keeps the connection, so behind a proxy that frames by Content-Length the rest of
    the body would run as a request of its own (smuggling). The refusal becomes uvicorn's 400, and close."""

    refusal: str | None = None

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request):
            names = {name.lower() for name, _ in event.headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                self.refusal = (
                    "request has both Content-Length and Transfer-Encoding (RFC 9112 section 6.1); "
                    "send one of them; the connection is closed"
                )
                raise h11.RemoteProtocolError(self.refusal)
        return event


class _Refusal:
    """A connection over the cap: read the request head (bounded in time and bytes), answer 503, send FIN,
    and close when the client closes or soon after, so the answer is read instead of reset."""

    def __init__(self, transport: asyncio.Transport, response: bytes) -> None:
        self.transport, self.response = transport, response
        self.head = b""
        self.answered = False
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(REFUSE_READ_S, self.answer)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return  # the rest of the request: read and dropped, so closing does not reset the connection
        self.head = (self.head + data)[-REFUSE_HEAD_BYTES:]
        if b"\r\n\r\n" in self.head or len(self.head) >= REFUSE_HEAD_BYTES:
            self.answer()

    def answer(self) -> None:
        if self.answered or self.transport.is_closing():
            return
        self.answered = True
        self._timer.cancel()
        self.transport.write(self.response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(EARLY_LINGER_S, self.transport.close)

    def eof_received(self) -> bool:
        self.answer()
        return True  # keep the transport open until the answer is written; the timer closes it

    def connection_lost(self) -> None:
        self._timer.cancel()


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None

    async def startup(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.state.draining or self._loop is None or not self.state.started:
            return super().handle_exit(sig, frame)  # second signal, or not serving yet: uvicorn's way
        self._captured_signals.append(sig)  # uvicorn re-raises it after shutdown (exit status)
        self.state.draining = True  # readiness 503 and new requests 503 from now on
        self.state.metrics.draining.set(1)
        log.info("%s: draining (%d requests in flight)", signal.Signals(sig).name, self.state.inflight)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain = asyncio.get_running_loop().create_task(self.drain(), name="lara-drain")

    async def drain(self) -> None:
        """Wait for accepted requests, then let uvicorn shut down."""
        graceful_s = self.state.settings.graceful_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + graceful_s
        while self.state.inflight and loop.time() < deadline and not self.should_exit:
            await asyncio.sleep(0.05)
        self._end_uploads()
        if self.state.inflight:
            error = ServeError(
                ErrorKind.NOT_READY, "server shut down before this request was computed", retry_after_s=1
            )
            failed = sum(m.batcher.fail_queued(error) for m in self.state.registry.models.values())
            log.warning("graceful_timeout_s=%g exceeded: %d queued items answered 503", graceful_s, failed)
            backstop = loop.time() + SHUTDOWN_BACKSTOP_S  # running batches finish and answer
            while self.state.inflight and loop.time() < backstop:
                await asyncio.sleep(0.05)
        log.info("drained; shutting down")
        self.should_exit = True

    def _end_uploads(self) -> None:
        """Requests still receiving their body when the grace period ends get 503 JSON now, instead of
        uvicorn's plain-text 500 when it cancels them seconds later."""
        for task, watch in list(self.state.uploading.items()):
            watch.shutdown = True
            task.cancel()


def build_server(app: Any, state: AppState) -> DrainingServer:
    settings = state.settings
    max_connections, _, backlog = fit_all(settings)
    if not any(isinstance(f, AcceptErrorFilter) for f in logging.getLogger("asyncio").filters):
        logging.getLogger("asyncio").addFilter(AcceptErrorFilter())
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        http=guarded_protocol(state, max_connections),
        backlog=backlog,
        timeout_keep_alive=settings.keep_alive_timeout_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=int(SHUTDOWN_BACKSTOP_S),
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        # json: uvicorn's loggers go through the root handler (lara_serve.server.log_format), and the app
        # writes the access lines, with the request id and duration that uvicorn's lack.
        **({"log_config": None, "access_log": False} if settings.log_format == "json" else {}),
    )
    return DrainingServer(config, state)
