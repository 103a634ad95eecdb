"""The `grpc` route: KServe v2 gRPC (Triton's GRPCInferenceService ModelInfer), timed like the HTTP routes.

The request is a `ModelInferRequest` built with tritonclient.grpc's generated messages and serialized before
the clock starts, as the HTTP bodies are; it goes over a grpc.aio channel as bytes and the answer is read as
bytes (an HTTP route does not parse its JSON either). The server's timing comes back as trailing metadata
under the HTTP headers' names. tritonclient.grpc.aio's own client is not used for the timed calls: it
parses every answer and does not expose trailing metadata. grpcio and tritonclient come with the `grpc`
extra and are imported only when the route is asked for, so the lean install runs the HTTP routes.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import Any

from lara_serve.clients.loadtest.inputs import Payload
from lara_serve.clients.loadtest.protocol import PreparedRequest
from lara_serve.clients.loadtest.runner import Sample, server_values

METHOD = "/inference.GRPCInferenceService/ModelInfer"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # the client's own cap; the server's (--grpc-max-message-bytes) is what counts
INSTALL_HINT = "route 'grpc' needs grpcio and tritonclient: pip install 'lara-serve[grpc]' (or -e '.[grpc]')"


def unavailable_reason() -> str | None:
    """Why the grpc route cannot run in this environment, or None."""
    try:
        import grpc  # noqa: F401
        from tritonclient.grpc import service_pb2  # noqa: F401
    except ImportError as exc:
        return f"{INSTALL_HINT} ({exc})"
    return None


def prepare_grpc(model: str, payload: Payload, truncate: bool) -> PreparedRequest:
    """One `raw` BYTES tensor of one element (4-byte little-endian length + bytes), as v2-binary sends it."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="raw", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(struct.pack("<I", len(payload.data)) + payload.data)
    request.parameters["truncate"].bool_param = truncate
    return PreparedRequest(METHOD, request.SerializeToString())


class GrpcClient:
    """One channel to one server's gRPC port; `send` is the runner's Sender for the grpc route."""

    def __init__(self, target: str, api_key: str | None, timeout_s: float) -> None:
        import grpc

        self._grpc: Any = grpc
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]  # fmt: skip
        self._channel = grpc.aio.insecure_channel(target, options=options)
        # No serializers: the prepared bytes go out as they are and the answer stays bytes.
        self._infer = self._channel.unary_unary(METHOD)
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._timeout_s = timeout_s

    async def send(self, request: PreparedRequest, start: float, scheduled: float) -> Sample:
        sent = time.perf_counter() - start
        try:
            call = self._infer(request.content, metadata=self._metadata, timeout=self._timeout_s)
            await call
            status, server = "OK", server_values(dict(await call.trailing_metadata() or ()))
        except self._grpc.aio.AioRpcError as exc:
            status, server = exc.code().name, {}
        return Sample(scheduled, sent, time.perf_counter() - start, status, server)

    async def warm_up(self, requests: Sequence[PreparedRequest], n: int) -> str | None:
        """As the HTTP warm-up: an input the server refuses as too large (RESOURCE_EXHAUSTED) skips its cells."""
        for request in (requests[i % len(requests)] for i in range(n)):
            try:
                await self._infer(request.content, metadata=self._metadata, timeout=self._timeout_s)
            except self._grpc.aio.AioRpcError as exc:
                if exc.code() == self._grpc.StatusCode.RESOURCE_EXHAUSTED:
                    return f"server answered RESOURCE_EXHAUSTED: {exc.details()}"
                return None  # the cells will count it
        return None

    async def aclose(self) -> None:
        await self._channel.close()
