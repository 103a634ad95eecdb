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
