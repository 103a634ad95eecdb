"""Settings: LARA_ environment variables, flags over env, refusal of impossible combinations."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from lara_serve.server.__main__ import parse_settings
from lara_serve.server.settings import DEFAULT_MODEL_REPOSITORY, Settings


def test_defaults_and_env(monkeypatch: pytest.MonkeyPatch, repo: Path) -> None:
    assert Settings.model_fields["host"].default == "127.0.0.1"
    assert Settings.model_fields["model_repository"].default == DEFAULT_MODEL_REPOSITORY
    monkeypatch.setenv("LARA_MODEL_REPOSITORY", str(repo))
    monkeypatch.setenv("LARA_PORT", "9123")
    monkeypatch.setenv("LARA_MODELS", "tiny-text, tiny-image")
    monkeypatch.setenv("LARA_API_KEY", "0123456789")
    settings = Settings()
    assert settings.port == 9123 and settings.models == ["tiny-text", "tiny-image"]
    assert settings.api_key is not None and "0123" not in repr(settings)  # secrets stay out of logs
    flagged = parse_settings(["--port", "9200", "--backend", "torch", "--no-warmup"])
    assert flagged.port == 9200 and flagged.backend == "torch" and flagged.warmup is False


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"max_batch_size": 64, "max_queue_size": 8}, "max_queue_size"),
        ({"request_timeout_s": 0.001, "max_queue_delay_ms": 5}, "request_timeout_s"),
        ({"api_key": "short"}, "8 characters"),
        ({"backend": "tensorrt"}, "onnxruntime"),
        ({"port": 0}, "greater than or equal"),
        ({"model_repository": "/nonexistent/repo"}, "not a directory"),
    ],
)
def test_impossible_combinations_are_refused(repo: Path, overrides: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        Settings(**({"model_repository": repo} | overrides))  # type: ignore[arg-type]


def test_model_backends_parse_and_refuse(monkeypatch: pytest.MonkeyPatch, repo: Path) -> None:
    monkeypatch.setenv("LARA_MODEL_REPOSITORY", str(repo))
    monkeypatch.setenv("LARA_MODEL_BACKENDS", "tiny-text=torch, tiny-image = onnxruntime")
    settings = Settings()
    assert settings.model_backends == {"tiny-text": "torch", "tiny-image": "onnxruntime"}
    assert settings.backend_for("tiny-text") == "torch" and settings.backend_for("other") == "onnxruntime"
    flagged = parse_settings(["--backend", "torch", "--model-backends", "tiny-image=onnxruntime"])
    assert flagged.backend_for("tiny-image") == "onnxruntime" and flagged.backend_for("tiny-text") == "torch"
    with pytest.raises(ValidationError, match="not name=backend"):
        Settings(model_repository=repo, model_backends="tiny-text")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="onnxruntime"):
        Settings(model_repository=repo, model_backends="tiny-text=tensorrt")  # type: ignore[arg-type]


def test_ort_attention_parses_and_refuses(monkeypatch: pytest.MonkeyPatch, repo: Path) -> None:
    assert Settings(model_repository=repo).ort_attention == "auto"
    monkeypatch.setenv("LARA_ORT_ATTENTION", "body")
    assert Settings(model_repository=repo).ort_attention == "body"
    assert parse_settings(["--model-repository", str(repo), "--ort-attention", "fused"]).ort_attention == "fused"
    with pytest.raises(ValidationError, match="'auto', 'fused' or 'body'"):
        Settings(model_repository=repo, ort_attention="openmp")  # type: ignore[arg-type]


def test_ort_spinning_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch, repo: Path) -> None:
    assert Settings(model_repository=repo).ort_spinning is False
    monkeypatch.setenv("LARA_ORT_SPINNING", "true")
    assert Settings(model_repository=repo).ort_spinning is True
    assert parse_settings(["--model-repository", str(repo), "--no-ort-spinning"]).ort_spinning is False


def test_help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    """`lara-serve --help` prints (a "%" in a description once made argparse raise) and names each env var."""
    from lara_serve.server.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in Settings.model_fields:
        assert f"LARA_{name.upper()}" in out
    assert "40% faster" in " ".join(out.split())  # the description that holds a percent sign, unmangled
