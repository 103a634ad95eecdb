"""Open Inference Protocol tensors <-> numpy, including the binary tensor data extension.

Binary extension: the body is a JSON header of `Inference-Header-Content-Length` bytes followed by the
raw little-endian data of each input that has `parameters.binary_data_size`, in input order. BYTES
elements are a 4-byte little-endian length followed by the bytes.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from lara_serve.server.errors import invalid, malformed
from lara_serve.server.schemas import OFF_LOOP_BYTES, V2InferRequest, parse_body, run_parser

HEADER_LENGTH = "Inference-Header-Content-Length"
NUMERIC_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(t).newbyteorder("<")
    for name, t in {
        "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
        "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
        "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    }.items()
}  # fmt: skip
_ALLOWED = f"{sorted(NUMERIC_DTYPES)} or BYTES"


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    array: np.ndarray  # numeric dtype, or object array of bytes for BYTES


@dataclass(frozen=True)
class DecodedRequest:
    request: V2InferRequest
    tensors: list[Tensor]


def parse_header_length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise malformed(f"{HEADER_LENGTH} must be an integer, got {value!r}") from None
    if length < 0:
        raise malformed(f"{HEADER_LENGTH} must be >= 0")
    return length


def decode_request(body: bytes, header_length: int | None) -> DecodedRequest:
    if header_length is not None and header_length > len(body):
        raise malformed(f"{HEADER_LENGTH}={header_length} exceeds the body size {len(body)}")
    split = len(body) if header_length is None else header_length
    request = parse_body(V2InferRequest, body[:split], "body is not a valid v2 inference request (JSON header)")
    blob, offset, tensors = memoryview(body)[split:], 0, []
    for spec in request.inputs:
        size = spec.parameters.get("binary_data_size")
        if size is None:
            if spec.data is None:
                raise malformed(f"input {spec.name!r} has neither data nor parameters.binary_data_size")
            array = _from_json(spec.name, spec.datatype, spec.shape, spec.data)
        else:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(blob):
                raise malformed(
                    f"input {spec.name!r}: binary_data_size={size!r} does not fit the {len(blob)} binary bytes"
                )
            array = _from_binary(spec.name, spec.datatype, spec.shape, bytes(blob[offset : offset + size]))
            offset += size
        tensors.append(Tensor(spec.name, spec.datatype, array))
    if offset != len(blob):
        raise malformed(f"{len(blob) - offset} binary bytes after the last binary input")
    return DecodedRequest(request, tensors)


def tensor_from_bytes(name: str, datatype: str, shape: list[int], data: bytes) -> np.ndarray:
    """One tensor in the binary extension's layout (also gRPC's raw_input_contents, the same layout)."""
    return _from_binary(name, datatype, shape, data)


def tensor_from_values(name: str, datatype: str, shape: list[int], values: list[Any]) -> np.ndarray:
    """One tensor from a flat list of values (JSON `data`, or gRPC's typed contents)."""
    if datatype == "BYTES":
        count = _check_shape(name, shape)
        if len(values) != count:
            raise invalid(f"input {name!r}: shape {shape} needs {count} elements, data has {len(values)}")
        array = np.empty(count, dtype=object)
        array[:] = [bytes(v) for v in values]
        return array.reshape(shape)
    return _from_json(name, datatype, shape, values)


def tensor_bytes(datatype: str, array: np.ndarray) -> bytes:
    """A tensor in the binary extension's layout (gRPC's raw_output_contents too)."""
    return _binary_bytes(datatype, array)


# A dimension beyond this cannot be an array here (numpy refuses it even when another dimension is 0).
MAX_DIMENSION = 2**31 - 1


async def decode_request_off_loop(body: bytes, header_length: int | None) -> DecodedRequest:
    """`decode_request`, in the parser thread for bodies over OFF_LOOP_BYTES (a million JSON numbers take
    ~0.5 s to parse and check: the event loop must not wait for that)."""
    if len(body) > OFF_LOOP_BYTES:
        return await run_parser(decode_request, body, header_length)
    return decode_request(body, header_length)


def _check_shape(name: str, shape: list[int]) -> int:
    if any(d < 0 for d in shape):
        raise invalid(f"input {name!r}: shape {shape} has a negative dimension")
    if len(shape) > 32 or any(d > MAX_DIMENSION for d in shape):
        raise malformed(
            f"input {name!r}: shape {shape[:8]} is impossible: at most 32 dimensions of at most {MAX_DIMENSION}"
        )
    return math.prod(shape)


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:  # iterative, so deep nesting cannot exhaust the recursion limit
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(value)
        else:
            stack.pop()
    return flat


def _from_json(name: str, datatype: str, shape: list[int], data: Any) -> np.ndarray:
    count = _check_shape(name, shape)
    flat = _flatten(data)
    if len(flat) != count:
        raise invalid(f"input {name!r}: shape {shape} needs {count} elements, data has {len(flat)}")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise invalid(f"input {name!r}: BYTES data in JSON must be strings")
        array = np.empty(count, dtype=object)
        try:
            array[:] = [v.encode("utf-8") for v in flat]
        except UnicodeEncodeError:  # lone surrogates, which json.loads lets through
            raise invalid(f"input {name!r}: BYTES strings must be valid Unicode") from None
        return array.reshape(shape)
    dtype = NUMERIC_DTYPES.get(datatype)
    if dtype is None:
        raise invalid(f"input {name!r}: datatype {datatype!r} is not supported; use {_ALLOWED}")
    raw = np.asarray(flat) if flat else np.zeros(0, dtype=dtype)
    kinds = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}[dtype.kind]  # JSON ints are fine for floats
    if raw.dtype.kind not in kinds:
        raise invalid(f"input {name!r}: data of a {datatype} tensor must be {_KIND_WORD[dtype.kind]}")
    if dtype.kind in "iu" and raw.size:
        info = np.iinfo(dtype)
        if raw.min() < info.min or raw.max() > info.max:
            raise invalid(f"input {name!r}: values out of range for {datatype}")
    return raw.astype(dtype).reshape(shape)


