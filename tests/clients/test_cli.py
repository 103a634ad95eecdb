"""The CLI per file: every file gets its own result or error, exit 1 if any failed; human and --json output."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from lara_serve.clients.__main__ import main
from lara_serve.server.synthetic import IMAGE_LABELS, TEXT_LABELS
from lara_serve.server.testing import free_port

API_KEY = "client-test-key"  # as in conftest.py
MAX_LENGTH = 128  # the live server's tiny-text model


def run(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    code = main(["--url", url, "--api-key", API_KEY, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "short": tmp_path / "short.txt",
        "long": tmp_path / "long.txt",
        "latin1": tmp_path / "latin1.txt",
        "png": tmp_path / "item.png",
        "bin": tmp_path / "item.bin",
    }
    paths["short"].write_text("the striker scored twice in the final")
    paths["long"].write_text("shares " * 40)  # 280 bytes > MAX_LENGTH
    paths["latin1"].write_bytes("Café résumé: señor Müller".encode("latin-1"))
    buffer = io.BytesIO()
    Image.new("L", (28, 28), color=90).save(buffer, format="PNG")
    paths["png"].write_bytes(buffer.getvalue())
    paths["bin"].write_bytes(buffer.getvalue())  # no image extension: the server sniffs it
    return paths


def test_one_failing_file_does_not_hide_the_others(
    live_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = files["short"].parent / "missing.txt"
    code, out, _ = run(capsys, live_url, "predict", "--json", "--model", "tiny-text",
                       str(files["short"]), str(files["long"]), str(missing))  # fmt: skip
    assert code == 1
    ok, too_long, unreadable = (json.loads(line) for line in out.splitlines())
    assert ok["file"] == str(files["short"]) and ok["label"] in TEXT_LABELS and len(ok["top_k"]) == 3
    assert too_long["status"] == 413 and "--truncate" in too_long["error"] and "label" not in too_long
    assert unreadable["file"] == str(missing) and "cannot read" in unreadable["error"]


def test_truncate_flag_and_truncated_result(
    live_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    for side in ([], ["tail"], ["head+tail"]):
        code, out, _ = run(capsys, live_url, "predict", "--json", "--model", "tiny-text", "--truncate", *side, "--",
                           str(files["long"]), str(files["short"]))  # fmt: skip
        assert code == 0
        long, short = (json.loads(line) for line in out.splitlines())
        assert long["truncated"] is True and short["truncated"] is False


def test_human_output_is_a_table_with_bars(
    live_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, live_url, "classify", "--model", "tiny-text", "--top-k", "4", str(files["short"]),
                         str(files["long"]))  # fmt: skip
    assert code == 1
    lines = out.splitlines()
    head, *rows = lines
    assert head.startswith(f"{files['short']}: ") and head.split()[1] in TEXT_LABELS
    assert len(rows) == 4 and all(row.split()[0] in TEXT_LABELS for row in rows)
    scores = [float(row.split()[1]) for row in rows]
    assert scores == sorted(scores, reverse=True) and sum(scores) == pytest.approx(1.0, abs=2e-3)
    assert "#" in rows[0]  # the best label has a bar
    assert f"{files['long']}: error: HTTP 413" in err  # the error goes to stderr, the table stays clean


def test_images_by_extension_or_sniffed_and_wrong_kind_per_file(
    live_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, live_url, "predict", "--json", "--model", "tiny-image",
                       str(files["png"]), str(files["bin"]), str(files["short"]))  # fmt: skip
    png, binary, text = (json.loads(line) for line in out.splitlines())
    assert code == 1 and png["label"] in IMAGE_LABELS and binary["label"] == png["label"]
    assert text["status"] == 415 and "looks like text/plain" in text["error"]


def test_charset_of_text_files(live_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, live_url, "predict", "--json", "--model", "tiny-text", "--charset", "latin-1",
                       str(files["latin1"]))  # fmt: skip
    assert code == 0 and json.loads(out)["label"] in TEXT_LABELS
    code, out, _ = run(capsys, live_url, "predict", "--json", "--model", "tiny-text", str(files["latin1"]))
    assert code == 1 and json.loads(out)["status"] == 422


def test_connection_error_names_the_url(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code, out, err = run(capsys, url, "predict", "--model", "tiny-text", str(files["short"]))
    assert code == 1 and out == ""
    assert f"cannot connect to {url}" in err and "is the server running" in err


def test_console_script(live_url: str, files: dict[str, Path]) -> None:
    script = Path(sys.executable).parent / "lara"
    if not script.exists():
        pytest.skip("the console script appears after `pip install -e .` (make setup)")
    done = subprocess.run([str(script), "--url", live_url, "--api-key", API_KEY, "predict", "--json", "--model",
                           "tiny-text", str(files["short"])], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and json.loads(done.stdout)["label"] in TEXT_LABELS
