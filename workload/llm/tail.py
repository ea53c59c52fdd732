"""The start and end of a real iteration beyond the passes (``iteration_tail``): batch loading, gradient-norm
clipping and the loss reduction logged every iteration, as Megatron-LM's train_step runs them.

Kernels are sized by what they touch, so the compute models time them as memory-bound work:
- get_batch (every micro-batch, on the ranks that embed the tokens or compute the loss): the batch copied to the
  device, tokens and position ids (int64) on the first stage, labels (int64) and the loss mask (fp32) on the
  last; after a host-side wait of ``dataloader_wait_us`` when that is above 0 (the loader falling behind);
- grad_norm: the squared norm of the rank's gradients (its shard with a sharded optimizer), 2 FLOPs per
  gradient; its all-reduce (4 bytes, fp32) over the model-parallel ranks, or every rank when the gradients are
  sharded or the experts spread over data-parallel ranks; clip_grad: the gradients scaled in place;
- loss_reduce (last stage): the micro-batches' losses summed, then an 8-byte all-reduce (sum and token count,
  fp32) over the data(-and-context)-parallel group, after the optimizer step.
"""

from __future__ import annotations

from compute.shapes import OpShape
from workload.llm.costs import Kernel
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan
from workload.llm.program import Program
from workload.schema import CollectiveType

AR = CollectiveType.ALL_REDUCE
FIRST_STAGE_BATCH_BYTES = 8 + 8  # per token: token id and position id (int64)
LAST_STAGE_BATCH_BYTES = 8 + 4  # per token: label (int64) and loss mask (fp32)
NORM_FLOPS_PER_GRAD = 2
NORM_REDUCE_BYTES = 4
LOSS_REDUCE_BYTES = 8
SHAPE = OpShape("elementwise", "fp32")  # memory-bound: timed from the bytes it touches


class IterationTail:
    """Adds the iteration's batch loading, gradient clipping and loss logging nodes (when enabled)."""

    def __init__(self, program: Program, model: ModelConfig, plan: ParallelPlan, options: TrainingOptions) -> None:
        self.prog, self.on = program, options.iteration_tail
        self.wait_us = options.dataloader_wait_us
        self.tokens = plan.micro_batch_size * model.seq_len // plan.cp
        self.grad_bytes = options.grad_bytes(model.dtype_bytes)
        self.m = plan.num_micro_batches
        self.norm_group = "world" if plan.zero_stage >= 1 or (model.is_moe and plan.ep > 1) else "mp"
        self.loss_group = "dpcp" if plan.cp > 1 else "dp"

    def batch(self, pre: str, first_stage: bool, deps: list[int]) -> list[int]:
        """Load one micro-batch's inputs (first stage) or labels (last stage)."""
        if not self.on:
            return deps
        if self.wait_us:
            deps = self.prog.host(pre + "dataloader_wait", self.wait_us, deps, "tail")
        data = self.tokens * (FIRST_STAGE_BATCH_BYTES if first_stage else LAST_STAGE_BATCH_BYTES)
        return self.prog.compute(pre + "get_batch", Kernel("get_batch", "elementwise", self.tokens, data, SHAPE), deps,
                                 "tail")

    def clip(self, local_grads: int, deps: list[int]) -> list[int]:
        """The gradient norm and clipping before the optimizer step."""
        if not self.on:
            return deps
        size = local_grads * self.grad_bytes
        norm = self.prog.compute("grad_norm", Kernel("grad_norm", "elementwise", NORM_FLOPS_PER_GRAD * local_grads,
                                                     size, SHAPE), deps, "tail")
        norm = self.prog.coll("grad_norm_allreduce", self.norm_group, AR, NORM_REDUCE_BYTES, norm, "tail")
        clip = Kernel("clip_grad", "elementwise", local_grads, 2 * size, SHAPE)
        return self.prog.compute("clip_grad", clip, norm, "tail")

    def log(self, deps: list[int]) -> None:
        """The loss reduced for logging (last stage), after the step."""
        if not self.on:
            return
        loss = self.prog.compute("loss_reduce", Kernel("loss_reduce", "elementwise", self.m, 4 * self.m, SHAPE), deps,
                                 "tail")
        self.prog.coll("logged_loss_allreduce", self.loss_group, AR, LOSS_REDUCE_BYTES, loss, "tail")
