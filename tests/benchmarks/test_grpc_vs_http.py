"""benchmarks.grpc_vs_http's pure parts: the tables and targets from cells, the tensors both servers get,
the Triton peer's batch assembly; a live peer only where its venv exists (never needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import pytriton_peer
from benchmarks.grpc_vs_http_report import chart, markdown, paired, ratios, summarize


def cell(payload: str, server: str, input_: str, protocol: str, p50: float, rps: float, round_: int = 0) -> dict:
    return {"payload": payload, "server": server, "input": input_, "protocol": protocol, "round": round_,
            "p50_ms": p50, "p99_ms": 2 * p50, "requests_per_s": rps}  # fmt: skip


def test_summarize_takes_the_median_latency_and_mean_throughput_over_rounds() -> None:
    cells = [
        cell("text_1k", "lara", "tensors", "grpc", 10.0, 100.0, 0),
        cell("text_1k", "lara", "tensors", "grpc", 30.0, 50.0, 1),
        cell("text_1k", "lara", "tensors", "grpc", 12.0, 60.0, 2),
        cell("text_1k", "triton", "tensors", "grpc", 20.0, 40.0, 0),
    ]
    rows = summarize(cells, {"text_1k": 4.0})
    assert [(r["server"], r["rounds"]) for r in rows] == [("lara", 3), ("triton", 1)]
    assert rows[0]["p50_ms"] == 12.0 and rows[0]["p99_ms"] == 24.0 and rows[0]["p50_ms_range"] == [10.0, 30.0]
    assert rows[0]["requests_per_s"] == pytest.approx(70.0)
    assert rows[0]["overhead_ms"] == 8.0 and rows[1]["overhead_ms"] == 16.0
    assert summarize(cells)[0]["overhead_ms"] is None  # no compute time measured: no overhead claimed


def full(payload: str, lara_grpc: float, lara_http: float, triton_grpc: float, raw_grpc: float = 1.0) -> list[dict]:
    return [
        cell(payload, "lara", "tensors", "http", lara_http, 10.0),
        cell(payload, "lara", "tensors", "grpc", lara_grpc, 20.0),
        cell(payload, "triton", "tensors", "http", 50.0, 10.0),
        cell(payload, "triton", "tensors", "grpc", triton_grpc, 25.0),
        cell(payload, "lara", "raw", "http", 2.0, 10.0),
        cell(payload, "lara", "raw", "grpc", raw_grpc, 10.0),
    ]


def test_ratios_and_targets_per_payload() -> None:
    rows = summarize(full("a", 10.0, 20.0, 10.4) + full("b", 10.0, 20.0, 9.0) + full("c", 10.0, 20.0, 20.0, 3.0))
    got = ratios(rows)
    assert got["a"]["lara_grpc_over_http_p50"] == 0.5
    assert got["a"]["lara_over_triton_grpc_p50"] == pytest.approx(10.0 / 10.4)
    assert got["a"]["lara_over_triton_grpc_throughput"] == pytest.approx(20.0 / 25.0)
    assert got["a"]["triton_grpc_over_http_p50"] == pytest.approx(10.4 / 50.0)
    assert got["a"]["target_grpc_below_http"] is True and got["a"]["target_level_with_triton"] is True
    assert got["b"]["target_level_with_triton"] is False  # 10 ms against Triton's 9: 11% slower
    assert got["c"]["target_grpc_below_http"] is False  # raw bytes: gRPC 3 ms against HTTP's 2


def test_cpu_per_request_is_the_median_over_rounds_and_compared_with_triton() -> None:
    cells = full("a", 10.0, 20.0, 10.0)
    for c, cpu in zip(cells, (4.0, 6.0, 9.0, 12.0, 5.0, 5.0), strict=True):
        c["cpu_ms_per_request"] = cpu
    extra = dict(cells[1], round=1, cpu_ms_per_request=8.0)  # LARA gRPC, a second round
    rows = summarize([*cells, extra, dict(extra, round=2, cpu_ms_per_request=7.0)])
    lara_grpc = next(r for r in rows if (r["server"], r["input"], r["protocol"]) == ("lara", "tensors", "grpc"))
    assert lara_grpc["cpu_ms_per_request"] == 7.0  # median of 6, 8, 7
    assert ratios(rows)["a"]["lara_over_triton_grpc_cpu"] == pytest.approx(7.0 / 12.0)
    assert "| 25.0 | 12.0 |" in markdown(rows)
    assert ratios(summarize(full("a", 10.0, 20.0, 10.0)))["a"]["lara_over_triton_grpc_cpu"] is None  # old files


def test_paired_ratios_are_per_round_then_the_median() -> None:
    cells = full("a", 10.0, 20.0, 20.0) + [dict(c, round=1) for c in full("a", 30.0, 20.0, 10.0)]
    cells += [dict(c, round=2) for c in full("a", 9.0, 20.0, 10.0)]
    got = paired(cells)["a"]["lara_over_triton_grpc_p50_per_round"]
    assert got["rounds"] == [0.5, 3.0, 0.9] and got["median"] == 0.9
    assert paired([c for c in cells if c["server"] == "lara"]) == {}  # no Triton: nothing to pair


def test_session_cpu_counts_this_process_group_only() -> None:
    """The CPU accounting the cells use: a session's processes, growing with work done; unknown session 0."""
    import os
    import time

    from benchmarks.grpc_vs_http import session_cpu_ms

    mine = os.getsid(0)
    before = session_cpu_ms(mine)
    assert before is not None and before >= 0
    end = time.process_time() + 0.05
    while time.process_time() < end:  # 50 ms of CPU in this session
        pass
    after = session_cpu_ms(mine)
    assert after is not None and after - before >= 30  # clock ticks are 10 ms
    assert session_cpu_ms(2**22 + 12345) == 0  # beyond pid_max: no process


