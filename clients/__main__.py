"""`python -m clients predict --model NAME FILE...` (also: `models`, `health`, `loadtest`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import httpx

from clients.client import LaraClient, LaraError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m clients", description="LARA Serve command-line client")
    parser.add_argument("--url", default=os.environ.get("LARA_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("LARA_API_KEY"), help="or env LARA_API_KEY")
    sub = parser.add_subparsers(dest="command", required=True)
    predict = sub.add_parser("predict", help="classify files (texts for text models, images for image models)")
    predict.add_argument("--model", required=True)
    predict.add_argument("--truncate", action="store_true", help="cut texts longer than the model takes")
    predict.add_argument("--top-k", type=int, default=None)
    predict.add_argument("files", nargs="+", type=Path)
    sub.add_parser("models", help="list served models")
    sub.add_parser("health", help="liveness and readiness")
    # Its own flags are parsed by clients.loadtest (see `python -m clients loadtest --help`).
    sub.add_parser("loadtest", help="latency and throughput vs input length and load", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "loadtest":
        from clients.loadtest import main as loadtest_main

        # `python -m clients --url U loadtest ...` passes the global --url/--api-key on.
        given = ["--url", args.url] if args.url and "--url" not in rest else []
        key = ["--api-key", args.api_key] if args.api_key and "--api-key" not in rest else []
        return loadtest_main([*given, *key, *rest])
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    with LaraClient(args.url, api_key=args.api_key) as client:
        try:
            if args.command == "models":
                for name in client.models():
                    print(name)
            elif args.command == "health":
                print(json.dumps({"live": client.is_live(), "ready": client.is_ready()}))
            else:
                task = client.model_info(args.model)["task"]
                # Text files go as text (UTF-8), images as bytes (base64 in the request).
                instances: list[str | bytes] = [
                    f.read_text(encoding="utf-8") if task == "text" else f.read_bytes() for f in args.files
                ]
                predictions = client.predict(args.model, instances, truncate=args.truncate, top_k=args.top_k)
                for path, prediction in zip(args.files, predictions, strict=True):
                    print(json.dumps({"file": str(path), **asdict(prediction)}))
        except LaraError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except (OSError, UnicodeDecodeError, httpx.HTTPError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
