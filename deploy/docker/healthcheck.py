"""Container HEALTHCHECK: exit 0 when /v2/health/live answers 200 on this container's port (stdlib only)."""

import os
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("LARA_PORT", "8000")
    url = f"http://127.0.0.1:{port}/v2/health/live"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except OSError as exc:
        print(f"healthcheck {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
