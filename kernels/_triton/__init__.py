"""Triton kernels (CUDA; CPU only under TRITON_INTERPRET=1, for tests). See `lara.py`."""

from lara_serve.kernels._triton.lara import LaunchConfig, lara_forward_triton

__all__ = ["LaunchConfig", "lara_forward_triton"]
