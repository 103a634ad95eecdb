"""Call a running LARA Serve with the client library: classify the example article, the long document and
the Fashion-MNIST image, and show how sure each answer is.

    make serve                                   # in another terminal (serves on 127.0.0.1:8000)
    python examples/quickstart.py                # or: python examples/quickstart.py http://127.0.0.1:9000

It starts nothing itself. Exit status 0 when every call succeeded, 1 (with the server's message) if not.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing: the clients package is beside

import httpx  # noqa: E402

from lara_serve.clients import LaraClient, LaraError, Prediction  # noqa: E402


def show(what: str, p: Prediction) -> None:
    others = ", ".join(f"{s.label} {s.score:.2f}" for s in p.top_k[1:3])
    line = f"{what}: {p.label} ({p.score:.2f}; then {others})"
    if p.truncated:
        line += " [truncated to the model's length]"
    if p.ood_score is not None:  # models exported with an out-of-domain score
        line += f" ood_score={p.ood_score:.3f} in_distribution={p.in_distribution}"
    print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default=os.environ.get("LARA_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("LARA_API_KEY"))
    args = parser.parse_args(argv)
    try:
        with LaraClient(args.url, api_key=args.api_key) as client:
            models = client.models()
            print(f"{args.url} serves {', '.join(models)}")
            article = (HERE / "article.txt").read_text(encoding="utf-8")
            long_document = (HERE / "long-document.txt").read_text(encoding="utf-8")
            if "lara-text-news" in models:
                show("article.txt", client.predict("lara-text-news", [article])[0])
                # head: a document over the model's 65,536 bytes keeps its beginning instead of a 413.
                show("long-document.txt", client.classify("lara-text-news", long_document, truncate="head"))
                print(f"  server times (ms): queue {client.last_headers.get('x-queue-time-ms')}, "
                      f"inference {client.last_headers.get('x-inference-time-ms')}")  # fmt: skip
            if "lara-vit-fashion" in models:
                image = (HERE / "ankle-boot.png").read_bytes()
                show("ankle-boot.png", client.classify("lara-vit-fashion", image, "image/png"))
    except LaraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except httpx.TransportError as exc:
        print(f"error: cannot reach {args.url} ({exc}); is the server running? (make serve)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
