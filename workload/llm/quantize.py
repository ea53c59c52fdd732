"""The quantization kernels Transformer Engine runs around each low-precision GEMM of a layer: why FP8/FP4 training
is less than twice (four times) as fast as BF16 even where its GEMMs are.

A low-precision GEMM multiplies quantized copies of its operands. Each operand is made from its BF16 tensor by a
memory-bound kernel that reads it and writes the narrow copy (with its scales), once per micro-batch for the layer
input X (forward) and the output gradient dY (backward), once per iteration for the weight W (Transformer Engine
caches a weight's quantized copies across micro-batches: Megatron-Core passes is_first_microbatch). Every operand
is used twice, so two copies are written: X by fprop and wgrad, dY by dgrad and wgrad, W by fprop and dgrad.
What a copy costs depends on the recipe (Megatron-Core's --fp8-recipe / --fp4-recipe):

- ``delayed`` (per-tensor scaling from the amax history; TE's default): one fused cast-transpose kernel reads the
  tensor and writes the FP8 copy and its transpose (Hopper's FP8 GEMMs take only the TN layout), recording the
  amax for the next step's scale.
- ``tensorwise`` (per-tensor current scaling, NeMo/Megatron-Bridge's fp8_cs): the scale must come from this
  tensor's own amax, so an amax kernel reads it first (and a small kernel turns the amax into the scale), then the
  cast-transpose reads it again.
- ``mxfp8`` (Blackwell block scaling, 1 x 32 blocks with E8M0 scales): one kernel reads the tensor and writes a
  row-wise and a column-wise quantized copy (the blocks run along the GEMM's K, which differs between the two
  uses) with a scale byte per 32 elements each; the block amax needs no earlier pass.
- ``nvfp4`` (1 x 16 blocks with FP8 scales under a per-tensor FP32 scale; 16 x 16 blocks for weights; a random
  Hadamard transform on wgrad operands): an amax kernel (the per-tensor scale, with the transformed amax) reads
  the tensor, then one kernel writes the row-wise and column-wise FP4 copies (half a byte per element) with a
  scale byte per 16 elements each.

A grouped GEMM's operands (Transformer Engine's GroupedLinear, one GEMM per local expert) are quantized expert by
expert: its split_quantize runs each recipe's kernels once per expert's rows (transformer_engine/pytorch/csrc/
extensions/cast.cpp, multi_tensor_quantize_impl), except for delayed scaling (one fused multi-tensor cast-transpose)
and NVFP4 where the operand's inner dimension is a multiple of 128 (one fused split-quantize kernel); the experts'
weights are separate tensors, quantized one by one under every recipe. The bytes are the same; each expert's kernel
pays its own launch (the node's ``kernel_count``).

The kernels are timed by the kernel model's ``quantize`` class (memory-bound: bytes at a fraction of HBM
bandwidth plus a launch; NVFP4's, dtype fp4, by its own slower class, which includes the Hadamard transform).
Left out: Transformer Engine's fusion of a norm or activation with the cast of its output (LayerNormLinear,
LayerNormMLP: the cast is timed as its own kernel), Blackwell's per-tensor FP8 GEMMs taking any layout (the
transposed copy is still written), the amax all-reduces of current scaling over tensor-parallel ranks and of
delayed scaling once per forward, and the amax-history update.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from compute.shapes import OpShape
from workload.llm.costs import Kernel, Matmul

RECIPES = ("delayed", "tensorwise", "mxfp8", "nvfp4")
SOURCE_BYTES = 2  # the BF16 tensor each operand is quantized from
QUANTIZE_FLOPS = 2  # per element: an absolute-value maximum and a scaled conversion


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass over an operand: bytes read and written per element of the BF16 tensor, in ``kernels`` kernels."""

    label: str
    read: float
    written: float
    kernels: int = 1


# Per recipe, the kernels that make one operand's two quantized copies.
PASSES: dict[str, tuple[Pass, ...]] = {
    "delayed": (Pass("cast_transpose", SOURCE_BYTES, 2 * 1.0),),
    # the amax, then a kernel turning it into the scale (Float8CurrentScalingQuantizer: nvte_compute_amax,
    # nvte_compute_scale_from_amax), then the cast
    "tensorwise": (Pass("amax", SOURCE_BYTES, 0.0, kernels=2), Pass("cast_transpose", SOURCE_BYTES, 2 * 1.0)),
    "mxfp8": (Pass("quantize", SOURCE_BYTES, 2 * (1.0 + 1 / 32)),),
    "nvfp4": (Pass("amax", SOURCE_BYTES, 0.0), Pass("quantize", SOURCE_BYTES, 2 * (0.5 + 1 / 16))),
}


def operand_kernels(name: str, elements: int, recipe: str, launches: int = 1) -> tuple[Kernel, ...]:
    """The kernels quantizing one operand of ``elements`` BF16 values under ``recipe`` (named ``name``_<pass>), each
    pass ``launches`` kernels in a row (one per expert of a grouped GEMM)."""
    return _kernels(name, elements, recipe, launches)


def launches(gemm: Matmul, operand: str, recipe: str) -> int:
    """Kernels per pass quantizing ``gemm``'s ``operand`` ("input", "grad", "weight"): one per expert of a grouped
    GEMM run one GEMM per expert, unless the recipe fuses the experts' activations (delayed scaling; NVFP4 with a
    128-multiple inner dimension); one for a grouped GEMM run as one kernel (the fused grouped MLP's grouped
    tensors)."""
    if gemm.weights <= 1 or not gemm.streams:  # one kernel for all experts: Transformer Engine's fused grouped MLP
        return 1
    if operand == "weight":
        return gemm.weights
    inner = gemm.k if operand == "input" else gemm.n
    fused = recipe == "delayed" or (recipe == "nvfp4" and inner % 128 == 0)
    return 1 if fused else gemm.weights


@lru_cache(maxsize=4096)
def _kernels(name: str, elements: int, recipe: str, launches: int) -> tuple[Kernel, ...]:
    if elements <= 0:
        return ()
    dtype = "fp4" if recipe == "nvfp4" else "fp8"  # the precision it casts to
    return tuple(Kernel(f"{name}_{p.label}", "elementwise", elements * QUANTIZE_FLOPS,
                        round(elements * (p.read + p.written)),
                        OpShape("quantize", dtype, kernels=launches * p.kernels)) for p in PASSES[recipe])


def input_elements(gemm: Matmul) -> int:
    """X of ``gemm`` (all its tokens by its K)."""
    return gemm.tokens * gemm.k


def grad_elements(gemm: Matmul) -> int:
    """dY of ``gemm`` (all its tokens by its N)."""
    return gemm.tokens * gemm.n


def weight_elements(gemm: Matmul) -> int:
    """W of ``gemm`` (every expert's, for a grouped GEMM)."""
    return gemm.weights * gemm.k * gemm.n
