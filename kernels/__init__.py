"""LARA and baseline attention kernels. See `shared/docs/lara-spec.md` for the math."""

from kernels.api import (
    describe_backends,
    lara_attention,
    performer_attention,
    randomized_attention,
    softmax_attention,
)
from kernels.landmarks import chunk_means_1d, pool_2d
from kernels.reference import orthogonal_gaussian_projection

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
