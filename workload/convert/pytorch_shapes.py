"""The operator shape of a PyTorch operator (compute/shapes.py), from its ATen name and recorded input shapes, so
converted traces can be timed by ``--compute-model kernels``.

Only what the record states is used: matrix products (mm, bmm, matmul, addmm, baddbmm, linear) become GEMMs,
scaled-dot-product attention (its flash, memory-efficient and cuDNN kernels, forward and backward) becomes
attention, and a few families of memory-bound operators get their class. Anything else, or a product whose
shapes are missing, gets no shape: the kernel model then estimates it from num_ops and tensor_size.
"""

from __future__ import annotations

import math
import re

from compute.shapes import AttentionShape, GemmShape, OpShape
from workload.convert.pytorch_ops import _named_args, _shape
from workload.convert.pytorch_trace import Argument, HostNode

# The precision of a tensor type string, as PyTorch's execution trace writes it ("Tensor(c10::BFloat16)").
DTYPES = {"c10::bfloat16": "bf16", "c10::half": "fp16", "float": "fp32", "c10::float8_e4m3fn": "fp8",
          "c10::float8_e5m2": "fp8", "c10::float8_e4m3fnuz": "fp8", "c10::float8_e5m2fnuz": "fp8"}
CLASSES = {
    "norm": ("layer_norm", "native_layer_norm", "native_layer_norm_backward", "rms_norm", "_fused_rms_norm",
             "group_norm", "native_group_norm", "batch_norm", "native_batch_norm"),
    "softmax": ("softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data",
                "_log_softmax_backward_data"),
    "activation": ("gelu", "gelu_backward", "silu", "silu_backward", "relu", "threshold_backward", "sigmoid",
                   "tanh", "glu", "swiglu"),
    "embedding": ("embedding", "embedding_backward", "embedding_dense_backward"),
    "loss": ("cross_entropy_loss", "nll_loss", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward"),
    "optimizer": ("_fused_adam_", "_fused_adamw_", "_fused_adam", "_fused_adamw"),
    "elementwise": ("add", "add_", "mul", "mul_", "sub", "sub_", "div", "div_", "copy_", "fill_", "zero_",
                    "addcmul_", "addcdiv_", "lerp_", "neg", "exp", "pow", "sqrt", "rsqrt", "sum", "mean", "cat",
                    "stack", "clone", "_to_copy", "contiguous", "where", "masked_fill", "masked_fill_", "dropout",
                    "native_dropout", "ones", "zeros", "full", "ones_like", "zeros_like", "full_like", "arange"),
}
CLASS_OF = {name: cls for cls, names in CLASSES.items() for name in names}


def _dtype(args: list[Argument]) -> str:
    for a in args:
        m = re.search(r"Tensor\(([^)]*)\)", a.type)
        if m:
            return DTYPES.get(m.group(1).lower(), "bf16")
    return "bf16"


def _gemm(base: str, node: HostNode) -> GemmShape | None:
    ins = node.inputs
    first = 1 if base in ("addmm", "baddbmm", "addbmm") else 0
    a, b = _shape(ins, first), _shape(ins, first + 1)
    if not a or not b:
        return None
    if base == "linear":  # x (..., K) @ w (N, K)^T
        return GemmShape(math.prod(a[:-1]), b[0], a[-1]) if len(b) == 2 else None
    if len(a) < 2 or len(b) < 1:
        return None
    n = b[-1] if len(b) >= 2 else 1
    if len(b) == 2 and len(a) > 2 and base == "matmul":  # a batch of rows times one matrix: one GEMM
        return GemmShape(math.prod(a[:-1]), n, a[-1])
    batch = max(math.prod(a[:-2]), math.prod(b[:-2]), 1)
    return GemmShape(a[-2], n, a[-1], batch)


def _attention(base: str, node: HostNode) -> AttentionShape | None:
    backward = base.endswith("_backward")
    first = 1 if backward else 0  # backward kernels take the output gradient first
    q, k = _shape(node.inputs, first), _shape(node.inputs, first + 1)
    if not q or not k or len(q) < 3 or len(k) < 3:
        return None
    causal_arg = _named_args(node).get("is_causal")
    causal = bool(causal_arg.value) if causal_arg is not None and isinstance(causal_arg.value, bool) else False
    return AttentionShape(batch=math.prod(q[:-3]) or 1, heads=q[-3], kv_heads=k[-3], head_dim=q[-1], seq_q=q[-2],
                          seq_kv=k[-2], causal=causal, backward=backward, flash=True)


def op_shape(node: HostNode) -> OpShape | None:
    """The operator class and shape the record gives ``node``, or None."""
    base = re.sub(r"\..*$", "", node.name.split("::", 1)[-1])
    dtype = _dtype(node.inputs)
    if base in ("mm", "bmm", "matmul", "addmm", "baddbmm", "linear"):
        g = _gemm(base, node)
        return OpShape("gemm", dtype, gemm=g) if g else None
    if "scaled_dot_product" in base:
        a = _attention(base, node)
        return OpShape("attention", dtype, attention=a) if a else None
    cls = CLASS_OF.get(base)
    return OpShape(cls, dtype) if cls else None
