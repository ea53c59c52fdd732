"""Tensor-parallel GEMMs and their communication (Megatron-LM's column- and row-parallel linear layers).

Without sequence parallelism a row-parallel GEMM's output is all-reduced (forward), and so is a column-parallel
GEMM's input gradient (backward). With it, the all-reduce becomes an all-gather before the column-parallel GEMM
and a reduce-scatter after the row-parallel one (backward: the reverse, plus the all-gather of the saved input for
the weight gradient, which runs beside the input-gradient GEMM as Megatron's linear layers overlap it).

Low-precision GEMMs (FP8, NVFP4) first run their operands' quantization kernels (workload/llm/quantize.py): the
input's before the forward GEMM (and its all-gather, which then carries the quantized copy), the output
gradient's before the backward GEMMs, the weight's in the first micro-batch's forward only.

With ``tp_comm_overlap`` (Megatron-Core's --tp-comm-overlap, Transformer Engine's userbuffers defaults):
- all-gather + GEMM (QKV and FC1 forward, projection and FC2 input gradients) is a ring exchange: tp - 1
  send/receive steps between tensor-parallel neighbours feeding tp GEMM chunks, each chunk waiting only for the
  shard it multiplies; the weight gradient of the projection and FC2 waits for the whole ring;
- GEMM + reduce-scatter (projection and FC2 forward) is pipelined: 4 GEMM chunks, each chunk's reduce-scatter
  running beside the next chunk.
The ring exchange runs on copy engines; the pipelined reduce-scatters and the backward's all-gather and
reduce-scatter beside the QKV and FC1 GEMMs ("bulk" overlap) are userbuffers kernels on 16 SMs (Transformer
Engine 1.8's defaults: num_sm 16, use_ce on), written as the collectives' ``comm_sms`` attribute.
"""

from __future__ import annotations

from compute.shapes import math_precision
from workload.llm.costs import Kernel, Matmul
from workload.llm.options import PIPELINE_RS_SPLITS
from workload.llm.program import Program
from workload.llm.sizes import StageSizes
from workload.schema import CollectiveType

AR, AG, RS = CollectiveType.ALL_REDUCE, CollectiveType.ALL_GATHER, CollectiveType.REDUCE_SCATTER
USERBUFFERS_SMS = 16  # Transformer Engine's initialize_ub: num_sm of the pipelined and bulk overlaps (v1.8)


