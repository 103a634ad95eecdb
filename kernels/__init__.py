"""LARA and baseline attention kernels. See `shared/docs/lara-spec.md` for the math.

The names below load on first use (PEP 562), so torch-free modules of this package
(`lara_serve.kernels.native_build`, `lara_serve.kernels.ort_library`) import in the lean serving install, which has no torch.
"""

from __future__ import annotations

if __name__ == "kernels":  # imported by the folder's bare name from the repository root: not ours to answer
    from lara_serve._package import defer_to_installed

    defer_to_installed(__name__, __file__)


from typing import TYPE_CHECKING

from lara_serve._package import lazy_exports

_HOMES = {
    "describe_backends": "lara_serve.kernels.api",
    "lara_attention": "lara_serve.kernels.api",
    "performer_attention": "lara_serve.kernels.api",
    "randomized_attention": "lara_serve.kernels.api",
    "softmax_attention": "lara_serve.kernels.api",
    "chunk_means_1d": "lara_serve.kernels.landmarks",
    "pool_2d": "lara_serve.kernels.landmarks",
    "orthogonal_gaussian_projection": "lara_serve.kernels.reference",
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
    from lara_serve.kernels.api import (
        describe_backends,
        lara_attention,
        performer_attention,
        randomized_attention,
        softmax_attention,
    )
    from lara_serve.kernels.landmarks import chunk_means_1d, pool_2d
    from lara_serve.kernels.reference import orthogonal_gaussian_projection

__getattr__ = lazy_exports(__name__, _HOMES)