_KIND_WORD = {"b": "booleans", "u": "integers", "i": "integers", "f": "numbers"}


def _from_binary(name: str, datatype: str, shape: list[int], data: bytes) -> np.ndarray:
    count = _check_shape(name, shape)
    if datatype == "BYTES":
        elements, pos = [], 0
        while pos < len(data):
            if pos + 4 > len(data):
                raise invalid(f"input {name!r}: truncated BYTES length prefix")
            (n,) = struct.unpack_from("<I", data, pos)
            if pos + 4 + n > len(data):
                raise invalid(f"input {name!r}: BYTES element of {n} bytes runs past the data")
            elements.append(data[pos + 4 : pos + 4 + n])
            pos += 4 + n
        if len(elements) != count:
            raise invalid(f"input {name!r}: shape {shape} needs {count} BYTES elements, got {len(elements)}")
        array = np.empty(count, dtype=object)
        array[:] = elements
        return array.reshape(shape)
    dtype = NUMERIC_DTYPES.get(datatype)
    if dtype is None:
        raise invalid(f"input {name!r}: datatype {datatype!r} is not supported; use {_ALLOWED}")
    if len(data) != count * dtype.itemsize:
        raise invalid(
            f"input {name!r}: shape {shape} of {datatype} needs {count * dtype.itemsize} bytes, got {len(data)}"
        )
    return np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("="), copy=True).reshape(shape)


# -- responses -----------------------------------------------------------------------------------------


def _binary_bytes(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in array.reshape(-1))
    return np.ascontiguousarray(array, dtype=NUMERIC_DTYPES[datatype]).tobytes()


def encode_response(
    header: dict[str, Any], outputs: list[tuple[str, str, np.ndarray, bool]]
) -> tuple[bytes, dict[str, str]]:
    """outputs: (name, datatype, array, binary). Returns (body, headers)."""
    entries, chunks = [], []
    for name, datatype, array, binary in outputs:
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            chunk = _binary_bytes(datatype, array)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        elif datatype == "BYTES":
            entry["data"] = [v.decode("utf-8") for v in array.reshape(-1)]
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    head = json.dumps({**header, "outputs": entries}, separators=(",", ":")).encode()
    if not chunks:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(chunks), {
        "Content-Type": "application/octet-stream",
        HEADER_LENGTH: str(len(head)),
    }