def test_the_benchmarked_server_leads_its_own_session(tmp_path: Path) -> None:
    """The old set-up put LARA Serve in the driver's session (one autogroup CPU share with whatever ran
    there) and Triton in its own: 5.6x apart under the same load (docs/performance.md). Both now lead their own,
    and the CPU accounting finds the server by it."""
    import os

    from benchmarks.grpc_vs_http import _child_session, session_cpu_ms
    from lara_serve.server.synthetic import make_image_model
    from lara_serve.server.testing import free_port, server_process

    make_image_model(tmp_path, "img")
    env = {"LARA_MODEL_REPOSITORY": str(tmp_path), "LARA_NUM_THREADS": "1", "LARA_WARMUP": "false"}
    grpc_port = free_port()
    with server_process(["--log-level", "warning", "--grpc-port", str(grpc_port)], env=env, new_session=True):
        session = _child_session(str(grpc_port))
        assert session > 0 and os.getsid(session) == session != os.getsid(0)
        cpu = session_cpu_ms(session)
        assert cpu is not None and cpu > 0  # it imported and loaded a model: not an empty session
    with server_process(["--log-level", "warning", "--grpc-port", str(grpc_port)], env=env):
        assert _child_session(str(grpc_port)) == 0  # the default: the caller's session, as tests want


def test_ratios_without_triton_say_nothing_about_triton() -> None:
    rows = summarize([c for c in full("a", 10.0, 20.0, 10.0) if c["server"] == "lara"])
    got = ratios(rows)["a"]
    assert got["lara_over_triton_grpc_p50"] is None and got["target_level_with_triton"] is None
    assert got["target_grpc_below_http"] is True


def test_markdown_and_chart(tmp_path: Path) -> None:
    rows = summarize(full("text_1k", 10.0, 20.0, 10.4), {"text_1k": 1.0})
    table = markdown(rows)
    assert table.count("\n") == len(rows) + 1
    assert "| text_1k | Triton (pytriton), tensors | grpc | 10.4 | 10.4-10.4 | 20.8 | 9.4 | 25.0 | n/a |" in table
    chart(rows, tmp_path / "c.png", "title")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_tensors_are_what_the_server_computes_from_the_bytes(tmp_path: Path) -> None:
    from benchmarks.grpc_vs_http import IMAGE_MODEL, TEXT_MODEL, _payloads, _tensors
    from lara_serve.server.synthetic import make_image_model, make_text_model

    make_text_model(tmp_path, TEXT_MODEL, max_length=32 * 1024)
    make_image_model(tmp_path, IMAGE_MODEL)
    payloads = _payloads()
    text = _tensors(tmp_path, TEXT_MODEL, payloads["text_16k"][1])
    assert text["input_ids"].shape == (1, 16 * 1024) and text["input_ids"].dtype == np.int64
    assert text["input_ids"][0, 0] == ord("S") + 1 and text["attention_mask"].min() == 1  # byte_offset 1
    image = _tensors(tmp_path, IMAGE_MODEL, payloads["image_png"][1])
    assert image["pixel_values"].shape == (1, 1, 28, 28) and image["pixel_values"].dtype == np.float32


def test_peer_pads_and_concatenates_requests_on_the_batch_axis() -> None:
    a, b = np.ones((1, 3), np.int64), np.full((2, 5), 2, np.int64)
    got = pytriton_peer._pad_concat([a, b])
    assert got.shape == (3, 5) and got.dtype == np.int64
    assert got[0].tolist() == [1, 1, 1, 0, 0] and got[1:].tolist() == [[2] * 5] * 2
    images = [np.zeros((1, 1, 2, 2), np.float32), np.ones((1, 1, 2, 2), np.float32)]
    assert pytriton_peer._pad_concat(images).tolist() == [[[[0, 0], [0, 0]]], [[[1, 1], [1, 1]]]]


def test_probe_names_a_missing_python(tmp_path: Path) -> None:
    assert "does not exist" in (pytriton_peer.probe(tmp_path / "python") or "")


@pytest.mark.skipif(
    pytriton_peer.probe(pytriton_peer.VENV / "bin" / "python") is not None,
    reason="no .venv-triton with pytriton (make bench-triton-env); the peer is optional",
)
def test_live_peer_serves_the_synthetic_text_model_over_http_and_grpc(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient

    from lara_serve.server.synthetic import make_text_model

    make_text_model(tmp_path, "t", max_length=64)
    ids = np.array([[5, 6, 7]], dtype=np.int64)
    with pytriton_peer.running(pytriton_peer.VENV / "bin" / "python", {"t": tmp_path / "t" / "1" / "model.onnx"},
                               None, start_timeout_s=180) as peer:  # fmt: skip
        client = grpcclient.InferenceServerClient(peer.grpc)
        inputs = [grpcclient.InferInput(n, [1, 3], "INT64") for n in ("input_ids", "attention_mask")]
        inputs[0].set_data_from_numpy(ids)
        inputs[1].set_data_from_numpy(np.ones_like(ids))
        logits = client.infer("t", inputs, client_timeout=30).as_numpy("logits")
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "t" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    (expected,) = session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
