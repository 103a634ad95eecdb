"""glibc malloc tuning for the torch backend: keep freed memory for reuse instead of unmapping it.

Why: glibc serves every allocation of 32 MiB or more (and smaller ones past its dynamic threshold)
with mmap and gives it back with munmap on free. A 64K-token forward of the text model allocates and
frees dozens of activations that large ([65,536, 128] fp32 is 32 MiB), and the kernel page-faults and
zeroes every page of each one again. Serving them from the heap and never trimming it made the torch
forward about 40% faster at 64K tokens here (`python -m research.allocator`). onnxruntime has its own
arena and is unaffected. The cost: resident memory stays at its high-water mark instead of shrinking
between requests.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_MAX = -4
TRIM_NEVER = 2**31 - 1  # mallopt takes an int; 2 GiB of free heap top before trimming

_done: list[str | None] = []


def keep_freed_memory() -> str | None:
    """Ask glibc to allocate from the heap only and not to trim it. Returns None when in effect, else
    the reason it is not (not glibc, mallopt refused). Idempotent; process-wide."""
    if _done:
        return _done[0]
    reason: str | None = None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        reason = f"no glibc mallopt ({exc})"
    else:
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        if mallopt(M_MMAP_MAX, 0) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_NEVER) != 1:
            reason = "mallopt refused M_MMAP_MAX / M_TRIM_THRESHOLD"
    if reason:
        log.warning("malloc tuning not applied: %s (large tensors will be page-faulted per request)", reason)
    _done.append(reason)
    return reason


def trim_freed_memory() -> bool:
    """Give freed heap memory back to the system now (glibc malloc_trim): after a long document, so the
    process does not keep its peak while idle. True when done; False off glibc. Cheap when nothing is free."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
