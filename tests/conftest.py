"""Shared test set-up.

TRITON_INTERPRET must be set before any @triton.jit kernel is decorated, i.e. before the first import of
lara_serve.kernels._triton, so that the Triton kernels run on the CPU interpreter in tests (platform.md).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
