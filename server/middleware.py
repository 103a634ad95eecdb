"""HTTP middlewares of the operations side: compressed request bodies, and the request's id, protocol and
access log line.

Compressed bodies are decoded here, before anything reads them (the body limits, the large-body gate,
the routes and the v2 binary extension, whose Inference-Header-Content-Length counts DECODED bytes), so
every route takes them. Decoding is incremental and bounded: a small compressed body cannot inflate past
max_body_bytes in memory (a "decompression bomb" is a 413 after at most max_body_bytes of output).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
import zlib
from collections.abc import Callable, Iterator

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lara_serve.server import request_context
from lara_serve.server.errors import ErrorKind, ServeError, too_large

access_log = logging.getLogger("lara_serve.access")
DECODE_PIECE_BYTES = 1 << 20  # output per zlib call: bounds the memory and event-loop time of one step
_ENCODINGS = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII, no spaces: safe in a header and a log line


class _BoundedDecoder:
    """gzip (RFC 1952, several members allowed) or deflate (zlib-wrapped as RFC 9110 says, or raw as some
    clients send it) -> pieces of at most DECODE_PIECE_BYTES, never more than max_bytes in all."""

    def __init__(self, encoding: str, max_bytes: int) -> None:
        self.encoding, self.max_bytes = encoding, max_bytes
        self.total = 0
        self._zlib: zlib._Decompress | None = None
        self._fed = False

    def _new(self, first: bytes) -> zlib._Decompress:
        if self.encoding == "gzip":
            return zlib.decompressobj(wbits=31)
        zlib_header = len(first) < 2 or (first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0)
        return zlib.decompressobj(wbits=15 if zlib_header else -15)

    def pieces(self, data: bytes) -> Iterator[bytes]:
        while data:
            if self._zlib is None:
                self._zlib = self._new(data)
            self._fed = True
            try:
                out = self._zlib.decompress(data, DECODE_PIECE_BYTES)
            except zlib.error as exc:
                raise self._corrupt(str(exc)) from None
            self.total += len(out)
            if self.total > self.max_bytes:
                raise too_large(
                    f"request body decompressed (Content-Encoding: {self.encoding}) exceeds "
                    f"max_body_bytes={self.max_bytes}; send a smaller body"
                )
            if out:
                yield out
            data = self._zlib.unconsumed_tail
            if self._zlib.eof:
                data = self._zlib.unused_data  # the next gzip member, if any
                if data and self.encoding != "gzip":
                    raise self._corrupt("data after the end of the deflate stream")
                self._zlib = None if data else self._zlib

    def finish(self) -> None:
        if self._fed and self._zlib is not None and not self._zlib.eof:
            raise self._corrupt("the compressed stream is truncated")

    def _corrupt(self, why: str) -> ServeError:
        return ServeError(
            ErrorKind.MALFORMED, f"request body is not valid {self.encoding} (Content-Encoding: {self.encoding}): {why}"
        )


class DecompressMiddleware:
    """Content-Encoding gzip / x-gzip / deflate / identity on every route; any other encoding is a 415.

    The decoded body reaches the app as a chunked body (no Content-Length, no Content-Encoding), so the
    body limits downstream count decoded bytes.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, respond: Callable[[ServeError], ASGIApp]) -> None:
        self.app, self.max_bytes, self.respond = app, max_bytes, respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = dict(scope["headers"]).get(b"content-encoding", b"").decode("latin-1").strip().lower()
        if raw in ("", "identity"):
            return await self.app(scope, receive, send)
        encoding = _ENCODINGS.get(raw)
        if encoding is None:
            error = ServeError(
                ErrorKind.UNSUPPORTED_MEDIA_TYPE,
                f"Content-Encoding {raw[:40]!r} is not supported; send gzip, deflate or identity (uncompressed)",
            )
            return await self.respond(error)(scope, receive, send)
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")]
        scope = {**scope, "headers": [*headers, (b"transfer-encoding", b"chunked")]}
        decoder = _BoundedDecoder(encoding, self.max_bytes)
        pieces: Iterator[bytes] = iter(())
        last, done = False, False

        async def decoded_receive() -> Message:
            nonlocal pieces, last, done
            while not done:
                piece = next(pieces, None)
                if piece is not None:
                    return {"type": "http.request", "body": piece, "more_body": True}
                if last:
                    decoder.finish()
                    done = True
                    return {"type": "http.request", "body": b"", "more_body": False}
                message = await receive()
                if message["type"] != "http.request":
                    return message
                pieces = decoder.pieces(message.get("body", b""))
                last = not message.get("more_body", False)
            return await receive()  # after the body: the disconnect, as the app expects

        await self.app(scope, decoded_receive, send)


class RequestContextMiddleware:
    """Per request: an id (the client's `X-Request-ID` if it is 1-128 printable characters, else a new
    one), echoed in the response and put on every log line of the request; the protocol label of the
    metrics; and, with `log_access`, one access line (method, path, status, duration)."""

    def __init__(self, app: ASGIApp, log_access: bool) -> None:
        self.app, self.log_access = app, log_access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid  # for the 500 handler, which runs outside this
        id_token = request_context.request_id.set(rid)
        protocol_token = request_context.protocol.set(request_context.protocol_of(scope["path"]))
        start, status = time.perf_counter(), 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            status = status or 500  # answered by the error handler outside this middleware
            raise
        except BaseException:
            status = status or 499  # cancelled: the client left, or the server stops
            raise
        finally:
            if self.log_access:
                access_log.info(
                    "%s %s %d",
                    scope["method"],
                    scope["path"],
                    status,
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round((time.perf_counter() - start) * 1000, 3),
                    },
                )
            request_context.protocol.reset(protocol_token)
            request_context.request_id.reset(id_token)


class CorsMiddleware(CORSMiddleware):
    """Starlette's CORS, with a refused preflight answered in the project's error shape (JSON, 400) that
    says what was refused and what is allowed (Starlette answers plain text)."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        refused = response.body.decode().removeprefix("Disallowed CORS ")
        allowed = "any origin" if self.allow_all_origins else ", ".join(sorted(self.allow_origins))
        message = (
            f"CORS preflight refused ({refused}) for origin {request_headers.get('origin', '')[:100]!r}, "
            f"method {request_headers.get('access-control-request-method', '')[:20]!r}; allowed origins: {allowed}; "
            f"methods: {', '.join(sorted(self.allow_methods))}; headers: {', '.join(sorted(self.allow_headers))}"
        )
        keep = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
        return JSONResponse({"error": message}, status_code=400, headers=keep)
