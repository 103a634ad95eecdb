"""Build-on-first-use for the C++ sources in `kernels/csrc/` (no torch: the lean serving install uses it).

A library is compiled by the system C++ compiler (`$CXX`, else g++, else c++) into a cache folder:
`$LARA_KERNEL_CACHE`, else `~/.cache/lara-serve/kernels`. Its file name holds a hash of the sources,
flags and compiler version, so an edited source or another compiler builds a new library; a finished
build is renamed into place, so concurrent processes never load a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

CSRC = Path(__file__).with_name("csrc")
# Portable on purpose (no -march=native): baseline ISA plus AVX2/FMA and AVX-512 variants chosen at run
# time inside the source. -fno-math-errno lets exp/sqrt inline; no -ffast-math: the kernel relies on inf.
CXXFLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno")
BUILD_TIMEOUT_S = 300


def cache_dir() -> Path:
    env = os.environ.get("LARA_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lara-serve" / "kernels"


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def library_path(cxx: str, stem: str, inputs: Sequence[Path], flags: Sequence[str]) -> Path:
    """Where the library built from `inputs` (sources and headers it includes) with `flags` is cached."""
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60, check=True)
    h = hashlib.sha256()
    for path in inputs:
        h.update(path.read_bytes())
    h.update(" ".join((*flags, version.stdout.splitlines()[0], platform.machine())).encode())
    return cache_dir() / f"{stem}-{h.hexdigest()[:16]}.so"


def build(cxx: str, sources: Sequence[Path], flags: Sequence[str], path: Path) -> None:
    """Compile `sources` into `path` (atomically); RuntimeError with the compiler's message on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.so", dir=path.parent)
    os.close(fd)
    try:
        cmd = [cxx, *flags, *map(str, sources), "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-2000:]}")
        # mkstemp makes the file 0600; a shared library others may load (a server running as another
        # user, as in the container image) must be readable by them.
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cached_library(stem: str, sources: Sequence[Path], headers: Sequence[Path], flags: Sequence[str]) -> Path:
    """The library for these sources, built now unless the cache has it. Raises on any failure."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    path = library_path(cxx, stem, [*sources, *headers], flags)
    if not path.exists():
        build(cxx, sources, flags, path)
    return path


class Once(Generic[T]):
    """A native library decided once per process: `make()` returns it, or a string saying why it cannot be
    had; then `get()` returns it, or None after ONE warning ending with `fallback` (what runs instead)."""

    def __init__(self, make: Callable[[], T | str], fallback: str) -> None:
        self._make = make
        self._fallback = fallback
        self._lock = threading.Lock()
        self._state: dict[str, object] = {}  # "value": T, or "error": str, once decided

    def get(self) -> T | None:
        with self._lock:
            if not self._state:
                got = self._make()
                if isinstance(got, str):
                    self._state["error"] = got
                    warnings.warn(f"{got}; {self._fallback}", stacklevel=3)
                else:
                    self._state["value"] = got
            return self._state.get("value")  # type: ignore[return-value]

    def reason(self) -> str | None:
        """Why the library cannot be used (None when it can); decides on first call."""
        return None if self.get() is not None else str(self._state["error"])

    def reset(self) -> None:
        """Forget the decision (tests, or after installing what was missing)."""
        with self._lock:
            self._state.clear()
