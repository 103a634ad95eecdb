"""The fused CPU kernel as onnxruntime's `com.lara::LaraAttention` (a custom-op library), torch-free.

`kernels/csrc/lara_ort_op.cpp` + `lara_cpu.cpp` are compiled (on first use, cached: see
`kernels/native_build.py`) against onnxruntime's C API header. `register(options)` adds the library to
an `onnxruntime.SessionOptions`; onnxruntime then runs the fused kernel for every LaraAttention node on
the CPU instead of inlining the node's ONNX function body, and the exported models stay as they are.

The header is not on PyPI (the onnxruntime wheels ship no include/). `make setup` and `make serve`
unpack onnxruntime's MIT-licensed C API headers from an npm registry package into the ignored
`data_cache/onnxruntime-headers/`; `$LARA_ORT_HEADERS` names another folder holding
`onnxruntime_c_api.h`. `$LARA_ORT_LIBRARY` names a library built ahead of time (the container image
builds it in its build stage and ships no compiler): then nothing is compiled. Without the header, a
compiler, or with `LARA_ORT_KERNEL=off`, `library()` returns None after one warning and onnxruntime runs
the function body: slower at long lengths, same results within float32 rounding.

    python -m lara_serve.kernels.ort_library      # build ahead of time and say which path onnxruntime will use
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from lara_serve.kernels import native_build

ABI_VERSION = 1
ROOT = Path(__file__).resolve().parent.parent
HEADER = "onnxruntime_c_api.h"


def headers_dir() -> Path:
    env = os.environ.get("LARA_ORT_HEADERS")
    return Path(env) if env else ROOT / "data_cache" / "onnxruntime-headers"


def _checked(path: Path) -> Path:
    """`path` if it loads and has this module's ABI; raises otherwise."""
    lib = ctypes.CDLL(str(path))
    lib.lara_ort_op_abi_version.restype = ctypes.c_int
    if lib.lara_ort_op_abi_version() != ABI_VERSION:
        raise RuntimeError(f"{path} has ABI {lib.lara_ort_op_abi_version()}, expected {ABI_VERSION}")
    return path


def _build_or_reason() -> Path | str:
    if os.environ.get("LARA_ORT_KERNEL", "").lower() in ("0", "off", "false", "no"):
        return "disabled by LARA_ORT_KERNEL"
    prebuilt = os.environ.get("LARA_ORT_LIBRARY")
    if prebuilt:
        try:
            return _checked(Path(prebuilt))
        except Exception as exc:
            return f"LARA_ORT_LIBRARY={prebuilt} cannot be used: {exc}"
    include = headers_dir()
    if not (include / HEADER).is_file():
        return (
            f"{include / HEADER} not found (run `make setup` or `make serve`, which unpack onnxruntime's C API "
            "headers, or set LARA_ORT_HEADERS to a folder holding them)"
        )
    sources = [native_build.CSRC / "lara_ort_op.cpp", native_build.CSRC / "lara_cpu.cpp"]
    try:
        path = native_build.cached_library(
            "lara_ort",
            sources,
            [native_build.CSRC / "lara_impl.h", include / HEADER],
            (*native_build.CXXFLAGS, f"-I{include}"),
        )
        return _checked(path)
    except Exception as exc:  # any failure means "run the function body", never a crash
        return f"fused onnxruntime kernel unavailable: {exc}"


_library = native_build.Once(_build_or_reason, "onnxruntime runs LaraAttention's ONNX function body")


def library() -> Path | None:
    """Path of the custom-op library (built on first call), or None after one warning."""
    return _library.get()


def unavailable_reason() -> str | None:
    """Why the library cannot be used (None when it can); builds it on first call."""
    return _library.reason()


def reset() -> None:
    """Forget the built library or the failure (tests, or after installing the headers)."""
    _library.reset()


def register(options: Any) -> bool:
    """Add the fused LaraAttention kernel to an `onnxruntime.SessionOptions`; False when unavailable."""
    path = library()
    if path is None:
        return False
    options.register_custom_ops_library(str(path))
    return True


if __name__ == "__main__":
    got = library()
    print(f"fused onnxruntime kernel: {got if got is not None else unavailable_reason()}")
    raise SystemExit(0 if got is not None else 1)
