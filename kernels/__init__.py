"""LARA and baseline attention kernels. See `shared/docs/lara-spec.md` for the math.

The names below load on first use (PEP 562), so torch-free modules of this package
(`lara_serve.kernels.native_build`, `lara_serve.kernels.ort_library`) import in the lean serving install, which has no torch.
"""

from __future__ import annotations

if __name__ == "kernels":  # imported by the folder's bare name from the repository root: not ours to answer
    from lara_serve._package import defer_to_installed

    defer_to_installed(__name__, __file__)


from lara_serve._package import lazy_exports

_EXPORTS = {
    "lara_serve.kernels.api": (
        "describe_backends", "lara_attention", "performer_attention", "randomized_attention", "softmax_attention"
    ),
    "lara_serve.kernels.landmarks": ("chunk_means_1d", "pool_2d"),
    "lara_serve.kernels.reference": ("orthogonal_gaussian_projection",),
}  # fmt: skip

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
