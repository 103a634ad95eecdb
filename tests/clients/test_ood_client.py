"""The client library and the `lara` CLI with a model that has ood_score, and :explain, against a live loopback
server; and that results from models without ood_score keep their old shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lara_serve.clients import LaraClient
from lara_serve.clients.__main__ import main
from lara_serve.clients.client import LaraError, Prediction
from lara_serve.server.synthetic import ENGLISH, TEXT_LABELS, make_text_model
from lara_serve.server.testing import server_process

OOD, OLD, EXPLAIN = "ood-text", "old-text", "trigger-text"
ARTICLE = "Zq jazz quiz xj quixote zax jinx quartz fizz equinox. " * 6
FILLER = "The of and to in a is that for on with as was by at an be this from or had not are but have. " * 12


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("ood_client_repo")
    make_text_model(repo, OOD, max_length=8192, ood=True)
    make_text_model(repo, OLD, max_length=8192)
    make_text_model(repo, EXPLAIN, max_length=8192, trigger=b"zqxj", trigger_label=2)
    with server_process(
        ["--log-level", "warning"], env={"LARA_MODEL_REPOSITORY": str(repo), "LARA_NUM_THREADS": "1"}
    ) as u:
        yield u


def test_library_predict_infer_and_explain(url: str) -> None:
    english = ENGLISH[3].decode()
    with LaraClient(url) as client:
        ok, odd = client.predict(OOD, [english, "a"])
        assert ok.in_distribution is True and odd.in_distribution is False
        assert isinstance(odd.ood_score, float) and odd.ood_score > ok.ood_score  # type: ignore[operator]
        assert client.classify(OOD, "a").in_distribution is False
        for binary in (True, False):
            result = client.infer(OOD, [english.encode(), b"a"], binary=binary)
            assert result.in_distribution is not None and list(result.in_distribution) == [True, False]
            assert result.ood_scores is not None
            np.testing.assert_allclose(result.ood_scores, [ok.ood_score, odd.ood_score], rtol=1e-5)
        old = client.predict(OLD, ["a"])[0]
        assert old.ood_score is None and old.in_distribution is None
        assert client.infer(OLD, [b"a"]).ood_scores is None

        (explanation,) = client.explain(EXPLAIN, [FILLER + ARTICLE + FILLER], max_passages=8)
        assert explanation.prediction.label == TEXT_LABELS[2] and len(explanation.passages) <= 8
        top = explanation.top(1)[0]
        assert "quiz" in top.text and top.contribution is not None and top.contribution > 0
        with pytest.raises(LaraError) as info:
            client.explain(EXPLAIN, ["x"], max_passages=100)
        assert info.value.status == 400 and "64" in info.value.message


def test_old_payloads_still_parse() -> None:
    """A server from before ood_score (no such keys) gives the same Prediction as before, with None."""
    p = Prediction.from_json({"label": "a", "score": 0.9, "top_k": [{"label": "a", "score": 0.9}]})
    assert p.ood_score is None and p.in_distribution is None and p.truncated is False


def test_cli_shows_ood_and_explains(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "english.txt").write_text(ENGLISH[5].decode())
    (tmp_path / "doc.txt").write_text(FILLER + ARTICLE + FILLER)
    code = main(["--url", url, "predict", "--model", OOD, str(tmp_path / "a.txt"), str(tmp_path / "english.txt")])
    out = capsys.readouterr().out
    assert code == 0
    first, second = out.split(str(tmp_path / "english.txt"))
    assert "not like the training data" in first and "out of distribution" in first
    assert "in distribution" in second and "not like the training data" not in second

    assert main(["--url", url, "predict", "--json", "--model", OOD, str(tmp_path / "a.txt")]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["in_distribution"] is False and row["ood_score"] > 0

    assert main(["--url", url, "explain", "--model", EXPLAIN, "--top", "2", str(tmp_path / "doc.txt")]) == 0
    out = capsys.readouterr().out
    assert "passages that raised 'sports' most" in out and out.count(" bytes ") == 2 and "quiz" in out
    assert main(["--url", url, "explain", "--json", "--model", EXPLAIN, str(tmp_path / "doc.txt")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["prediction"]["label"] == "sports" and doc["passages"][0]["start"] == 0

    old = main(["--url", url, "predict", "--model", OLD, str(tmp_path / "a.txt")])
    assert old == 0 and "ood_score" not in capsys.readouterr().out  # models without it: output as before
