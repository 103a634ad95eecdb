"""gRPC message decoding without a server: a ModelInferRequest becomes the HTTP path's DecodedRequest (typed
or raw contents, per-input raw entries, parameters), bad messages name what is wrong, and answers become
ModelInferResponses whose raw outputs are the binary layout written out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.grpc.convert import (
    decoded_request,
    from_json,
    infer_response,
    metadata_response,
    parameter_value,
    parameters,
)
from lara_serve.server.routes.v2 import InferAnswer


def _refused(request: pb.ModelInferRequest) -> str:
    with pytest.raises(ServeError) as err:
        decoded_request(request)
    assert err.value.kind is ErrorKind.INVALID_INPUT
    return err.value.message


def test_parameters_carry_their_json_values() -> None:
    assert parameter_value(pb.InferParameter(bool_param=False)) is False
    assert parameter_value(pb.InferParameter(int64_param=-5)) == -5
    assert parameter_value(pb.InferParameter(string_param="head")) == "head"
    assert parameter_value(pb.InferParameter()) is None  # nothing set
    request = pb.ModelInferRequest()
    request.parameters["truncate"].string_param = "tail"
    request.parameters["binary_data_output"].bool_param = True
    assert parameters(request.parameters) == {"truncate": "tail", "binary_data_output": True}


def test_typed_contents_decode_per_datatype() -> None:
    request = pb.ModelInferRequest(id="r1")
    ids = request.inputs.add(name="input_ids", datatype="INT64", shape=[1, 3])
    ids.contents.int64_contents.extend([5, 6, 7])
    ids.parameters["note"].string_param = "x"
    raw = request.inputs.add(name="raw", datatype="BYTES", shape=[2])
    raw.contents.bytes_contents.extend([b"ab", b""])
    request.outputs.add(name="scores")
    request.parameters["truncate"].bool_param = True
    decoded = decoded_request(request)
    (t_ids, t_raw) = decoded.tensors
    assert (t_ids.name, t_ids.datatype, t_ids.array.dtype) == ("input_ids", "INT64", np.int64)
    assert t_ids.array.tolist() == [[5, 6, 7]]
    assert (t_raw.name, t_raw.datatype) == ("raw", "BYTES") and t_raw.array.tolist() == [b"ab", b""]
    body = decoded.request
    assert body.id == "r1" and body.parameters == {"truncate": True}
    assert [(i.name, i.datatype, i.shape, i.parameters) for i in body.inputs] == [
        ("input_ids", "INT64", [1, 3], {"note": "x"}),
        ("raw", "BYTES", [2], {}),
    ]
    assert body.outputs is not None and [o.name for o in body.outputs] == ["scores"]
    bare = pb.ModelInferRequest()
    bare.inputs.add(name="raw", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"z")
    assert decoded_request(bare).request.id is None and decoded_request(bare).request.outputs is None


def test_raw_contents_are_one_entry_per_input_in_order() -> None:
    request = pb.ModelInferRequest()
    request.inputs.add(name="a", datatype="FP32", shape=[2])
    request.inputs.add(name="b", datatype="FP16", shape=[1, 1])  # FP16 has no typed field: raw only
    request.raw_input_contents.append(b"\x00\x00\xc0\x3f" + b"\x00\x00\x00\xc0")  # 1.5, -2.0 little-endian
    request.raw_input_contents.append(b"\x00\x3c")  # 1.0 as IEEE half, little-endian
    a, b = decoded_request(request).tensors
    assert a.array.tolist() == [1.5, -2.0] and a.array.dtype == np.float32
    assert b.array.tolist() == [[1.0]] and b.array.dtype == np.float16


def test_bad_requests_say_what_is_wrong() -> None:
    assert _refused(pb.ModelInferRequest()) == "the request has no inputs"
    two = pb.ModelInferRequest()
    two.inputs.add(name="a", datatype="INT64", shape=[1])
    two.inputs.add(name="b", datatype="INT64", shape=[1])
    two.raw_input_contents.append(b"\x01" + b"\x00" * 7)
    assert "raw_input_contents has 1 entries for 2 inputs; give one per input" in _refused(two)
    odd = pb.ModelInferRequest()
    odd.inputs.add(name="x", datatype="COMPLEX64", shape=[1])
    message = _refused(odd)
    assert "input 'x': datatype 'COMPLEX64' is not supported; use one of" in message and "'BYTES'" in message
    half = pb.ModelInferRequest()
    half.inputs.add(name="h", datatype="FP16", shape=[1])
    assert _refused(half) == "input 'h': FP16 data must come in raw_input_contents"
    short = pb.ModelInferRequest()
    short.inputs.add(name="ids", datatype="INT64", shape=[1, 2]).contents.int64_contents.append(3)
    assert "input 'ids'" in _refused(short)  # 1 value for 2 elements


def test_answers_become_responses_with_the_binary_layout() -> None:
    params = {"truncated": True, "truncated_count": 1, "note": "x"}
    header = {"model_name": "m", "model_version": "1", "id": "r7", "parameters": params}
    answer = InferAnswer(header=header, outputs={}, results=[])
    scores = np.array([[0.5, 2.0]], dtype=np.float32)
    labels = np.array([b"ab", b"c"], dtype=object)
    response = infer_response(answer, [("scores", "FP32", scores, True), ("labels", "BYTES", labels, True)])
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "r7")
    typed = {k: (p.WhichOneof("parameter_choice"), parameter_value(p)) for k, p in response.parameters.items()}
    assert typed == {  # v2 parameters are scalars, each in its typed field (kserve reads bool/int64/string)
        "truncated": ("bool_param", True),
        "truncated_count": ("int64_param", 1),
        "note": ("string_param", "x"),
    }
    with pytest.raises(TypeError, match="scalars"):  # a list would be a stringified list again: refused
        infer_response(InferAnswer(header={**header, "parameters": {"truncated": [True]}}, outputs={}, results=[]), [])
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("scores", "FP32", [1, 2]),
        ("labels", "BYTES", [2]),
    ]
    assert response.raw_output_contents[0] == b"\x00\x00\x00\x3f" + b"\x00\x00\x00\x40"  # 0.5, 2.0
    assert response.raw_output_contents[1] == b"\x02\x00\x00\x00ab" + b"\x01\x00\x00\x00c"  # length-prefixed
    no_id = infer_response(InferAnswer(header={"model_name": "m", "model_version": "1"}, outputs={}, results=[]), [])
    assert no_id.id == "" and not no_id.parameters and not no_id.outputs


def test_metadata_keeps_the_fields_the_message_has() -> None:
    metadata = {
        "name": "m",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "raw", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1, 5]}],
        "parameters": {"mean": 0.5},  # not a field of ModelMetadataResponse: left out, not an error
    }
    message = metadata_response(metadata)
    assert (message.name, list(message.versions), message.platform) == ("m", ["1"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in message.outputs] == [("scores", "FP32", [-1, 5])]


def test_triton_json_documents_parse_leniently() -> None:
    config = from_json({"name": "m", "max_batch_size": 8, "added_later": {"x": 1}}, pb.ModelConfigResponse().config)
    assert (config.name, config.max_batch_size) == ("m", 8)  # a field this proto lacks is skipped, not an error
