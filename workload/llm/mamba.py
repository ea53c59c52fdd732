"""The kernels of a Mamba-2 mixer on one rank (Megatron-Core's MambaMixer, the SSD kernels of mamba_ssm).

Forward, in order: the pre-norm (fused into in_proj's module), in_proj (the hidden states to z, x, B, C and dt;
column-parallel, heads and groups split over tensor-parallel ranks), the causal depthwise convolution with its SiLU
over x, B and C, the chunked state-space scan (SSD, gated by SiLU(z) in its last kernel), the RMSNorm over each
group of channels and out_proj (row-parallel). The scan splits each sequence into chunks of ``mamba_chunk`` tokens
and runs, per chunk: the decays' cumulative sum (dt's softplus and A dt, per head), C B^T per group (a chunk x chunk
matrix through the state dimension), each head's chunk state B^T x (state x head dim), the states passed from chunk
to chunk (a short sequential pass over the chunks in fp32), and each head's output, the masked, decayed C B^T times
x plus C times the incoming state, gated by SiLU(z) (one kernel, both products into one accumulator). The three
products are small batched GEMMs, one per chunk and head (or group); Triton runs them, with the passes over the
decays and the states, at a small fraction of the GPU's bandwidth, far from its tensor-core peak: the kernel model
times every scan kernel by its bytes in the ``scan`` class (compute/kernel_params.py: SCAN_BANDWIDTH_FRACTION,
fitted on published Triton timings by benchmarks/ssd_kernels.py). The RMSNorm after the scan (mamba_ssm's gated
norm) runs without the gate: Megatron-Core calls it without z.

Backward (mamba_ssm's memory-efficient path, which Megatron-Core trains with): the forward keeps only in_proj's
output and the scan's ungated output, so it first runs the convolution, the cumulative sum, C B^T, the chunk states
and their passing again, then the gradient kernels: the gate's (z and the output gradient through SiLU), the
transposed products (each product's two operand gradients, as a GEMM's input and weight gradients), the states'
passing backward, the decays' and the convolution's.

Sources: Megatron-LM megatron/core/ssm/mamba_mixer.py (mamba_split_conv1d_scan_combined, chunk size 128) and
state-spaces/mamba mamba_ssm/ops/triton/ssd_combined.py, read for the kernel sequence (facts, no code taken).
"""

from __future__ import annotations

import math
from dataclasses import replace

from compute.shapes import SCAN_CLASS, OpShape
from workload.llm import costs
from workload.llm.costs import Matmul
from workload.llm.model import ModelConfig

FP32_BYTES = 4
CUMSUM_FLOPS = 6  # per head and token: dt + dt_bias, softplus (exp, log1p), A dt, the running sum
STATE_PASSING_FLOPS = 2  # per state element and chunk: decay times the carried state, plus the chunk's own
GATED_NORM_FLOPS = 4  # per channel: square, sum, scale, weight
GATE_BACKWARD_PASSES = 6


class MambaMixer:
    """A Mamba-2 mixer's kernels over ``tokens`` tokens (``batch`` sequences of ``seq_len``) on one of ``tp``
    tensor-parallel ranks; ``low``: the precision of the projections' GEMMs (in_proj's, out_proj's), "" for the
    model's dtype (the scan stays in it)."""

    def __init__(self, m: ModelConfig, batch: int, seq_len: int, tp: int, low: tuple[str, str], grad_bytes: int
                 ) -> None:
        d, h = m.dtype_bytes, m.hidden_size
        heads, groups = m.mamba_heads // tp, m.mamba_groups // tp
        p, n, q = m.mamba_head_dim, m.mamba_state_dim, m.mamba_chunk
        tokens = batch * seq_len
        inner, bc = heads * p, 2 * groups * n
        self.in_proj = Matmul("mamba_in", tokens, h, 2 * inner + bc + heads, d, dtype=low[0], grad_bytes=grad_bytes)
        self.out_proj = Matmul("mamba_out", tokens, inner, h, d, dtype=low[1], grad_bytes=grad_bytes)
        channels = inner + bc  # x, B and C through the convolution
        self.conv = costs.elementwise("mamba_conv", tokens * channels, 2 * m.mamba_conv_width + 4, 1, 1, d)
        chunks = batch * math.ceil(seq_len / q)
        cumsum = costs.elementwise("ssd_cumsum", tokens * heads, CUMSUM_FLOPS, 1, 2, FP32_BYTES)
        # C B^T per chunk and group: (chunk x state) @ (state x chunk)
        chunk_cb = Matmul("ssd_chunk_cb", q * chunks * groups, n, q, d, weights=chunks * groups)
        # B^T x per chunk and head: (state x chunk) @ (chunk x head dim)
        chunk_state = Matmul("ssd_chunk_state", n * chunks * heads, q, p, d, weights=chunks * heads)
        passing = costs.elementwise("ssd_state_passing", chunks * heads * n * p, STATE_PASSING_FLOPS, 1, 1, FP32_BYTES)
        # the output per chunk and head: [masked decayed C B^T | C] @ [x ; incoming state]
        chunk_scan = Matmul("ssd_chunk_scan", q * chunks * heads, q + n, p, d, weights=chunks * heads)
        # the gate's backward: reads x (to rebuild the ungated output), z, the output and its gradient; writes z's
        # gradient and the gated output's
        gate = costs.tensor_passes("ssd_gate", tokens * inner, (0, GATE_BACKWARD_PASSES), d)[1]
        self.gated_norm = costs.elementwise("mamba_gated_norm", tokens * inner, GATED_NORM_FLOPS, 1, 1, d,
                                            op_class="norm")
        first = [cumsum[0], chunk_cb.forward(), chunk_state.forward(), passing[0]]
        self.forward = [self.conv[0], *map(_scan, [*first, chunk_scan.forward()])]
        self.recompute = [self.conv[0], *map(_scan, first)]
        self.backward = [*map(_scan, [gate, chunk_scan.dgrad(), chunk_scan.wgrad(), passing[1], chunk_state.dgrad(),
                                      chunk_state.wgrad(), chunk_cb.dgrad(), chunk_cb.wgrad(), cumsum[1]]),
                         self.conv[1]]

    @property
    def scan_forward(self) -> list[costs.Kernel]:
        """The SSD scan's forward kernels (mamba_chunk_scan_combined's five)."""
        return self.forward[1:]


def _scan(kernel: costs.Kernel) -> costs.Kernel:
    """One of the scan's kernels: timed as memory-bound in the scan class (compute/kernel_params.py), whatever its
    arithmetic; its FLOPs and bytes as counted."""
    return replace(kernel, category=SCAN_CLASS,
                   shape=OpShape(SCAN_CLASS, kernel.shape.dtype if kernel.shape else "bf16"))
