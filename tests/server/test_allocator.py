"""keep_freed_memory: large buffers are reused instead of being unmapped and page-faulted again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lara_serve.server import Settings

PROBE = """
import resource, sys
import numpy as np
if sys.argv[1] == "on":
    from lara_serve.server.backends.allocator import keep_freed_memory
    assert keep_freed_memory() is None
    assert keep_freed_memory() is None  # idempotent
def touch():  # 64 MiB, every page written, then freed
    a = np.empty(16 * 1024 * 1024, dtype=np.float32)
    a[::1024] = 1.0
    del a
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_freed_memory_is_reused_not_faulted_again():
    # At least one fault per 2 MiB (transparent huge pages) for each of the 5 re-allocations by default.
    off, on = _faults("off"), _faults("on")
    assert off >= 5 * 32, f"default malloc should unmap and re-fault each 64 MiB buffer ({off} faults)"
    assert on * 10 < off, f"with keep_freed_memory the buffer should be reused ({on} vs {off} faults)"


def test_on_by_default_and_configurable(monkeypatch):
    assert Settings().keep_freed_memory is True
    monkeypatch.setenv("LARA_KEEP_FREED_MEMORY", "false")
    assert Settings().keep_freed_memory is False
