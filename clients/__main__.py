"""`lara predict --model NAME FILE...` (or `python -m lara_serve.clients ...`; also: `train`, `load`, `models`, `info`, `health`,
`loadtest`).

Each file is its own request: one file that fails (too long, not an image, unreadable) gets its error on
its own line and the others still get their labels; the exit status is 1 if any file failed.
Human output by default (top-k with bars); `--json` prints one JSON object per file for scripts.
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import httpx

from lara_serve.clients.client import Explanation, LaraClient, LaraError, Prediction

TRUNCATE_SIDES = ("head", "tail", "head+tail")
_BAR = 24  # characters of a score of 1.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lara", description="LARA Serve command-line client")
    parser.add_argument("--url", default=os.environ.get("LARA_URL", "http://127.0.0.1:8000"), help="or env LARA_URL")
    parser.add_argument("--api-key", default=os.environ.get("LARA_API_KEY"), help="or env LARA_API_KEY")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("predict", "classify"):
        cmd = sub.add_parser(
            name,
            help="classify files (texts for text models, images for image models), one request per file"
            + ("" if name == "predict" else " (same as predict)"),
        )
        cmd.add_argument("--model", required=True)
        cmd.add_argument(
            "--truncate",
            nargs="?",
            const="head",
            default=None,
            choices=TRUNCATE_SIDES,
            help="texts longer than the model takes: keep the head (the default when given alone), the tail, "
            "or half of each; without it they fail with 413",
        )
        cmd.add_argument("--top-k", type=int, default=3, help="labels to show per file (default 3)")
        cmd.add_argument("--charset", default="utf-8", help="encoding of the text files (default utf-8)")
        cmd.add_argument("--json", action="store_true", help="one JSON object per file instead of a table")
        cmd.add_argument("files", nargs="+", type=Path)
    # Its own flags are parsed by lara_serve.model_export.your_data.command (`lara train --help`); it needs the [train] extra.
    sub.add_parser("train", help="train a LARA model on your labelled texts or images", add_help=False)
    load = sub.add_parser("load", help="load (or reload) a model from the server's model repository")
    load.add_argument("name", help="the model's folder name in the server's --model-repository")
    sub.add_parser("models", help="list served models")
    sub.add_parser("info", help="server limits and model cards (GET /info)")
    sub.add_parser("health", help="liveness and readiness")
    # Its own flags are parsed by lara_serve.clients.loadtest (see `python -m lara_serve.clients loadtest --help`).
    sub.add_parser("loadtest", help="latency and throughput vs input length and load", add_help=False)
    explain = sub.add_parser("explain", help="text models: the passages that decided each file's label (occlusion)")
    explain.add_argument("--model", required=True)
    explain.add_argument("--truncate", nargs="?", const="head", default=None, choices=TRUNCATE_SIDES)
    explain.add_argument("--max-passages", type=int, default=None, help="split each text into at most this many")
    explain.add_argument("--top", type=int, default=3, help="passages to show per file (default 3)")
    explain.add_argument("--charset", default="utf-8", help="encoding of the text files (default utf-8)")
    explain.add_argument("--json", action="store_true", help="one JSON object per file instead of text")
    explain.add_argument("files", nargs="+", type=Path)
    for name, cmd in sub.choices.items():
        if name not in ("train", "loadtest"):  # those parse their own flags (train: --load-into, --api-key)
            # Global options also after the subcommand (`lara info --url URL`); SUPPRESS keeps the global value.
            cmd.add_argument("--url", default=argparse.SUPPRESS, help="or before the subcommand; or env LARA_URL")
            cmd.add_argument("--api-key", default=argparse.SUPPRESS, help="or env LARA_API_KEY")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`lara ...`; a reader that stops early (`lara info | head`) ends it quietly, as `cat` would."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush does not raise a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe


def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "loadtest":
        from lara_serve.clients.loadtest import main as loadtest_main

        # `python -m lara_serve.clients --url U loadtest ...` passes the global --url/--api-key on.
        given = ["--url", args.url] if args.url and "--url" not in rest else []
        key = ["--api-key", args.api_key] if args.api_key and "--api-key" not in rest else []
        return loadtest_main([*given, *key, *rest])
    if args.command == "train":
        return _train(rest, args.api_key)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    with LaraClient(args.url, api_key=args.api_key) as client:
        try:
            if args.command == "explain":  # text models: the passages that decided (`lara explain --help`)
                return explain_files(client, args, sys.stdout)
            if args.command == "models":
                for name in client.models():
                    print(name)
            elif args.command == "info":
                print(json.dumps(client.info(), indent=2))
            elif args.command == "load":
                print(f"loaded {client.load_from_repository(args.name)} into {args.url}")
            elif args.command == "health":
                print(json.dumps({"live": client.is_live(), "ready": client.is_ready()}))
            else:
                return classify_files(client, args, sys.stdout)
        except LaraError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except httpx.TransportError as exc:
            print(f"error: {_transport_message(args.url, exc)}", file=sys.stderr)
            return 1
    return 0


_TRAIN_DEPENDENCIES = {"torch", "triton", "safetensors", "onnx", "onnxscript", "tqdm", "sklearn", "matplotlib"}


def _train(argv: list[str], api_key: str | None) -> int:
    """`lara train`: the training code is imported only here, so the lean install (no torch) keeps working."""
    try:
        from lara_serve.model_export.your_data.command import main as train_main
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in _TRAIN_DEPENDENCIES:
            raise
        print(
            f"error: `lara train` needs the training extra (missing: {missing}); install it with "
            "pip install 'lara-serve[train]'",
            file=sys.stderr,
        )
        return 1
    if api_key and "--api-key" not in argv:
        argv = [*argv, "--api-key", api_key]
    return train_main(argv, load=load_into, probe=probe_server)


def probe_server(url: str, api_key: str | None) -> None:
    """--load-into, before training: the server answers and shows its model repository to this key."""
    with LaraClient(url, api_key=api_key, timeout_s=10.0) as client:
        try:
            live = client.is_live()
            client.repository_index()  # what loading asks first: a refused API key fails here, not after training
        except httpx.TransportError as exc:
            raise RuntimeError(_transport_message(url, exc)) from None
    if not live:
        raise RuntimeError(f"{url} is not live")


def load_into(url: str, name: str, api_key: str | None) -> str:
    """--load-into: ask the server at `url` to load `name` from its repository folder."""
    with LaraClient(url, api_key=api_key, timeout_s=300.0) as client:
        try:
            client.load_from_repository(name)
        except httpx.TransportError as exc:
            raise RuntimeError(_transport_message(url, exc)) from None
    return f"loaded {name} into {url}"


def _transport_message(url: str, exc: httpx.TransportError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url} ({exc}); is the server running? (set --url or LARA_URL)"
    if isinstance(exc, httpx.TimeoutException):
        return f"{url} did not answer in time ({type(exc).__name__})"
    return f"request to {url} failed: {exc}"


def classify_files(client: LaraClient, args: argparse.Namespace, out: TextIO) -> int:
    """One request per file; a failure is reported for that file and the others go on."""
    task = client.model_info(args.model)["task"]  # unknown model or no server: fails once, for all files

    def classify(path: Path) -> Prediction:
        data = path.read_bytes()
        guessed = mimetypes.guess_type(path.name)[0] or ""
        if task == "text" and not guessed.startswith("image/"):
            content_type = f"text/plain; charset={args.charset}"
        elif guessed.startswith("image/"):
            content_type = guessed  # to a text model: the server's 415 says what it takes
        else:
            content_type = "application/octet-stream"  # the server sniffs what it is
        return client.classify(args.model, data, content_type, truncate=args.truncate or False, top_k=args.top_k)

    return _each_file(
        args, out, classify, lambda path, p: _report(out, path, p, args.json),
        unreadable=lambda exc: f"cannot read: {getattr(exc, 'strerror', None) or exc}",
        hint_413=" (use --truncate to cut long texts)",
    )  # fmt: skip


def _each_file(
    args: argparse.Namespace,
    out: TextIO,
    run: Callable[[Path], Any],
    report: Callable[[Path, Any], None],
    unreadable: Callable[[Exception], str],
    hint_413: str = "",
) -> int:
    """`run` on each of args.files, `report` its answer; a failure is reported for that file and the others
    go on. 1 if any failed."""
    failed = 0
    for path in args.files:
        try:
            answer = run(path)
        except LaraError as exc:
            failed += 1
            hint = hint_413 if exc.status == 413 and "--truncate" not in exc.message else ""
            _report_error(out, path, f"HTTP {exc.status}: {exc.message}{hint}", exc.status, args.json)
        except (OSError, UnicodeDecodeError) as exc:
            failed += 1
            _report_error(out, path, unreadable(exc), None, args.json)
        except httpx.TransportError as exc:
            failed += 1
            _report_error(out, path, _transport_message(args.url, exc), None, args.json)
        else:
            report(path, answer)
    return 1 if failed else 0


def _report(out: TextIO, path: Path, prediction: Prediction, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"file": str(path), **asdict(prediction)}), file=out)
        return
    note = "  (truncated)" if prediction.truncated else ""
    if prediction.in_distribution is False:
        note += "  (not like the training data: the label is unreliable)"
    print(f"{path}: {prediction.label} {prediction.score:.3f}{note}", file=out)
    if prediction.ood_score is not None:
        verdict = {True: "in distribution", False: "out of distribution", None: "no threshold"}
        print(f"  ood_score {prediction.ood_score:.4g} ({verdict[prediction.in_distribution]})", file=out)
    width = max(len(t.label) for t in prediction.top_k)
    for t in prediction.top_k:
        bar = "#" * max(1, round(t.score * _BAR)) if t.score >= 0.005 else ""
        print(f"  {t.label:<{width}}  {t.score:6.3f}  {bar}", file=out)


def explain_files(client: LaraClient, args: argparse.Namespace, out: TextIO) -> int:
    """One :explain request per file; a failure is reported for that file and the others go on."""

    def explain(path: Path) -> Explanation:
        text = path.read_bytes().decode(args.charset)
        (explanation,) = client.explain(args.model, [text], args.truncate, args.max_passages)
        return explanation

    return _each_file(
        args, out, explain, lambda path, e: _report_explanation(out, path, e, args.top, args.json),
        unreadable=lambda exc: f"cannot read as {args.charset}: {exc}",
    )  # fmt: skip


def _report_explanation(out: TextIO, path: Path, explanation: Explanation, top: int, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"file": str(path), **asdict(explanation)}), file=out)
        return
    _report(out, path, explanation.prediction, as_json=False)
    print(f"  passages that raised {explanation.prediction.label!r} most (of {len(explanation.passages)}):", file=out)
    for passage in explanation.top(top):
        snippet = " ".join(passage.text.split())
        snippet = snippet if len(snippet) <= 70 else snippet[:67] + "..."
        print(f"  {passage.contribution:+.3f}  bytes {passage.start}-{passage.end}  {snippet}", file=out)


def _report_error(out: TextIO, path: Path, message: str, status: int | None, as_json: bool) -> None:
    """--json: an error object on stdout, in file order, so a script sees every file. Else a line on stderr."""
    if as_json:
        body: dict[str, Any] = {"file": str(path), "error": message}
        if status is not None:
            body["status"] = status
        print(json.dumps(body), file=out)
    else:
        print(f"{path}: error: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
