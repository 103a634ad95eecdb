"""Byte-for-byte comparisons of model files by their sha256.

Why: asserting `a.read_bytes() == b.read_bytes()` on megabytes makes pytest render both sides when it fails;
once that crashed pytest itself (INTERNALERROR) and hid which test had failed. Two digests say the same thing
in one readable line."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256(data: bytes | Path) -> str:
    """The hex sha256 of bytes, or of a file's bytes."""
    return hashlib.sha256(data.read_bytes() if isinstance(data, Path) else data).hexdigest()
