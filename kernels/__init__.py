"""LARA and baseline attention kernels. See `shared/docs/lara-spec.md` for the math.

The names below load on first use (PEP 562), so torch-free modules of this package
(`kernels.native_build`, `kernels.ort_library`) import in the lean serving install, which has no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "describe_backends": "kernels.api",
    "lara_attention": "kernels.api",
    "performer_attention": "kernels.api",
    "randomized_attention": "kernels.api",
    "softmax_attention": "kernels.api",
    "chunk_means_1d": "kernels.landmarks",
    "pool_2d": "kernels.landmarks",
    "orthogonal_gaussian_projection": "kernels.reference",
}
__all__ = [
    "chunk_means_1d",
    "describe_backends",
    "lara_attention",
    "orthogonal_gaussian_projection",
    "performer_attention",
    "pool_2d",
    "randomized_attention",
    "softmax_attention",
]

if TYPE_CHECKING:
    from kernels.api import (
        describe_backends,
        lara_attention,
        performer_attention,
        randomized_attention,
        softmax_attention,
    )
    from kernels.landmarks import chunk_means_1d, pool_2d
    from kernels.reference import orthogonal_gaussian_projection


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
