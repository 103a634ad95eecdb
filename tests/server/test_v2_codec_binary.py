"""The binary tensor extension of the v2 codec: every way a body can disagree with its header is a named
4xx (never a 500, never silently "fixed"), and consistent bodies decode to exactly what was encoded. The
bodies are built here with struct and numpy, independently of the codec's own encoder."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.v2_codec import NUMERIC_DTYPES, decode_request, encode_response, parse_header_length


def body(*inputs: tuple[dict[str, Any], bytes | None]) -> tuple[bytes, int]:
    """(JSON header + binary chunks, header length); a chunk of None means a JSON `data` input."""
    specs = [spec for spec, _ in inputs]
    head = json.dumps({"inputs": specs}).encode()
    return head + b"".join(chunk for _, chunk in inputs if chunk is not None), len(head)


def binary(name: str, datatype: str, shape: list[int], chunk: bytes, size: Any = None) -> tuple[dict[str, Any], bytes]:
    size = len(chunk) if size is None else size
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}, chunk


def strings(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def refused(raw: bytes, header_length: int | None) -> ServeError:
    with pytest.raises(ServeError) as info:
        decode_request(raw, header_length)
    assert 400 <= info.value.status < 500
    return info.value


# -- consistent bodies decode exactly ------------------------------------------------------------------


def test_numeric_and_bytes_inputs_decode_in_order() -> None:
    ints = struct.pack("<4q", 1, -2, 2**40, -(2**62))
    floats = struct.pack("<3f", 0.5, -1.25, 3.0)
    raw, n = body(
        binary("a", "INT64", [2, 2], ints),
        ({"name": "j", "datatype": "INT32", "shape": [2], "data": [7, 8]}, None),
        binary("b", "FP32", [3], floats),
        binary("c", "BYTES", [3], strings(b"hi", b"", b"\x00\xff")),
        binary("d", "BOOL", [2], b"\x01\x00"),
    )
    decoded = decode_request(raw, n)
    a, j, b, c, d = (t.array for t in decoded.tensors)
    assert a.tolist() == [[1, -2], [2**40, -(2**62)]] and a.dtype == np.int64 and a.dtype.isnative
    assert j.tolist() == [7, 8] and j.dtype == np.int32
    assert b.tolist() == [0.5, -1.25, 3.0] and b.dtype == np.float32
    assert c.tolist() == [b"hi", b"", b"\x00\xff"] and c.shape == (3,)
    assert d.tolist() == [True, False]
    assert [t.name for t in decoded.tensors] == ["a", "j", "b", "c", "d"]


def test_an_empty_last_bytes_element_is_complete() -> None:
    # Its 4-byte prefix (of 0) ends the data exactly: nothing is truncated.
    raw, n = body(binary("c", "BYTES", [2], strings(b"x", b"")))
    assert decode_request(raw, n).tensors[0].array.tolist() == [b"x", b""]


def test_header_length_equal_to_the_body_means_no_binary_part() -> None:
    raw, _ = body(({"name": "j", "datatype": "INT64", "shape": [1], "data": [3]}, None))
    assert decode_request(raw, len(raw)).tensors[0].array.tolist() == [3]
    assert decode_request(raw, None).tensors[0].array.tolist() == [3]
    error = refused(raw, len(raw) + 1)
    assert error.kind is ErrorKind.MALFORMED and f"exceeds the body size {len(raw)}" in error.message


def test_empty_tensors_decode() -> None:
    raw, n = body(binary("e", "FP32", [0, 3], b""), binary("s", "BYTES", [0], b""))
    e, s = (t.array for t in decode_request(raw, n).tensors)
    assert e.shape == (0, 3) and s.shape == (0,)


# -- inconsistent bodies: each a named 4xx -------------------------------------------------------------


@pytest.mark.parametrize(
    ("chunk", "shape", "kind", "words"),
    [
        (strings(b"a")[:3], [1], ErrorKind.INVALID_INPUT, "truncated BYTES length prefix"),
        (strings(b"abc") + b"\x01\x00", [2], ErrorKind.INVALID_INPUT, "truncated BYTES length prefix"),
        (struct.pack("<I", 9) + b"ab", [1], ErrorKind.INVALID_INPUT, "element of 9 bytes runs past the data"),
        (strings(b"only one"), [2], ErrorKind.INVALID_INPUT, "shape [2] needs 2 BYTES elements, got 1"),
        (strings(b"x", b"y"), [1], ErrorKind.INVALID_INPUT, "shape [1] needs 1 BYTES elements, got 2"),
        (b"", [1], ErrorKind.INVALID_INPUT, "needs 1 BYTES elements, got 0"),
    ],
)
def test_bytes_elements_must_match_their_prefixes_and_the_shape(
    chunk: bytes, shape: list[int], kind: ErrorKind, words: str
) -> None:
    error = refused(*body(binary("raw", "BYTES", shape, chunk)))
    assert error.kind is kind and words in error.message and "'raw'" in error.message


@pytest.mark.parametrize(
    ("datatype", "shape", "chunk"),
    [("INT64", [1, 2], b"\x00" * 8), ("INT64", [1], b"\x00" * 9), ("FP16", [3], b"\x00" * 4), ("UINT8", [2], b"")],
)
def test_numeric_size_must_be_shape_times_item_size(datatype: str, shape: list[int], chunk: bytes) -> None:
    needed = int(np.prod(shape)) * NUMERIC_DTYPES[datatype].itemsize
    error = refused(*body(binary("x", datatype, shape, chunk)))
    assert error.kind is ErrorKind.INVALID_INPUT
    assert f"needs {needed} bytes, got {len(chunk)}" in error.message


@pytest.mark.parametrize("size", [True, False, -1, 8.0, "8", None, [8]])
def test_binary_data_size_must_be_a_non_negative_integer(size: Any) -> None:
    spec, chunk = binary("x", "INT64", [1], struct.pack("<q", 5), size=size)
    if size is None:
        spec["parameters"] = {"binary_data_size": None}  # JSON null: as if absent, and there is no data
    raw, n = body((spec, chunk))
    error = refused(raw, n)
    assert error.kind is ErrorKind.MALFORMED
    assert "binary_data_size" in error.message


def test_sizes_past_the_blob_and_bytes_left_over() -> None:
    chunk = struct.pack("<q", 5)
    error = refused(*body(binary("x", "INT64", [1], chunk, size=16)))
    assert error.kind is ErrorKind.MALFORMED and "binary_data_size=16 does not fit the 8 binary bytes" in error.message
    raw, n = body(binary("x", "INT64", [1], chunk))
    error = refused(raw + b"zz", n)
    assert error.kind is ErrorKind.MALFORMED and "2 binary bytes after the last binary input" in error.message


def test_negative_dimension_and_unknown_datatype() -> None:
    assert "negative dimension" in refused(*body(binary("x", "INT64", [-1], b""))).message
    error = refused(*body(binary("x", "BF16", [1], b"\x00\x00")))
    assert error.kind is ErrorKind.INVALID_INPUT and "'BF16' is not supported" in error.message


# -- JSON data: kinds and ranges -----------------------------------------------------------------------


def json_input(datatype: str, data: list[Any]) -> tuple[bytes, int]:
    return body(({"name": "v", "datatype": datatype, "shape": [len(data)], "data": data}, None))


@pytest.mark.parametrize(
    ("datatype", "data", "words"),
    [
        ("INT64", [1.5], "must be integers"),
        ("INT64", [1.0], "must be integers"),  # a float is refused even when whole: no silent truncation
        ("INT64", [True], "must be integers"),
        ("UINT8", [-1], "out of range for UINT8"),
        ("INT8", [128], "out of range for INT8"),
        ("BOOL", [1], "must be booleans"),
        ("FP32", ["1"], "must be numbers"),
        ("BYTES", [1], "must be strings"),
    ],
)
def test_json_values_of_the_wrong_kind_are_refused(datatype: str, data: list[Any], words: str) -> None:
    error = refused(*json_input(datatype, data))
    assert error.kind is ErrorKind.INVALID_INPUT and words in error.message


def test_json_values_at_the_edges_of_their_type_are_kept() -> None:
    cases = {"INT8": [-128, 127], "UINT8": [0, 255], "FP32": [1, 2.5], "BOOL": [True, False], "UINT64": [2**64 - 1]}
    for datatype, data in cases.items():
        array = decode_request(*json_input(datatype, data)).tensors[0].array
        assert array.tolist() == data and array.dtype == NUMERIC_DTYPES[datatype]


def test_empty_json_tensors_decode_with_their_dtype() -> None:
    for datatype in ("INT64", "FP32", "BYTES"):
        raw, n = body(({"name": "v", "datatype": datatype, "shape": [0, 2], "data": []}, None))
        array = decode_request(raw, n).tensors[0].array
        assert array.shape == (0, 2) and (datatype == "BYTES" or array.dtype == NUMERIC_DTYPES[datatype])


def test_nested_json_data_is_flattened_in_row_major_order() -> None:
    raw, n = body(({"name": "v", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3, 4]]}, None))
    assert decode_request(raw, n).tensors[0].array.tolist() == [[1, 2], [3, 4]]
    raw, n = body(({"name": "v", "datatype": "INT64", "shape": [2, 2], "data": [1, 2, 3]}, None))
    assert "shape [2, 2] needs 4 elements, data has 3" in refused(raw, n).message


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("0", 0), ("12", 12)])
def test_header_length_parsing(value: str | None, expected: int | None) -> None:
    assert parse_header_length(value) == expected


@pytest.mark.parametrize(("value", "words"), [("-1", "must be >= 0"), ("x", "must be an integer"), ("1.5", "integer")])
def test_header_length_parsing_refuses(value: str, words: str) -> None:
    with pytest.raises(ServeError, match=words) as info:
        parse_header_length(value)
    assert info.value.kind is ErrorKind.MALFORMED


# -- responses -----------------------------------------------------------------------------------------


def test_binary_response_layout() -> None:
    probs = np.array([[0.25, 0.75]], dtype=np.float32)
    labels = np.array([b"a", b"bc"], dtype=object)
    raw, headers = encode_response({"model_name": "m"}, [("p", "FP32", probs, True), ("l", "BYTES", labels, True)])
    n = int(headers["Inference-Header-Content-Length"])
    assert headers["Content-Type"] == "application/octet-stream"
    head = json.loads(raw[:n])
    assert head["model_name"] == "m"
    assert head["outputs"][0] == {
        "name": "p",
        "datatype": "FP32",
        "shape": [1, 2],
        "parameters": {"binary_data_size": 8},
    }
    assert head["outputs"][1]["parameters"] == {"binary_data_size": 11}
    assert raw[n:] == struct.pack("<2f", 0.25, 0.75) + struct.pack("<I", 1) + b"a" + struct.pack("<I", 2) + b"bc"


def test_json_response_has_no_binary_part() -> None:
    raw, headers = encode_response({}, [("l", "BYTES", np.array([b"x"], dtype=object), False),
                                        ("p", "FP64", np.array([0.5]), False)])  # fmt: skip
    assert headers == {"Content-Type": "application/json"}
    assert json.loads(raw)["outputs"] == [
        {"name": "l", "datatype": "BYTES", "shape": [1], "data": ["x"]},
        {"name": "p", "datatype": "FP64", "shape": [1], "data": [0.5]},
    ]


# -- fuzzing with bodies whose header and binary part agree --------------------------------------------

_DATATYPES = sorted(NUMERIC_DTYPES) + ["BYTES"]


@st.composite
def consistent_input(draw: st.DrawFn, index: int) -> tuple[dict[str, Any], bytes, np.ndarray]:
    datatype = draw(st.sampled_from(_DATATYPES))
    shape = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    count = int(np.prod(shape))
    if datatype == "BYTES":
        elements = draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
        chunk = strings(*elements)
        expected = np.empty(count, dtype=object)
        expected[:] = elements
    else:
        dtype = NUMERIC_DTYPES[datatype]
        chunk = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
        expected = np.frombuffer(chunk, dtype=dtype)
    spec = {"name": f"in{index}", "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": len(chunk)}}
    return spec, chunk, expected.reshape(shape)


_CORRUPTIONS = ["none", "drop_last_byte", "extra_byte", "size_plus_one", "size_minus_one", "shape_grows", "size_bool"]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n_inputs=st.integers(1, 3), corruption=st.sampled_from(_CORRUPTIONS))
def test_fuzzed_consistent_bodies_decode_or_get_a_named_4xx(
    data: st.DataObject, n_inputs: int, corruption: str
) -> None:
    inputs = [data.draw(consistent_input(i)) for i in range(n_inputs)]
    victim = data.draw(st.integers(0, n_inputs - 1))
    spec = inputs[victim][0]
    if corruption == "size_plus_one":
        spec["parameters"]["binary_data_size"] += 1
    elif corruption == "size_minus_one":
        spec["parameters"]["binary_data_size"] -= 1
    elif corruption == "shape_grows":
        spec["shape"] = [int(np.prod(spec["shape"])) + 1]  # one element more than the data holds
    elif corruption == "size_bool":
        spec["parameters"]["binary_data_size"] = True
    raw, n = body(*((s, c) for s, c, _ in inputs))
    raw = {"drop_last_byte": raw[:-1], "extra_byte": raw + b"\x00"}.get(corruption, raw)
    try:
        decoded = decode_request(raw, n)
    except ServeError as error:
        assert 400 <= error.status < 500 and error.kind in (ErrorKind.MALFORMED, ErrorKind.INVALID_INPUT)
        assert corruption != "none", error.message
        return
    assert corruption == "none", f"{corruption} of input {victim} decoded: {spec}"
    for tensor, (_, _, expected) in zip(decoded.tensors, inputs, strict=True):
        assert tensor.array.shape == expected.shape
        if expected.dtype == object:
            assert tensor.array.tolist() == expected.tolist()
        else:
            assert tensor.array.dtype == expected.dtype and tensor.array.tobytes() == expected.tobytes()
