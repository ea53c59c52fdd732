"""The attention core (the fused, FlashAttention-style kernel), alone or over context-parallel ranks.

Context parallelism splits every sequence into 2 x cp chunks and gives rank i chunks i and 2cp - 1 - i, so every
rank has the same share of the causal work (Megatron-Core with Transformer Engine). ``cp_comm_type``:

- p2p (Megatron's default): ring attention. Forward: cp steps; step 0 attends the local queries to the local
  keys (causal), each later step to the key/value block received from the previous rank while the next block
  travels on (cp - 1 sends of the K/V block, each overlapping a step's kernel), then a correction kernel merges the
  partial results. Backward: cp steps again; the K/V blocks travel as in the forward and each block's K/V gradient
  travels with it and returns to its owner (cp - 1 K/V and cp K/V-gradient sends).
- all_gather: the K/V blocks are all-gathered before the kernel (forward and again in the backward), and the K/V
  gradients reduce-scattered after the backward kernel.
- a2a (Ulysses): all-to-all from sequence to head sharding before the kernel (Q, K, V) and back after it (O);
  the backward runs the reverse all-to-alls.

Per rank, the query/key pairs computed are n(s + 1) per head and sequence (n = s / 2cp), exactly 1/cp of the
causal s(s + 1)/2 (a2a: the whole causal square for heads / cp heads), so FLOP totals equal the unsplit run's.
"""

from __future__ import annotations

from compute.shapes import AttentionShape, OpShape, dtype_for_bytes
from workload.llm import costs
from workload.llm.costs import Kernel
from workload.llm.model import ModelConfig
from workload.llm.plan import ParallelPlan
from workload.llm.program import Program
from workload.llm.sizes import StageSizes
from workload.schema import CollectiveType

AG, RS, A2A = CollectiveType.ALL_GATHER, CollectiveType.REDUCE_SCATTER, CollectiveType.ALL_TO_ALL
CORRECTION_FLOPS = 4  # per output element and step: rescale by the running max, add (estimate)


def _attention_kernel(name: str, shape: AttentionShape, size_bytes: int, dtype: str) -> Kernel:
    """A fused attention kernel of ``shape`` (its (query, key) pairs give the FLOPs, as costs.attention counts)."""
    flops = 2 * 2 * shape.head_dim * shape.heads * shape.batch * shape.pairs
    if shape.backward:
        flops *= costs.BACKWARD_FACTOR
    return Kernel(name, "attention", flops, size_bytes, OpShape("attention", dtype, attention=shape))


