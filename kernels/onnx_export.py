"""The ONNX side of `lara::attention`: one `com.lara::LaraAttention` node per call, with its body.

* `LaraAttention` is an ONNX function (domain `com.lara`, version 1) whose body computes the LARA eval
  forward (spec 5.4, with the algebra of `kernels/_cpu.py`) from standard opset-20 ops, in float32.
* `custom_translation_table()` maps `torch.ops.lara.attention.default` to that node for
  `torch.onnx.export(..., dynamo=True, custom_translation_table=...)`. The translation emits a plain
  node (the exporter's opset conversion would inline a function it carried itself).
* `attach_lara_function(model)` puts the function proto into `model.functions` after export: stock
  onnxruntime then inlines the body at load; without it loading fails ("... is not a registered
  function/op"). If a kernel for `com.lara::LaraAttention` (domain com.lara, since version 1) is
  registered in onnxruntime (a custom-op library via `SessionOptions.register_custom_ops_library`), that
  kernel takes precedence over the body, so a native op can replace it without re-exporting. (Not
  exercised here: the onnxruntime wheel ships no headers to build such a library.)

Node signature (all float tensors share one dtype; the body computes in float32):
  LaraAttention(q, k, v, q_landmarks, k_landmarks, key_padding_mask, noise) -> out
    q, k, v: [B, H, N, D]; q_landmarks, k_landmarks: [B, H, C, D]
    key_padding_mask: bool, [B, N] (True = padding) or [1, 1] all False for "no padding"
    noise: raw-space perturbation of the proposal means, [B or 1, H, C, D] or [1, 1, 1, 1] zeros for eval
    attribute alpha_coeff: float, lambda of the mis-opt weighting
    out: [B, H, N, D]
key_padding_mask and noise are optional in the PyTorch op. An ONNX function body cannot branch on an
omitted input in onnxruntime (inlining fails with "input ... is marked single but has an empty string",
and `Optional`/`OptionalHasElement` fail type inference on an omitted function input), so the
translation always passes them, substituting neutral broadcastable constants for the omitted ones.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxscript
import torch
from onnxscript import BOOL, FLOAT
from onnxscript import opset20 as op
from onnxscript.values import Op, Opset

DOMAIN = "com.lara"
DOMAIN_VERSION = 1
OP_NAME = "LaraAttention"
ALPHA_FLOOR = 1e-8  # same clamp as lara_serve.kernels.reference.ALPHA_FLOOR (repo practice, spec 5.3)

lara_opset = Opset(DOMAIN, DOMAIN_VERSION)


@onnxscript.script(lara_opset, default_opset=op)
def LaraAttention(  # noqa: N802 - the ONNX op name
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    q_landmarks: FLOAT,
    k_landmarks: FLOAT,
    key_padding_mask: BOOL,
    noise: FLOAT,
    alpha_coeff: float = 1.0,
) -> FLOAT:
    # -- inputs in float32; 1/sqrt(d) from the runtime head dim --
    qf = op.Cast(q, to=1)
    kf = op.Cast(k, to=1)
    vf = op.Cast(v, to=1)
    ql = op.Cast(q_landmarks, to=1)
    mu = op.Add(ql, op.Cast(k_landmarks, to=1))  # [B, H, C, D]
    w = op.Add(mu, op.Cast(noise, to=1))  # [B, H, C, D], samples (eval: noise = 0)
    d = op.Cast(op.Shape(q, start=-1), to=1)  # [1]
    scale = op.Reciprocal(op.Sqrt(d))  # [1]
    half_scale = op.Mul(op.Constant(value_float=0.5), scale)
    ws = op.Mul(w, scale)  # [B, H, C, D]
    ax_last = op.Constant(value_ints=[-1])
    ax_c = op.Constant(value_ints=[2])

    # -- padding: masked keys/queries get -inf, unless a row is fully padded (then it gives zeros) --
    valid = op.Not(key_padding_mask)  # [B, N]
    any_valid = op.ReduceMax(op.Cast(valid, to=1), ax_last, keepdims=1)  # [B, 1]
    drop = op.And(key_padding_mask, op.Greater(any_valid, op.Constant(value_float=0.0)))  # [B, N]
    drop4 = op.Unsqueeze(drop, op.Constant(value_ints=[1, 2]))  # [B, 1, 1, N]
    neg_inf = op.Constant(value_float=float("-inf"))

    # -- key pass: value summaries F_c and log-normalizers lse_c --
    k_sq = op.Unsqueeze(op.ReduceSumSquare(kf, ax_last, keepdims=0), ax_c)  # [B, H, 1, N]
    kt = op.Transpose(kf, perm=[0, 1, 3, 2])  # [B, H, D, N]
    lk = op.Sub(op.MatMul(ws, kt), op.Mul(half_scale, k_sq))  # [B, H, C, N]
    lk = op.Where(drop4, neg_inf, lk)
    m = op.ReduceMax(lk, ax_last, keepdims=1)  # [B, H, C, 1]
    p = op.Exp(op.Sub(lk, m))  # [B, H, C, N]
    s = op.ReduceSum(p, ax_last, keepdims=1)  # [B, H, C, 1]
    f = op.Div(op.MatMul(p, vf), s)  # [B, H, C, D]
    lse = op.Add(m, op.Log(s))  # [B, H, C, 1]

    # -- balance heuristic over proposals; own_c is the diagonal of lmu --
    mu_sq = op.ReduceSumSquare(mu, ax_last, keepdims=1)  # [B, H, C, 1]
    lmu = op.Sub(
        op.MatMul(ws, op.Transpose(mu, perm=[0, 1, 3, 2])),
        op.Mul(half_scale, op.Transpose(mu_sq, perm=[0, 1, 3, 2])),
    )  # [B, H, C, C]
    own = op.Sub(op.ReduceSum(op.Mul(ws, mu), ax_last, keepdims=1), op.Mul(half_scale, mu_sq))  # [B, H, C, 1]
    bh = op.Exp(op.Sub(own, op.ReduceLogSumExp(lmu, ax_last, keepdims=1)))  # [B, H, C, 1]
    bias = op.Sub(lse, own)  # [B, H, C, 1]

    # -- query pass: one matmul for log xi(q, w_c) and the query-landmark logits --
    c = op.Shape(q_landmarks, start=2, end=3)  # [1]
    proj = op.Concat(ws, op.Mul(ql, scale), axis=2)  # [B, H, 2C, D]
    lr = op.MatMul(proj, op.Transpose(qf, perm=[0, 1, 3, 2]))  # [B, H, 2C, N]
    lq, r = op.Split(lr, op.Concat(c, c, axis=0), axis=2)  # [B, H, C, N] each
    rho = op.Softmax(op.Where(drop4, neg_inf, r), axis=-1)  # [B, H, C, N], over queries
    alpha_c = op.CastLike(alpha_coeff, rho)
    corr = op.Mul(alpha_c, op.Sub(rho, op.ReduceMean(rho, ax_c, keepdims=1)))  # [B, H, C, N]
    alpha = op.Max(op.Add(bh, corr), op.Constant(value_float=ALPHA_FLOOR))  # [B, H, C, N]
    logit = op.Add(lq, bias)  # [B, H, C, N]; -||q||^2/(2 sqrt d) cancels over c
    e = op.Mul(op.Exp(op.Sub(logit, op.ReduceMax(logit, ax_c, keepdims=1))), alpha)  # [B, H, C, N]
    wt = op.Div(e, op.ReduceSum(e, ax_c, keepdims=1))  # [B, H, C, N], SNIS weights
    out = op.MatMul(op.Transpose(wt, perm=[0, 1, 3, 2]), f)  # [B, H, N, D]
    out = op.Mul(out, op.Unsqueeze(op.Cast(valid, to=1), op.Constant(value_ints=[1, 3])))  # zero padded rows
    return op.CastLike(out, q)


def _lara_schema() -> onnx.defs.OpSchema:
    """The node's schema, for the exporter's tracer only (never registered with onnx.defs).

    The translation must emit a plain node, not call the onnxscript function: the exporter's opset
    conversion inlines every model-local function it finds, which would leave a decomposed graph.
    """
    param = onnx.defs.OpSchema.FormalParameter
    floats = ("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(double)"], "float tensors")
    return onnx.defs.OpSchema(
        OP_NAME,
        DOMAIN,
        DOMAIN_VERSION,
        "LARA linear randomized attention (eval path; see kernels/onnx_export.py).",
        inputs=[
            *(param(n, "T") for n in ("q", "k", "v", "q_landmarks", "k_landmarks")),
            param("key_padding_mask", "tensor(bool)"),
            param("noise", "T"),
        ],
        outputs=[param("out", "T")],
        type_constraints=[floats],
        attributes=[
            onnx.defs.OpSchema.Attribute(
                "alpha_coeff", onnx.helper.make_attribute("alpha_coeff", 1.0), "mis-opt lambda"
            )
        ],
    )


_LARA_OP = Op(lara_opset, OP_NAME, _lara_schema())


def _translate_lara_attention(
    q,
    k,
    v,
    q_landmarks,
    k_landmarks,
    key_padding_mask=None,
    noise=None,
    alpha_coeff: float = 1.0,
    backend: str = "",
):
    """Translation of `torch.ops.lara.attention.default`: exactly one `com.lara::LaraAttention` node."""
    del backend  # a run-time choice of the PyTorch op; onnxruntime picks its own kernel
    if key_padding_mask is None:
        key_padding_mask = op.Constant(value=onnx.numpy_helper.from_array(np.zeros((1, 1), dtype=np.bool_)))
    if noise is None:
        noise = op.CastLike(op.Constant(value=onnx.numpy_helper.from_array(np.zeros((1, 1, 1, 1), np.float32))), q)
    return _LARA_OP(q, k, v, q_landmarks, k_landmarks, key_padding_mask, noise, alpha_coeff=alpha_coeff)


def custom_translation_table() -> dict:
    """`custom_translation_table` for `torch.onnx.export(..., dynamo=True)` (imports the op first)."""
    import lara_serve.kernels.op  # noqa: F401 - registers torch.ops.lara.attention

    return {torch.ops.lara.attention.default: _translate_lara_attention}


def lara_function_proto() -> onnx.FunctionProto:
    """The `com.lara::LaraAttention` function (body included) as an ONNX FunctionProto."""
    return LaraAttention.to_function_proto()


def attach_lara_function(model: onnx.ModelProto) -> onnx.ModelProto:
    """Put the LaraAttention function into `model.functions` (replacing any copy) and import its domain."""
    keep = [fn for fn in model.functions if (fn.domain, fn.name) != (DOMAIN, OP_NAME)]
    del model.functions[:]
    model.functions.extend([*keep, lara_function_proto()])
    opsets = {o.domain: o for o in model.opset_import}
    if DOMAIN not in opsets:
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    return model


def count_lara_nodes(model: onnx.ModelProto) -> int:
    """How many `com.lara::LaraAttention` nodes the main graph holds."""
    return sum(1 for n in model.graph.node if (n.domain, n.op_type) == (DOMAIN, OP_NAME))
