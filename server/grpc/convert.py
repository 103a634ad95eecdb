"""KServe v2 gRPC messages <-> the tensors and answers of the HTTP path (lara_serve.server.routes.v2).

Only the wire differs: a ModelInferRequest becomes the same DecodedRequest a JSON or binary HTTP body
does, and the same answer becomes a ModelInferResponse with every output in raw_output_contents.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from lara_serve.server.errors import invalid
from lara_serve.server.routes.v2 import InferAnswer
from lara_serve.server.schemas import V2InferRequest
from lara_serve.server.v2_codec import (
    NUMERIC_DTYPES,
    DecodedRequest,
    Tensor,
    tensor_bytes,
    tensor_from_bytes,
    tensor_from_values,
)

# The typed `contents` field that carries each datatype (the v2 gRPC definition's table).
_CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip
_DATATYPES = sorted([*NUMERIC_DTYPES, "BYTES"])
# Fixed-width typed contents are packed little-endian on the wire, the raw layout: read as bytes, a million
# values cost a copy instead of a million Python floats (seconds of the GIL for a 15 MB message).
_FIXED_WIDTH = {"FP32": "fp32_contents", "FP64": "fp64_contents"}
_FIXED_MIN_VALUES = 1024  # below this the list is as fast and needs no wire reading


def parameter_value(p: pb.InferParameter | pb.ModelRepositoryParameter) -> Any:
    """One parameter as the JSON value HTTP would carry (bool, int, str, float or bytes)."""
    choice = p.WhichOneof("parameter_choice")
    return None if choice is None else getattr(p, choice)


def set_parameter(p: pb.InferParameter, key: str, value: Any) -> None:
    """A v2 parameter is a scalar: bool, int or str get their typed field (never a string of JSON)."""
    if isinstance(value, bool):  # before int: a bool is an int in Python
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, str):
        p.string_param = value
    else:
        raise TypeError(f"response parameter {key!r} must be a bool, int or str (v2 parameters are scalars)")


def parameters(params: Any) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in params.items()}


def decoded_request(request: pb.ModelInferRequest) -> DecodedRequest:
    """The HTTP path's DecodedRequest: inputs from raw_input_contents (all of them) or typed contents."""
    if not request.inputs:
        raise invalid("the request has no inputs")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise invalid(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; give one per input")
    specs, tensors = [], []
    for index, tensor in enumerate(request.inputs):
        name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
        if datatype not in _CONTENTS and datatype not in NUMERIC_DTYPES:
            raise invalid(f"input {name!r}: datatype {datatype!r} is not supported; use one of {_DATATYPES}")
        if raw:
            array = tensor_from_bytes(name, datatype, shape, raw[index])
        elif (packed := _packed_contents(tensor.contents, datatype)) is not None:
            array = tensor_from_bytes(name, datatype, shape, packed)
        elif datatype in _CONTENTS:
            array = tensor_from_values(name, datatype, shape, list(getattr(tensor.contents, _CONTENTS[datatype])))
        else:  # FP16 has no typed contents field
            raise invalid(f"input {name!r}: {datatype} data must come in raw_input_contents")
        tensors.append(Tensor(name, datatype, array))
        specs.append({"name": name, "datatype": datatype, "shape": shape, "parameters": parameters(tensor.parameters)})
    outputs = [{"name": o.name, "parameters": parameters(o.parameters)} for o in request.outputs] or None
    body = {"id": request.id or None, "parameters": parameters(request.parameters), "inputs": specs, "outputs": outputs}
    return DecodedRequest(V2InferRequest.model_validate(body), tensors)


def _packed_contents(contents: pb.InferTensorContents, datatype: str) -> bytes | None:
    """The raw bytes of a large FP32/FP64 typed contents (packed: one length-delimited field), or None to
    convert value by value (small, another type, or any other field set: those keep their checks)."""
    field = _FIXED_WIDTH.get(datatype)
    if field is None or len(getattr(contents, field)) < _FIXED_MIN_VALUES:
        return None
    wire = contents.SerializeToString()
    number = pb.InferTensorContents.DESCRIPTOR.fields_by_name[field].number
    tag, at = _varint(wire, 0)
    length, at = _varint(wire, at)
    if tag != (number << 3 | 2) or at + length != len(wire):
        return None
    return wire[at:]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def infer_response(answer: InferAnswer, selected: list[tuple[str, str, np.ndarray, bool]]) -> pb.ModelInferResponse:
    header = answer.header
    response = pb.ModelInferResponse(
        model_name=header["model_name"], model_version=header["model_version"], id=header.get("id", "")
    )
    for key, value in header.get("parameters", {}).items():  # truncated (bool), truncated_count (int)
        set_parameter(response.parameters[key], key, value)
    for name, datatype, array, _ in selected:
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        response.raw_output_contents.append(tensor_bytes(datatype, array))
    return response


def metadata_response(metadata: dict[str, Any]) -> pb.ModelMetadataResponse:
    """v2 model metadata (JSON) -> the gRPC message, which has no parameters: the preprocessing numbers are
    in ModelConfig's parameters."""
    tensors = ("inputs", "outputs")
    return json_format.ParseDict(
        {k: v for k, v in metadata.items() if k in ("name", "versions", "platform", *tensors)},
        pb.ModelMetadataResponse(),
    )


def from_json(document: dict[str, Any], message: Any) -> Any:
    """Triton's JSON shapes (model config, statistics) are the proto messages' JSON forms."""
    return json_format.ParseDict(document, message, ignore_unknown_fields=True)
