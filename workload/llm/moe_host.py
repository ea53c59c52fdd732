"""The host (CPU) side of a Megatron-Core mixture-of-experts layer, which a GPU-only trace leaves out.

A dense layer's kernels are few and large: the host queues them far ahead of the GPU and its own time never
shows. A dropless MoE layer breaks that twice (Megatron-Core, megatron/core/transformer/moe/token_dispatcher.py):

- the dispatcher's preprocessing counts the tokens each expert receives, all-gathers the counts over the
  expert-parallel group and copies them to the host (the all-to-all's split sizes and the grouped GEMM's
  per-expert row counts are host-side lists). The host waits for that copy ("cuda_sync_point"
  before_ep_alltoall): everything queued before it must finish, and the GPU's queue is empty afterwards;
- from there the host issues the expert section one operator at a time: the dispatch all-to-all, the
  permutation, one GEMM launch per local expert in each grouped linear (Transformer Engine's GroupedLinear
  loops over the experts; an FP8 recipe adds a quantization launch per expert input), the activation, the
  unpermutation and the combine all-to-all. The GPU cannot run what is not issued yet, so the section takes
  at least the host's issue time; its backward (autograd issuing dgrad and wgrad per expert) likewise.

In the trace the host's issue time is a host node beside the section's GPU nodes: it starts when the section
starts (after the wait for the counts, in forward), and the section's last node waits for it. The section then
takes max(host issue time, GPU time): unchanged where experts are few and large, longer where they are many
and small. A dispatcher with a fixed capacity per expert (drop and pad) knows every size beforehand and neither
waits nor is modelled here. CUDA graphs (the recipes' moe_router/moe_preprocess scopes) capture the router and
the counting, not the expert section, whose shapes change from step to step.

The constants are host costs of the software stack, not of the GPU (public measurements, no training row):
- HOST_OP_US: one eager PyTorch operator on the GPU path, Python to cudaLaunchKernel, 5-25 us (J. Lin,
  "From PyTorch op to kernel launch", 2025; PyTorch dev-discuss "Micro-optimizations for the most micro of
  benchmarks": 4.5 us for an eager add on the CPU alone); the middle of that range.
- LAUNCH_US: one kernel launched from C++ inside an operator (a GEMM per expert in GroupedLinear):
  cudaLaunchKernel 1-3 us plus the library's cached algorithm look-up 1-5 us (same source).
- The operator counts follow the forward and backward of MoELayer with the alltoall dispatcher and TEGroupedMLP.
"""

from __future__ import annotations

# Transformer Engine's GroupedLinear (Megatron-Core's TEGroupedMLP) runs one cuBLAS GEMM per local expert,
# round-robin over a fixed set of compute streams (transformer_engine/common/util/multi_stream.cpp: 4;
# gemm/cublaslt_gemm.cu multi_stream_cublas_gemm), so at most that many experts' GEMMs run at a time.
GROUPED_GEMM_STREAMS = 4
HOST_OP_US = 10.0
LAUNCH_US = 4.0
# framework operators of the expert section besides the per-expert GEMM launches: forward = split-size
# bookkeeping, dispatch all-to-all, permutation, the two grouped linears' input splits, the fused activation
# with the routing probabilities, unpermutation, combine all-to-all, final unpermutation and residual add;
# backward = the autograd nodes of the same operators (each grouped linear's backward is one node launching
# its dgrad and wgrad GEMMs).
FORWARD_OPS = 12
BACKWARD_OPS = 14
GEMMS_FORWARD = 2  # fc1 and fc2 per local expert
GEMMS_BACKWARD = 4  # dgrad and wgrad of fc1 and fc2 per local expert


def expert_section_host_us(local_experts: int, fp8: bool, backward: bool) -> int:
    """Host time (whole us) to issue one micro-batch's expert section of one MoE layer on one rank:
    ``local_experts`` experts per rank, FP8 GEMMs (one quantization launch per GEMM input) or not."""
    ops = BACKWARD_OPS if backward else FORWARD_OPS
    launches = (GEMMS_BACKWARD if backward else GEMMS_FORWARD) * local_experts * (2 if fp8 else 1)
    return round(ops * HOST_OP_US + launches * LAUNCH_US)


def count_bytes(num_experts: int) -> int:
    """Bytes of one rank's per-expert token counts (int64), all-gathered over the expert-parallel group."""
    return 8 * num_experts
