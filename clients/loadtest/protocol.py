"""Request bodies for each route, built once per payload before the clock starts.

Encoding a 64 KB document as JSON takes longer than some requests: doing it inside the timed loop would
measure the client. Every `PreparedRequest` is therefore ready to hand to httpx as it is.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from typing import Literal

from lara_serve.clients.loadtest.inputs import InputError, Payload

Route = Literal["predict", "classify", "v2-json", "v2-binary", "grpc"]
ROUTES: tuple[str, ...] = ("predict", "classify", "v2-json", "v2-binary", "grpc")
HEADER_LENGTH = "Inference-Header-Content-Length"  # v2 binary tensor data extension


@dataclass(frozen=True)
class PreparedRequest:
    path: str  # the URL path; for the grpc route the RPC method
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


def unsupported_reason(route: Route, kind: str) -> str | None:
    """Why a route cannot carry this kind of input, or None."""
    if route == "v2-json" and kind == "image":
        return "v2-json sends BYTES as JSON strings, which cannot hold image files; use v2-binary, predict or classify"
    return None


def prepare(route: Route, model: str, payload: Payload, truncate: bool) -> PreparedRequest:
    reason = unsupported_reason(route, payload.kind)
    if reason:
        raise InputError(reason)
    if route == "predict":
        instance: str | dict[str, str] = (
            payload.data.decode("utf-8") if payload.kind == "text" else {"b64": base64.b64encode(payload.data).decode()}
        )
        body = {"instances": [instance], "parameters": {"truncate": truncate}}
        return PreparedRequest(f"/v1/models/{model}:predict", json.dumps(body).encode(),
                               {"Content-Type": "application/json"})  # fmt: skip
    if route == "classify":
        params = {"truncate": "true"} if truncate else {}
        return PreparedRequest(f"/v1/models/{model}:classify", payload.data,
                               {"Content-Type": payload.content_type}, params)  # fmt: skip
    path = f"/v2/models/{model}/infer"
    spec = {"name": "raw", "datatype": "BYTES", "shape": [1]}
    params_v2 = {"truncate": truncate}
    if route == "v2-json":
        body = {"inputs": [{**spec, "data": [payload.data.decode("utf-8")]}], "parameters": params_v2}
        return PreparedRequest(path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    if route == "v2-binary":
        blob = struct.pack("<I", len(payload.data)) + payload.data  # BYTES element: 4-byte LE length + bytes
        head = json.dumps({"inputs": [{**spec, "parameters": {"binary_data_size": len(blob)}}],
                           "parameters": params_v2}).encode()  # fmt: skip
        return PreparedRequest(path, head + blob, {HEADER_LENGTH: str(len(head)),
                                                   "Content-Type": "application/octet-stream"})  # fmt: skip
    if route == "grpc":  # no HTTP request: sweep.prepare_any builds it with grpc_route (imports run one way)
        raise InputError("the grpc route's requests are built by grpc_route.prepare_grpc")
    raise InputError(f"unknown route {route!r}; choose from {list(ROUTES)}")
