"""The operator shapes the kernel compute model times, and the Chakra attributes that carry them.

This is the whole contract between a trace and ``--compute-model kernels``: a COMP_NODE may carry

- ``op_class`` (string): gemm | attention | elementwise | norm | softmax | activation | embedding | loss |
  optimizer | quantize (a low-precision cast: amax, scale, cast and transpose of a GEMM operand, its dtype the
  precision it casts to) | scan (a kernel of the Mamba-2 SSD scan, timed by its bytes at a fraction of the
  element-wise bandwidth); another class is timed as if it had none;
- ``dtype`` (string): fp32 | tf32 | bf16 | fp16 | fp8 | fp4 (the math precision; absent = bf16; fp4 is NVFP4,
  half a byte per element);
- for ``gemm``: ``gemm_m``, ``gemm_n``, ``gemm_k`` and ``gemm_batch`` (a batched or grouped GEMM of that many
  independent (m x k) @ (k x n) products; absent = 1), ``gemm_streams`` (a grouped GEMM run as one kernel per
  product, that many at a time on as many streams, as Transformer Engine's GroupedLinear runs its experts;
  absent or 0 = one batched kernel), ``gemm_accumulate_bytes`` (the result is added into an existing matrix of
  that many bytes per element, read and written, as Megatron's gradient accumulation fusion adds a weight
  gradient into its main gradient; absent or 0 = the result written once in ``dtype``);
- for ``attention``: ``attn_batch``, ``attn_heads``, ``attn_kv_heads``, ``attn_head_dim``, ``attn_seq_q``,
  ``attn_seq_kv`` (keys each query block sees; context parallelism makes it differ from ``attn_seq_q``),
  ``attn_causal`` and ``attn_backward`` (bools), ``attn_flash`` (bool, absent = true: a fused kernel),
  ``attn_window`` (sliding-window attention: the keys a query sees, itself included; absent or 0 = all);
- for a memory-bound class: ``kernel_count`` (the node's work as that many kernels launched one after another,
  each with its launch cost, as Transformer Engine quantizes each expert's share of a grouped GEMM operand;
  absent = 1);
- ``num_ops`` and ``tensor_size`` as ASTRA-sim reads them (FLOPs and bytes), which memory-bound classes and
  the optimizer are timed from, and which nodes without a class fall back to.

Kept in ``compute/`` (not in the generator) because converters and hand-written traces speak it too; the
generator's ``workload/llm/costs.py`` builds these shapes and ``workload/llm/emit.py`` writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SCAN_CLASS = "scan"  # a Mamba-2 SSD scan kernel: timed by its bytes, derived from the element-wise class
OP_CLASSES = ("gemm", "attention", "elementwise", "norm", "softmax", "activation", "embedding", "loss", "optimizer",
              "quantize", SCAN_CLASS)
MATH_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")  # the precisions a device states a peak for
# block-scaled formats a GEMM may name instead of its math precision: they run at that precision's peak, at an
# efficiency of their own where the device file gives one (Blackwell's MXFP8 GEMMs are ~5% slower than per-tensor FP8)
MXFP8 = "mxfp8"
BLOCK_SCALED_MATH = {MXFP8: "fp8"}
DTYPES = (*MATH_DTYPES, *BLOCK_SCALED_MATH)
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5, MXFP8: 1}
DEFAULT_DTYPE = "bf16"


def math_precision(dtype: str) -> str:
    """The math precision ``dtype`` runs in: itself, or a block-scaled format's element precision (mxfp8 -> fp8)."""
    return BLOCK_SCALED_MATH.get(dtype, dtype)


def dtype_for_bytes(dtype_bytes: int) -> str:
    """The usual math precision of ``dtype_bytes``-wide values (2 -> bf16, 1 -> fp8, 4 -> fp32)."""
    return {1: "fp8", 2: "bf16", 4: "fp32"}.get(dtype_bytes, DEFAULT_DTYPE)


# Every attribute the shapes below write (``attributes()``), as whole numbers and as flags: what a trace reader must
# carry from a node to ``shape_from_attributes`` (a name missing here is a shape lost on the way).
SHAPE_INT_ATTRIBUTES = ("gemm_m", "gemm_n", "gemm_k", "gemm_batch", "gemm_streams", "gemm_accumulate_bytes",
                        "attn_batch", "attn_heads", "attn_kv_heads", "attn_head_dim", "attn_seq_q", "attn_seq_kv",
                        "attn_window", "kernel_count")
SHAPE_BOOL_ATTRIBUTES = ("attn_causal", "attn_backward", "attn_flash")