class Attention:
    """Adds the attention core's forward and backward (with its context-parallel communication)."""

    def __init__(self, program: Program, sizes: StageSizes, model: ModelConfig, plan: ParallelPlan) -> None:
        self.prog, self.z, self.cp = program, sizes, plan.cp
        self.kind = plan.cp_comm_type if plan.cp > 1 else "none"
        d, z = model.dtype_bytes, sizes
        b, t = z.batch, z.tokens  # t = b x s / cp query tokens per rank
        self.q_bytes = t * z.heads * z.head_dim * d
        self.kv_bytes = 2 * t * z.kv_heads * z.head_dim * d  # this rank's K and V
        dtype = sizes.attention_dtype or dtype_for_bytes(d)
        flash = sizes.flash

        def shape(seq_q: int, seq_kv: int, causal: bool, backward: bool) -> AttentionShape:
            return AttentionShape(b, z.heads, z.kv_heads, z.head_dim, seq_q, seq_kv, causal, backward, flash)

        if self.kind == "p2p":
            n = model.seq_len // (2 * plan.cp)
            fwd_bytes = 2 * self.q_bytes + self.kv_bytes
            bwd_bytes = 4 * self.q_bytes + 2 * self.kv_bytes
            # step 0: the two local chunks, causal (n(2n + 1) pairs); later steps: a whole block against half of
            # the other (the queries of both chunks against an earlier rank's first chunk, or the second chunk
            # against both of a later rank's): 2n^2 pairs, no mask
            steps = [(2 * n, True)] + [(n, False)] * (plan.cp - 1)
            self.step_kernels = [
                (_attention_kernel("attention", shape(2 * n, kv, causal, False), fwd_bytes, dtype),
                 _attention_kernel("attention_bwd", shape(2 * n, kv, causal, True), bwd_bytes, dtype))
                for kv, causal in steps]
            elements = t * z.heads * z.head_dim * (plan.cp - 1)
            self.correction = Kernel("attention_correction", "elementwise", elements * CORRECTION_FLOPS,
                                     3 * elements * d, OpShape("elementwise", dtype))
        elif self.kind == "all_gather":
            n = model.seq_len // (2 * plan.cp)
            gathered = plan.cp * self.kv_bytes
            # 2n queries that see n(s + 1) keys in all: as the last 2n of (cp + 1)n causal positions
            self.gathered_kernels = (
                _attention_kernel("attention", shape(2 * n, (plan.cp + 1) * n, True, False),
                                  2 * self.q_bytes + gathered, dtype),
                _attention_kernel("attention_bwd", shape(2 * n, (plan.cp + 1) * n, True, True),
                                  4 * self.q_bytes + 2 * gathered, dtype))
        elif self.kind == "a2a":
            self.a2a_kernels = costs.attention(b, model.seq_len, z.heads // plan.cp, z.kv_heads // plan.cp,
                                               z.head_dim, d, flash=flash, dtype=sizes.attention_dtype)

    def forward(self, pre: str, x: list[int], phase: str, windowed: bool = False) -> list[int]:
        """From the QKV GEMM's output to the attention output (``windowed``: a sliding-window layer's kernel;
        the plan refuses a window with context parallelism)."""
        if self.kind == "none":
            return self.prog.compute(pre + "attention", (self.z.attn_window if windowed else self.z.attn)[0], x,
                                     phase)
        if self.kind == "all_gather":
            kv = self.prog.coll(pre + "cp_kv_allgather", "cp", AG, self.kv_bytes, x, phase)
            return self.prog.compute(pre + "attention", self.gathered_kernels[0], kv, phase)
        if self.kind == "a2a":
            qkv = self.prog.coll(pre + "cp_qkv_alltoall", "cp", A2A, self.q_bytes + self.kv_bytes, x, phase)
            out = self.prog.compute(pre + "attention", self.a2a_kernels[0], qkv, phase)
            return self.prog.coll(pre + "cp_out_alltoall", "cp", A2A, self.q_bytes, out, phase)
        feed = x  # p2p ring: the block this step attends to
        for i, (kernel, _) in enumerate(self.step_kernels):
            if i < self.cp - 1:
                _, got = self.prog.ring_step(f"{pre}cp_kv{i}", "cp", self.kv_bytes, feed, x, phase)
            self.prog.compute(f"{pre}attention_step{i}", kernel, feed, phase)
            if i < self.cp - 1:
                feed = got
        return self.prog.compute(pre + "attention_correction", self.correction, [self.prog.last_compute], phase)

    def backward(self, pre: str, g: list[int], windowed: bool = False) -> list[int]:
        """From the attention output's gradient to the Q, K and V gradients."""
        if self.kind == "none":
            return self.prog.compute(pre + "attention", (self.z.attn_window if windowed else self.z.attn)[1], g,
                                     "bwd")
        if self.kind == "all_gather":
            kv = self.prog.coll(pre + "cp_kv_allgather", "cp", AG, self.kv_bytes, g, "bwd")
            dx = self.prog.compute(pre + "attention", self.gathered_kernels[1], kv, "bwd")
            return self.prog.coll(pre + "cp_dkv_reducescatter", "cp", RS, self.cp * self.kv_bytes, dx, "bwd")
        if self.kind == "a2a":
            do = self.prog.coll(pre + "cp_dout_alltoall", "cp", A2A, self.q_bytes, g, "bwd")
            dx = self.prog.compute(pre + "attention", self.a2a_kernels[1], do, "bwd")
            return self.prog.coll(pre + "cp_dqkv_alltoall", "cp", A2A, self.q_bytes + self.kv_bytes, dx, "bwd")
        kv, dkv = g, g  # p2p ring: the K/V block held, and its gradient so far (none at step 0)
        for i, (_, kernel) in enumerate(self.step_kernels):
            if i < self.cp - 1:
                _, next_kv = self.prog.ring_step(f"{pre}cp_kv{i}", "cp", self.kv_bytes, kv, g, "bwd")
            step = self.prog.compute(f"{pre}attention_step{i}", kernel, sorted(set(kv + dkv)), "bwd")
            _, dkv = self.prog.ring_step(f"{pre}cp_dkv{i}", "cp", self.kv_bytes, step, g, "bwd")
            if i < self.cp - 1:
                kv = next_kv
        return sorted({self.prog.last_compute, *dkv})  # dQ is local; dK and dV come home with the last message
