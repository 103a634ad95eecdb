"""A cap on requests with large bodies in flight at once: the memory of a burst of large bodies is bounded.

A body over `threshold` bytes (declared by Content-Length, or counted while a chunked body streams) takes
a slot for the whole request: its bytes, the parsed JSON and the decoded text all live until the answer.
Without a slot it waits, its body unread (TCP holds the client back), up to `wait_s`; then 503 with
Retry-After. Small requests never wait, so health checks and short texts pass a burst of large ones.
When the last large request of a burst is done, free memory is handed back to the OS.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.preprocess import release_free_memory


class LargeBodyGate:
    def __init__(
        self,
        app: ASGIApp,
        slots: int,
        threshold: int,
        refused: Callable[[], None],
        respond: Callable[[ServeError], ASGIApp],
        wait_s: float,
    ) -> None:
        self.app, self.threshold, self.wait_s = app, threshold, wait_s
        self.slots = slots
        self._free = asyncio.Semaphore(slots)
        self._held = 0
        self._refused, self._respond = refused, respond

    async def _release(self) -> None:
        self._held -= 1
        self._free.release()
        if self._held == 0:  # the burst is over: give its buffers back (a C call that releases the GIL)
            await asyncio.to_thread(release_free_memory)

    async def _acquire(self) -> None:
        try:
            await asyncio.wait_for(self._free.acquire(), timeout=self.wait_s)
            self._held += 1
        except TimeoutError:
            self._refused()
            raise ServeError(
                ErrorKind.NOT_READY,
                f"{self.slots} requests with bodies over {self.threshold} bytes are being handled "
                f"(max_large_bodies); retry",
                retry_after_s=random.randint(1, 3),
            ) from None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.threshold:
            try:
                await self._acquire()
            except ServeError as exc:
                return await self._respond(exc)(scope, receive, send)
            try:
                return await self.app(scope, receive, send)
            finally:
                await self._release()
        held, seen = False, 0

        async def counted_receive() -> Message:  # chunked: take a slot once the body grows large
            nonlocal held, seen
            message = await receive()
            if message["type"] == "http.request" and not held:
                seen += len(message.get("body", b""))
                if seen > self.threshold:
                    await self._acquire()  # a ServeError here surfaces in the route's body read
                    held = True
            return message

        try:
            await self.app(scope, counted_receive, send)
        finally:
            if held:
                await self._release()
