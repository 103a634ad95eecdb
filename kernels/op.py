"""`lara::attention`: LARA as one PyTorch custom op, so compile/export/ONNX see a single node.

The op dispatches to a backend (`kernels/dispatch.py`) at run time. Autograd through the op recomputes
the forward with the differentiable PyTorch path and back-propagates through it; eager training avoids
the op altogether (see `lara_serve.kernels.api.lara_attention`), so the recompute only happens under compile.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lara_serve.kernels._cpu import lara_forward_cpu
from lara_serve.kernels.dispatch import select_backend
from lara_serve.kernels.inputs import LaraInputs


@torch.library.custom_op("lara::attention", mutates_args=())
def lara_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_landmarks: Tensor,
    k_landmarks: Tensor,
    key_padding_mask: Tensor | None,
    noise: Tensor | None,
    alpha_coeff: float,
    backend: str,
) -> Tensor:
    inputs = LaraInputs(q, k, v, q_landmarks, k_landmarks, key_padding_mask, alpha_coeff, noise)
    return select_backend(inputs, backend or None).forward(inputs)


@lara_attention_op.register_fake
def _(q, k, v, q_landmarks, k_landmarks, key_padding_mask, noise, alpha_coeff, backend):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))  # [B, H, N, Dv], q's dtype


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, ql, kl, mask, noise, alpha_coeff, _ = inputs
    ctx.save_for_backward(q, k, v, ql, kl, mask, noise)
    ctx.alpha_coeff = alpha_coeff


def _backward(ctx, grad_out: Tensor):
    q, k, v, ql, kl, mask, noise = ctx.saved_tensors
    diff = [t.detach().requires_grad_(True) for t in (q, k, v, ql, kl)]
    with torch.enable_grad():
        out = lara_forward_cpu(LaraInputs(*diff, mask, ctx.alpha_coeff, noise))
    grads = torch.autograd.grad(out, diff, grad_out, allow_unused=True)
    return (*grads, None, None, None, None)


lara_attention_op.register_autograd(_backward, setup_context=_setup_context)