@dataclass(frozen=True, slots=True)
class GemmShape:
    """``batch`` independent products of an (m x k) by a (k x n) matrix: one batched kernel, or (``streams`` > 0)
    one kernel per product, ``streams`` of them running at a time. ``accumulate_bytes`` > 0: each product is added
    into an (m x n) matrix of that element width (read and written) instead of written once."""

    m: int
    n: int
    k: int
    batch: int = 1
    streams: int = 0
    accumulate_bytes: int = 0

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def attributes(self) -> list[tuple[str, Any]]:
        return [("gemm_m", self.m), ("gemm_n", self.n), ("gemm_k", self.k), ("gemm_batch", self.batch)] + (
            [("gemm_streams", self.streams)] if self.streams else []) + (
            [("gemm_accumulate_bytes", self.accumulate_bytes)] if self.accumulate_bytes else [])


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """A fused (FlashAttention-style) attention kernel: ``seq_q`` queries per sequence against ``seq_kv`` keys,
    ``heads`` query heads sharing ``kv_heads`` key/value heads of ``head_dim``."""

    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    seq_q: int
    seq_kv: int
    causal: bool = True
    backward: bool = False
    flash: bool = True
    window: int = 0  # sliding-window attention: keys a query sees (itself included); 0 = every earlier key

    @property
    def pairs(self) -> int:
        """(query, key) pairs computed per head and sequence: a causal mask keeps the lower triangle of the
        square whose last ``seq_q`` rows this kernel owns (the whole triangle when seq_q == seq_kv); a window
        keeps the last ``window`` keys of each query."""
        if not self.causal:
            return self.seq_q * self.seq_kv
        # queries are the last seq_q positions of seq_kv keys: query j (0-based) sees seq_kv - seq_q + j + 1 keys
        offset = max(self.seq_kv - self.seq_q, 0)
        full = self.seq_q * offset + self.seq_q * (self.seq_q + 1) // 2
        if not self.window:
            return full
        # the query at position p (0-based) loses max(0, p + 1 - window) keys: 1, 2, ... up to the last query's
        last, before = max(offset + self.seq_q - self.window, 0), max(offset - self.window, 0)
        return full - last * (last + 1) // 2 + before * (before + 1) // 2

    @property
    def flops(self) -> int:
        """QK^T and AV (2 x head_dim FLOPs each per pair); backward recomputes nothing extra but runs
        dQ, dK, dV and dP: 2.5x forward's matmul work (as FlashAttention counts it)."""
        forward = 4 * self.head_dim * self.heads * self.batch * self.pairs
        return forward * 5 // 2 if self.backward else forward

    def attributes(self) -> list[tuple[str, Any]]:
        return [("attn_batch", self.batch), ("attn_heads", self.heads), ("attn_kv_heads", self.kv_heads),
                ("attn_head_dim", self.head_dim), ("attn_seq_q", self.seq_q), ("attn_seq_kv", self.seq_kv),
                ("attn_causal", self.causal), ("attn_backward", self.backward), ("attn_flash", self.flash)] + (
                    [("attn_window", self.window)] if self.window else [])


@dataclass(frozen=True, slots=True)
class OpShape:
    """What the kernel model knows of one compute node: its class, precision, and shape where it has one."""

    op_class: str
    dtype: str = DEFAULT_DTYPE
    gemm: GemmShape | None = None
    attention: AttentionShape | None = None
    kernels: int = 1  # a memory-bound node's work as that many kernels, one after another

    def attributes(self) -> list[tuple[str, Any]]:
        """The Chakra attributes that carry this shape (see the module docstring)."""
        out: list[tuple[str, Any]] = [("op_class", self.op_class), ("dtype", self.dtype)]
        if self.gemm is not None:
            out += self.gemm.attributes()
        if self.attention is not None:
            out += self.attention.attributes()
        if self.kernels > 1:
            out.append(("kernel_count", self.kernels))
        return out


GEMM_KEYS = ("gemm_m", "gemm_n", "gemm_k")
ATTENTION_KEYS = ("attn_batch", "attn_heads", "attn_head_dim", "attn_seq_q")


def shape_from_attributes(attrs: Mapping[str, Any]) -> tuple[OpShape | None, str]:
    """The shape a node's attributes describe, or (None, why not) when they describe none usable."""
    op_class = attrs.get("op_class")
    if not isinstance(op_class, str) or not op_class:
        return None, "no op_class attribute"
    op_class = op_class.lower()
    dtype = str(attrs.get("dtype") or DEFAULT_DTYPE).lower()
    if dtype not in DTYPE_BYTES:
        return None, f"dtype {dtype!r} is not one of {', '.join(DTYPES)}"
    if op_class == "gemm":
        missing = [k for k in GEMM_KEYS if not _positive(attrs.get(k))]
        if missing:
            return None, f"gemm without positive {', '.join(missing)}"
        batch, streams = attrs.get("gemm_batch", 1), attrs.get("gemm_streams", 0)
        accumulate = attrs.get("gemm_accumulate_bytes", 0)
        gemm = GemmShape(int(attrs["gemm_m"]), int(attrs["gemm_n"]), int(attrs["gemm_k"]),
                         int(batch) if _positive(batch) else 1, int(streams) if _positive(streams) else 0,
                         int(accumulate) if _positive(accumulate) else 0)
        return OpShape("gemm", dtype, gemm=gemm), ""
    if op_class == "attention":
        missing = [k for k in ATTENTION_KEYS if not _positive(attrs.get(k))]
        if missing:
            return None, f"attention without positive {', '.join(missing)}"
        heads, seq_q = int(attrs["attn_heads"]), int(attrs["attn_seq_q"])
        kv_heads, seq_kv = attrs.get("attn_kv_heads", heads), attrs.get("attn_seq_kv", seq_q)
        attention = AttentionShape(
            int(attrs["attn_batch"]), heads, int(kv_heads) if _positive(kv_heads) else heads,
            int(attrs["attn_head_dim"]), seq_q, int(seq_kv) if _positive(seq_kv) else seq_q,
            causal=bool(attrs.get("attn_causal", True)), backward=bool(attrs.get("attn_backward", False)),
            flash=bool(attrs.get("attn_flash", True)),
            window=int(attrs["attn_window"]) if _positive(attrs.get("attn_window")) else 0)
        return OpShape("attention", dtype, attention=attention), ""
    if op_class not in OP_CLASSES:
        return None, f"op_class {op_class!r} is not one of {', '.join(OP_CLASSES)}"
    count = attrs.get("kernel_count", 1)
    return OpShape(op_class, dtype, kernels=int(count) if _positive(count) else 1), ""


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
