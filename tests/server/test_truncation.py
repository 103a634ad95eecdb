"""Long texts: the 413 that names the limit and the options, the three truncation sides on every route, the
`truncated` flag in responses, and max_length in the model metadata."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
from server_helpers import MAX_LENGTH, TEXT

from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.preprocess import TRUNCATION_SIDES, cut, truncation_side

pytestmark = pytest.mark.anyio
LONG = bytes(range(32, 127)) * 5  # 475 bytes > MAX_LENGTH, every byte value distinct within a period
TEXT_HEADERS = {"content-type": "text/plain"}


def test_cut_keeps_the_named_part() -> None:
    seq = np.arange(10)
    assert cut(seq, 4, "head").tolist() == [0, 1, 2, 3]
    assert cut(seq, 4, "tail").tolist() == [6, 7, 8, 9]
    assert cut(seq, 5, "head+tail").tolist() == [0, 1, 2, 8, 9]  # odd limit: the extra byte goes to the head
    assert cut(seq, 4, "head+tail").tolist() == [0, 1, 8, 9]
    assert cut(seq, 1, "head+tail").tolist() == [0] and cut(seq, 1, "tail").tolist() == [9]
    for side in TRUNCATION_SIDES:
        assert cut(seq, 10, side) is seq and len(cut(seq, 3, side)) == 3


@pytest.mark.parametrize(
    ("value", "side"),
    [
        (False, None),
        (None, None),
        (True, "head"),
        ("true", "head"),
        ("0", None),
        ("tail", "tail"),
        ("HEAD+TAIL", "head+tail"),
    ],  # fmt: skip
)
def test_truncation_side_parsing(value: object, side: str | None) -> None:
    assert truncation_side(value) == side


@pytest.mark.parametrize("bad", ["middle", 1, 2.5, ["head"]])
def test_truncation_side_refuses_unknown_values(bad: object) -> None:
    with pytest.raises(ServeError, match="head, tail|head', 'tail") as info:
        truncation_side(bad)
    assert info.value.kind is ErrorKind.MALFORMED and repr(bad) in info.value.message


async def _probs_classify(client: httpx.AsyncClient, body: bytes, truncate: str | None = None) -> dict:
    query = f"?truncate={truncate}&top_k=100" if truncate else "?top_k=100"
    r = await client.post(f"/v1/models/{TEXT}:classify{query}", content=body, headers=TEXT_HEADERS)
    assert r.status_code == 200, r.text
    return r.json()


async def test_413_names_the_limit_and_the_sides(client: httpx.AsyncClient) -> None:
    routes = [
        client.post(f"/v1/models/{TEXT}:classify", content=LONG, headers=TEXT_HEADERS),
        client.post(f"/v1/models/{TEXT}:predict", json={"instances": [LONG.decode()]}),
        client.post(
            f"/v2/models/{TEXT}/infer",
            json={"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": [LONG.decode()]}]},
        ),
    ]
    for request in routes:
        r = await request
        assert r.status_code == 413, r.text
        msg = r.json()["error"]
        assert str(MAX_LENGTH) in msg and str(len(LONG)) in msg
        assert all(side in msg for side in TRUNCATION_SIDES) and "--truncate" in msg


# What each side keeps, written out by hand (MAX_LENGTH is even: head+tail keeps half of each end).
KEPT = {
    "head": LONG[:MAX_LENGTH],
    "tail": LONG[len(LONG) - MAX_LENGTH :],
    "head+tail": LONG[: MAX_LENGTH // 2] + LONG[len(LONG) - MAX_LENGTH // 2 :],
}


@pytest.mark.parametrize("side", TRUNCATION_SIDES)
async def test_each_side_equals_sending_the_kept_bytes(client: httpx.AsyncClient, side: str) -> None:
    kept = KEPT[side]
    assert len(kept) == MAX_LENGTH and MAX_LENGTH % 2 == 0
    cut_by_server = await _probs_classify(client, LONG, side)
    sent_cut = await _probs_classify(client, kept)
    assert cut_by_server["truncated"] is True and sent_cut["truncated"] is False
    assert cut_by_server["top_k"] == sent_cut["top_k"]  # same scores: the server kept exactly those bytes


async def test_sides_differ_on_a_text_whose_ends_differ(client: httpx.AsyncClient) -> None:
    text = b"a" * 300 + b"z" * 300
    scores = {side: (await _probs_classify(client, text, side))["top_k"] for side in TRUNCATION_SIDES}
    assert scores["head"] != scores["tail"]


async def test_predict_and_v2_report_truncation_per_item(client: httpx.AsyncClient) -> None:
    short = "short text"
    r = await client.post(
        f"/v1/models/{TEXT}:predict", json={"instances": [short, LONG.decode()], "parameters": {"truncate": "tail"}}
    )
    assert r.status_code == 200 and [p["truncated"] for p in r.json()["predictions"]] == [False, True]
    # The query parameter works on :predict too (the body's parameters win when both are given).
    q = await client.post(f"/v1/models/{TEXT}:predict?truncate=head", json={"instances": [LONG.decode()]})
    assert q.status_code == 200 and q.json()["predictions"][0]["truncated"] is True

    inputs = [{"name": "raw", "datatype": "BYTES", "shape": [2], "data": [short, LONG.decode()]}]
    outputs = [{"name": "label"}, {"name": "truncated"}]  # the per-item flags are an output on request
    body = {"inputs": inputs, "parameters": {"truncate": True}, "outputs": outputs}
    v2 = await client.post(f"/v2/models/{TEXT}/infer", json=body)
    assert v2.status_code == 200, v2.text
    assert v2.json()["parameters"] == {"truncated": True, "truncated_count": 1}  # v2 parameters are scalars
    (flags,) = [o for o in v2.json()["outputs"] if o["name"] == "truncated"]
    assert (flags["datatype"], flags["shape"], flags["data"]) == ("BOOL", [2], [False, True])
    b64 = base64.b64encode(LONG).decode()
    b = await client.post(
        f"/v1/models/{TEXT}:predict", json={"instances": [{"b64": b64}], "parameters": {"truncate": "head+tail"}}
    )
    assert b.status_code == 200 and b.json()["predictions"][0]["truncated"] is True


async def test_tensor_rows_are_cut_after_their_padding(client: httpx.AsyncClient) -> None:
    """A pre-tokenized row longer than max_length is cut on its real tokens, not on the padded width."""
    ids = [list(range(1, 201)) * 2, [5, 6, 7] + [0] * 397]  # 400 real ids, and 3 real ids padded to 400
    mask = [[1] * 400, [1, 1, 1] + [0] * 397]
    inputs = [
        {"name": "input_ids", "datatype": "INT64", "shape": [2, 400], "data": ids},
        {"name": "attention_mask", "datatype": "INT64", "shape": [2, 400], "data": mask},
    ]
    refused = await client.post(f"/v2/models/{TEXT}/infer", json={"inputs": inputs})
    assert refused.status_code == 413 and "400" in refused.json()["error"]
    ok = await client.post(f"/v2/models/{TEXT}/infer", json={"inputs": inputs, "parameters": {"truncate": "tail"}})
    assert ok.status_code == 200 and ok.json()["parameters"] == {"truncated": True, "truncated_count": 1}


async def test_metadata_shows_max_length(client: httpx.AsyncClient) -> None:
    v1 = (await client.get(f"/v1/models/{TEXT}")).json()
    v2 = (await client.get(f"/v2/models/{TEXT}")).json()
    for params in (v1, v2["parameters"]):
        assert params["max_length"] == MAX_LENGTH and params["truncation_sides"] == ["head", "tail", "head+tail"]
    assert v2["name"] == TEXT