class TensorParallel:
    """Adds a layer's tensor-parallel GEMMs and communication to a stage program."""

    def __init__(self, program: Program, sizes: StageSizes, tp: int, overlap: bool) -> None:
        self.prog, self.z, self.tp = program, sizes, tp
        self.sp = sizes.sp
        self.overlap = overlap and sizes.sp and tp > 1
        self.cast_weights = False  # low precision: the first micro-batch's forward quantizes each GEMM's weight

    # --- low-precision operands (workload/llm/quantize.py) ------------------------------------------------
    def quantized(self, pre: str, gemm: Matmul, operand: str, x: list[int], phase: str) -> list[int]:
        """``x`` after the quantization kernels of ``gemm``'s ``operand`` (the weight's only when cast_weights and
        in the forward)."""
        if operand == "weight" and not (self.cast_weights and phase == "fwd"):
            return x
        for kernel in self.z.quantize(f"{pre}{gemm.name}_{operand}", gemm, operand):
            x = self.prog.compute(kernel.name, kernel, x, phase)
        return x

    def gemm_inputs(self, pre: str, gemm: Matmul, x: list[int], phase: str) -> list[int]:
        """A forward GEMM's operands quantized: its weight (first micro-batch) and its input."""
        return self.quantized(pre, gemm, "input", self.quantized(pre, gemm, "weight", x, phase), phase)

    # --- plain collectives -----------------------------------------------------------------------------
    def gather(self, name: str, deps: list[int], phase: str, gemm: Matmul | None = None, bulk: bool = False
               ) -> list[int]:
        """Sequence parallel: all-gather the local tokens (``gemm``'s input, or output gradient: in FP8 when that GEMM
        is FP8, quantized before gathering); ``bulk``: a linear layer's backward overlap (userbuffers with
        tp_comm_overlap)."""
        if not self.sp:
            return deps
        return self.prog.coll(name + "_allgather", "tp", AG, self._gathered_bytes(gemm), deps, phase, self._sms(bulk))

    def _gathered_bytes(self, gemm: Matmul | None) -> int:
        """A rank's tokens as gathered: FP8 for an FP8 GEMM, else the model's dtype (16-bit GEMMs, NVFP4's)."""
        fp8 = gemm is not None and math_precision(gemm.dtype) == "fp8"
        return self.z.fp8_gather_bytes if fp8 else self.z.act_local_bytes

    def reduce(self, name: str, deps: list[int], phase: str, bulk: bool = False) -> list[int]:
        """A row-parallel output (or column-parallel input gradient): reduce-scatter with sequence parallelism,
        else all-reduce."""
        if self.sp:
            return self.prog.coll(name + "_reducescatter", "tp", RS, self.z.act_bytes, deps, phase, self._sms(bulk))
        return self.prog.coll(name + "_allreduce", "tp", AR, self.z.act_bytes, deps, phase)

    def _sms(self, userbuffers: bool) -> int:
        return USERBUFFERS_SMS if userbuffers and self.overlap else 0

    # --- GEMMs with their communication -----------------------------------------------------------------
    def column_forward(self, pre: str, comm: str, gemm: Matmul, x: list[int], phase: str) -> list[int]:
        """All-gather (sequence parallel) then the column-parallel GEMM; a ring exchange with overlap."""
        x = self.gemm_inputs(pre, gemm, x, phase)
        if self.overlap:
            out, _ = self._ring_gemm(pre, comm, gemm, [g.forward() for g in self.z.rows(gemm, self.tp)], x, phase)
            return out
        x = self.gather(pre + comm, x, phase, gemm)
        return self.prog.compute(pre + gemm.name, gemm.forward(), x, phase)

    def row_forward(self, pre: str, comm: str, gemm: Matmul, x: list[int], phase: str) -> list[int]:
        """The row-parallel GEMM then its reduce-scatter / all-reduce; pipelined per GEMM chunk with overlap."""
        x = self.gemm_inputs(pre, gemm, x, phase)
        if not self.overlap:
            x = self.prog.compute(pre + gemm.name, gemm.forward(), x, phase)
            return self.reduce(pre + comm, x, phase)
        out: list[int] = []
        for i, chunk in enumerate(self.z.rows(gemm, PIPELINE_RS_SPLITS)):
            y = self.prog.compute(f"{pre}{gemm.name}_chunk{i}", chunk.forward(), x, phase)
            share = chunk.tokens * self.z.act_bytes // gemm.tokens
            out += self.prog.coll(f"{pre}{comm}_chunk{i}_reducescatter", "tp", RS, share, y, phase, USERBUFFERS_SMS)
        return out

    def row_backward(self, pre: str, comm: str, gemm: Matmul, g: list[int]) -> list[int]:
        """A row-parallel GEMM's backward: gather the output gradient (sequence parallel), input and weight
        gradients; returns the input gradient."""
        g = self.quantized(pre, gemm, "grad", g, "bwd")
        if self.overlap:
            dx, received = self._ring_gemm(pre, comm, gemm, [c.dgrad() for c in self.z.rows(gemm, self.tp)], g, "bwd",
                                           "_dgrad")
            self.prog.compute(pre + gemm.name + "_wgrad", gemm.wgrad(), sorted(set(g + received)), "bwd")
            return dx
        g = self.gather(pre + comm, g, "bwd", gemm)
        dx = self.prog.compute(pre + gemm.name + "_dgrad", gemm.dgrad(), g, "bwd")
        self.prog.compute(pre + gemm.name + "_wgrad", gemm.wgrad(), g, "bwd")
        return dx

    def column_backward(self, pre: str, saved_comm: str, gemm: Matmul, dx: list[int]) -> list[int]:
        """A column-parallel GEMM's backward: the saved input's all-gather beside the input-gradient GEMM, the
        weight gradient after both; returns the input gradient (not yet reduced)."""
        dx = self.quantized(pre, gemm, "grad", dx, "bwd")
        saved = self.gather(pre + saved_comm, dx, "bwd", gemm, bulk=True)
        dx_in = self.prog.compute(pre + gemm.name + "_dgrad", gemm.dgrad(), dx, "bwd")
        self.prog.compute(pre + gemm.name + "_wgrad", gemm.wgrad(), sorted(set(dx + saved)), "bwd")
        return dx_in

    def _ring_gemm(self, pre: str, comm: str, gemm: Matmul, chunks: list[Kernel], x: list[int], phase: str,
                   suffix: str = "") -> tuple[list[int], list[int]]:
        """tp GEMM chunks (of ``gemm``'s pass ``suffix``) fed by a ring exchange of the sequence shards: (last chunk,
        every receive)."""
        received: list[int] = []
        out = x
        feed = x
        size = self._gathered_bytes(gemm)
        for i, kernel in enumerate(chunks):
            if i < len(chunks) - 1:
                _, got = self.prog.ring_step(f"{pre}{comm}_ring{i}", "tp", size, feed, x, phase)
            out = self.prog.compute(f"{pre}{gemm.name}{suffix}_chunk{i}", kernel, feed, phase)
            if i < len(chunks) - 1:
                feed = got
                received += got
        return out, received
