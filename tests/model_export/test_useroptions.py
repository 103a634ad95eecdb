"""`lara train` option checks (your_data.options.check_options): bad values are refused before any work, with
the flag, the value and what is allowed."""

from __future__ import annotations

import argparse

import pytest

from lara_serve.model_export.your_data.options import UsageError, add_arguments, check_options


def parsed(*extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["data.jsonl", "--out", "m", *extra])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-length", "0"], "--max-length must be positive, got 0"),
        (["--max-length", "32"], "--max-length must be at least 64 (the export traces 64 tokens), got 32"),
        (["--image-size", "3"], "--image-size must be at least 4, got 3"),
        (["--epochs", "-1"], "--epochs must be positive, got -1"),
    ],
)
def test_bad_values_are_refused_with_what_is_allowed(extra: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_options(parsed(*extra))


def test_the_least_max_length_is_accepted() -> None:
    args = parsed("--max-length", "64")
    check_options(args)
    assert args.max_length == 64


@pytest.mark.parametrize(
    ("extra", "processes", "want", "why"),
    [
        ([], 1, "lara-text-news", "the default: lara-text-news frozen"),
        (["--epochs", "2"], 1, "lara-text-news-bytes", "--epochs train(s) the byte encoder"),
        (["--lr", "1e-3", "--no-augment"], 1, "lara-text-news-bytes", "--lr, --no-augment train(s) the byte encoder"),
        (["--resume"], 1, "lara-text-news-bytes", "--resume train(s)"),
        (["--pooling", "mean"], 1, "lara-text-news-bytes", "--pooling mean train(s)"),
        (["--arch", "tiny-text"], 1, "lara-text-news-bytes", "--arch train(s)"),
        ([], 2, "lara-text-news-bytes", "2 processes train the byte encoder"),
        (["--max-length", "4096", "--time-budget", "5", "--no-wide"], 1, "lara-text-news", "the default"),
    ],
)
def test_the_default_text_encoder_follows_what_the_run_asks_for(
    extra: list[str], processes: int, want: str, why: str, tmp_path, monkeypatch
) -> None:
    from lara_serve.model_export.your_data import options

    shipped = tmp_path / "repo"
    (shipped / "lara-text-news" / "1").mkdir(parents=True)
    (shipped / "lara-text-news" / "1" / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(options, "SHIPPED", shipped)
    init, said = options.default_text_init(parsed(*extra), processes)
    assert init == want and why in said


def test_without_the_pretrained_model_the_default_is_the_byte_encoder(tmp_path, monkeypatch) -> None:
    from lara_serve.model_export.your_data import options

    monkeypatch.setattr(options, "SHIPPED", tmp_path)  # a lean image: no lara-text-news
    init, said = options.default_text_init(parsed(), 1)
    assert init == "lara-text-news-bytes" and "lara-text-news is not in" in said
