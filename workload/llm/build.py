"""One training iteration as a program per pipeline stage: every rank of a stage runs the same program and
differs only in its communicator groups and send/recv peers (filled in by workload/llm/emit.py).

A stage runs its micro-batches' forward and backward passes in its pipeline schedule's order
(workload/llm/schedules.py: 1F1B, or interleaved over ``vp`` model chunks). A forward receives the activation
from the previous stage (the first stage embeds the tokens instead), runs the chunk's layers
(workload/llm/layers.py) and sends to the next stage (the last stage ends with the final norm, the output head
and the loss); a backward runs the reverse. With virtual stages the last stage's chunk c sends to the first
stage's chunk c + 1. Gradient and parameter communication is workload/llm/gradients.py's, the iteration's
tail workload/llm/tail.py's.

With the EP A2A overlap (``moe_a2a_overlap``, Megatron-Core's combined 1F1B) each forward of the steady phase and
the backward after it are emitted together, a layer of each at a time in Megatron-Core's order, so that on the one
compute stream one pass's experts and attention run while the other's all-to-alls are in flight.
"""

from __future__ import annotations

from collections.abc import Generator

from workload.collector import collector_paused
from workload.errors import InputError
from workload.llm import costs
from workload.llm.costs import Kernel
from workload.llm.gradients import GradientSync
from workload.llm.layers import B_COMBINE, B_DISPATCH, B_MLP, F_COMBINE, F_DISPATCH, F_PRE, LayerPasses, run_steps
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan
from workload.llm.program import Op, Program, StageProgram, order_collectives
from workload.llm.ranks import GROUP_KINDS
from workload.llm.schedules import merged_pairs, one_f_one_b, stage_receive_points, stage_schedule
from workload.llm.sizes import StageSizes
from workload.llm.tail import IterationTail
from workload.llm.tensor_parallel import TensorParallel
from workload.schema import CollectiveType

__all__ = ["Kernel", "Op", "StageProgram", "build_programs", "one_f_one_b"]

AR = CollectiveType.ALL_REDUCE
F_NEXT, F_LAST, B_NEXT, B_LAST = "f_next", "f_last", "b_next", "b_last"  # a layer comes; the last one is done
LOSS_REDUCE_BYTES_PER_TOKEN = 3 * 4  # vocabulary-parallel cross-entropy: max, sum of exp, target logit (fp32)


def build_programs(model: ModelConfig, plan: ParallelPlan, options: TrainingOptions | None = None
                   ) -> list[StageProgram]:
    """The program of every pipeline stage (plan and model already validated)."""
    options = options or TrainingOptions()
    if options.moe_a2a_overlap:
        check_ep_overlap(model, plan)
    with collector_paused():
        programs = [_StageBuilder(model, plan, options, s).build() for s in range(plan.pp)]
    ranks = options.rank_map(plan, model)
    for program in programs:
        rank = ranks.stage_ranks(program.stage)[0]  # which kinds share a communicator is alike on a stage's ranks
        order_collectives(program.ops, {kind: group.gid for kind in GROUP_KINDS
                                        if (group := ranks.group(rank, kind)) is not None})
    return programs


def check_ep_overlap(model: ModelConfig, plan: ParallelPlan) -> None:
    """Megatron-Core's conditions for the EP A2A overlap (TransformerConfig.__post_init__)."""
    if not model.is_moe or plan.ep < 2:
        raise InputError("moe_a2a_overlap overlaps the expert-parallel all-to-alls: it needs a mixture-of-experts "
                         f"model with ep > 1 (got {model.num_experts} experts, ep {plan.ep})")
    if plan.pp > 1 and plan.vp == 1:
        raise InputError("moe_a2a_overlap with pipeline parallelism needs virtual pipeline stages (vp > 1), as "
                         "Megatron-Core requires")
    if plan.recompute_mode == "full":
        raise InputError("moe_a2a_overlap cannot run with full recompute (Megatron-Core refuses it)")


def until(steps: Generator[str, None, None], *labels: str) -> str | None:
    """Run a pass until it yields one of ``labels``: that label, or None once it has run to its end."""
    return next((got for got in steps if got in labels), None)


def stage_group_kinds(model: ModelConfig, plan: ParallelPlan, options: TrainingOptions, stage: int) -> set[str]:
    """The communicator group kinds with more than one rank that a stage's ranks use."""
    first, last = stage == 0, stage == plan.pp - 1
    expert_ranks = plan.tp * plan.cp * plan.dp // (plan.expert_tp * plan.ep)
    tail = options.iteration_tail
    domains, per_domain = options.expert_domains(plan) or (1, 1)
    return {k for k, on in (("tp", plan.tp > 1), ("dp", plan.dp > 1), ("ep", plan.ep > 1),
                            ("epd", per_domain > 1), ("epx", domains > 1),
                            ("edp", model.is_moe and expert_ranks > 1),
                            ("emb", model.shares_embedding(plan.pp) and (first or last)),
                            ("cp", plan.cp > 1), ("dpcp", plan.cp > 1), ("etp", model.is_moe and plan.expert_tp > 1),
                            ("mp", tail and plan.tp * plan.pp > 1), ("world", tail and plan.world_size > 1))
            if on}


class _StageBuilder:
    def __init__(self, model: ModelConfig, plan: ParallelPlan, options: TrainingOptions, stage: int) -> None:
        self.m, self.p, self.stage = model, plan, stage
        self.first, self.last = stage == 0, stage == plan.pp - 1
        self.vp = plan.vp
        self.chunk_layers = [plan.chunk_layers(model.num_layers, stage, c) for c in range(plan.vp)]
        # multi-token-prediction depths: after the last layer, on the last stage's last chunk
        self.mtp = [model.num_layers + i for i in range(model.mtp_layers)] if self.last else []
        self.prog = Program(stage_group_kinds(model, plan, options, stage),
                            ring_tag_base=2 * plan.vp * plan.num_micro_batches)
        self.z = StageSizes(model, plan, options)
        self.grads = GradientSync(self.prog, model, plan, options, stage, self._chunk_units())
        self.tp = TensorParallel(self.prog, self.z, plan.tp, options.tp_comm_overlap)
        self.layers = LayerPasses(self.prog, self.z, model, plan, self.tp, self.grads, options.moe_a2a_overlap)
        # the layers kept in 16-bit under fp8/fp4 (first/last layers, MTP depths): their own sizes and passes
        self.options = options
        self.layers_16bit: LayerPasses | None = None
        if any(options.layer_in_16bit(model, layer) for chunk in [*self.chunk_layers, self.mtp] for layer in chunk):
            z16 = StageSizes(model, plan, options.in_16bit())
            self.layers_16bit = LayerPasses(self.prog, z16, model, plan,
                                            TensorParallel(self.prog, z16, plan.tp, options.tp_comm_overlap),
                                            self.grads, options.moe_a2a_overlap)
        self.tail = IterationTail(self.prog, model, plan, options)
        self.ep_overlap = options.moe_a2a_overlap
        self.replicated = sum(self.grads.layer(f"layer{layer}").replicated for layers in [*self.chunk_layers, self.mtp]
                              for layer in layers) + (model.norm_params() if self.last else 0)

    def _passes(self, layer: int) -> LayerPasses:
        """The passes running ``layer``: in 16-bit where the options keep it so, else in the layers' precision."""
        if self.layers_16bit is not None and self.options.layer_in_16bit(self.m, layer):
            return self.layers_16bit
        return self.layers

    def _chunk_units(self) -> list[list[str]]:
        root = self.first or self.last
        units = []
        for c, layers in enumerate(self.chunk_layers):
            has_root = root and ((self.first and c == 0) or (self.last and c == self.vp - 1))
            mtp = self.mtp if self.last and c == self.vp - 1 else []
            units.append((["root"] if has_root else []) + [f"layer{layer}" for layer in [*layers, *mtp]])
        if self.first and self.last:  # one stage (no virtual stages then): the root once
            units = [units[0]]
        return units

    def _holds(self, chunk: int) -> tuple[bool, bool]:
        """(embedding, output head) of this stage's ``chunk``."""
        return self.first and chunk == 0, self.last and chunk == self.vp - 1

    def _names(self, mb: int, chunk: int, phase: str) -> str:
        return f"mb{mb}.{phase}." if self.vp == 1 else f"mb{mb}.{phase}.chunk{chunk}."

    def _tag(self, gradient: bool, chunk: int, mb: int) -> int:
        """Send/recv tag of the activation (or gradient) that chunk ``chunk`` of its receiver gets for ``mb``."""
        m = self.p.num_micro_batches
        return (self.vp * m if gradient else 0) + chunk * m + mb

    # --- passes --------------------------------------------------------------------------------------
    def build(self) -> StageProgram:
        self.grads.start()
        steps = (self.p.pp, self.stage, self.p.num_micro_batches, self.vp, self.p.group_size, self.ep_overlap)
        posted_after = stage_receive_points(*steps)
        order = stage_schedule(*steps)
        together = merged_pairs(*steps[:-1]) if self.ep_overlap else [False] * len(order)
        step_ends: list[int] = []  # the last compute node after each step
        pending: Generator[str, None, None] | None = None  # a forward waiting to run with the backward after it

        def recv_deps(i: int) -> list[int] | None:
            j = posted_after[i]  # posted after the step before: after whatever compute precedes the receive
            return None if j == i - 1 else [step_ends[j]] if step_ends[j] else []

        for i, (kind, mb, chunk) in enumerate(order):
            if kind == "F" and together[i]:
                pending = self._forward_steps(mb, chunk, recv_deps(i))
                continue
            if pending is not None:  # this backward runs with the forward before it
                self._together(pending, self._backward_steps(mb, chunk, recv_deps(i)))
                pending = None
                step_ends.append(self.prog.last_compute)  # the forward's step ends with it
            else:
                run_steps((self._forward_steps if kind == "F" else self._backward_steps)(mb, chunk, recv_deps(i)))
            step_ends.append(self.prog.last_compute)
        self._step()
        layers: range | tuple[int, ...] = self.chunk_layers[0] if self.vp == 1 else tuple(
            x for r in self.chunk_layers for x in r)
        return StageProgram(self.stage, layers, self.prog.ops)

    def _recv_deps(self, posted_after: list[int] | None) -> list[int]:
        """A receive's dependencies: ``posted_after`` (schedules.receive_points), else the last compute so far."""
        if posted_after is not None:
            return posted_after
        return [self.prog.last_compute] if self.prog.last_compute else []

    def _together(self, fwd: Generator[str, None, None], bwd: Generator[str, None, None]) -> None:
        """One micro-batch's forward and another's backward as Megatron-Core's combined 1F1B runs them with EP A2A
        overlap (model_chunk_schedule_plan.py): the forward's start, the backward's start, then per pair of
        layers the backward's combine exchange beside the forward's attention and routing, the forward's dispatch
        beside the backward's experts, the backward's dispatch beside the forward's experts, the forward's combine
        beside the backward's routing and attention (the unpermutation after it, as the combine runs it on the
        communication stream); layers left in one pass run alone; the forward's end, the backward's."""
        f, b = until(fwd, F_NEXT, F_LAST), until(bwd, B_NEXT, B_LAST)
        while f == F_NEXT or b == B_NEXT:
            in_f, in_b = f == F_NEXT, b == B_NEXT
            if in_b:
                until(bwd, B_COMBINE)
            if in_f:
                until(fwd, F_PRE)
            if in_b:
                until(bwd, B_MLP)
            if in_f:
                until(fwd, F_DISPATCH)
            if in_b:
                until(bwd, B_DISPATCH)
            if in_f:
                until(fwd, F_COMBINE)  # the experts, then the combine's exchange
            if in_b:
                b = until(bwd, B_NEXT, B_LAST)  # beside the combine: the routing and attention gradients
            if in_f:
                f = until(fwd, F_NEXT, F_LAST)  # the unpermutation after the combine
        run_steps(fwd)
        run_steps(bwd)

    def _forward_steps(self, mb: int, chunk: int, recv_deps: list[int] | None) -> Generator[str, None, None]:
        """A forward pass; yields F_NEXT before each layer, its layers' pieces, F_LAST after the last layer."""
        pre, prog, z = f"mb{mb}.fwd.", self.prog, self.z
        names = self._names(mb, chunk, "fwd")
        embeds, heads = self._holds(chunk)
        x = self.grads.gather(pre + "root", "root", "fwd") if self.grads.root_params and (embeds or heads) else []
        if (embeds or heads) and mb == 0:
            x = x + self.grads.first_use("root", None if self.grads.mode != "bucket" else
                                         "embedding" if embeds else "lm_head")
        if embeds:
            x = self.tail.batch(pre, True, x)
            x = prog.compute(pre + "embedding", z.embed[0], x, "fwd")
            x = self.tp.reduce(pre + "embedding", x, "fwd")
        else:
            if heads:
                self.tail.batch(pre, False, x)
            x = prog.p2p(names + "recv_activation", False, -1, self._tag(False, chunk, mb), z.act_local_bytes,
                         self._recv_deps(recv_deps), "fwd")
        for layer in self.chunk_layers[chunk]:
            yield F_NEXT
            if mb == 0:
                x = x + self.grads.first_use(f"layer{layer}")
            x = yield from self._passes(layer).forward_steps(f"{pre}layer{layer}.", x, "fwd", layer,
                                                             first_micro_batch=mb == 0)
        yield F_LAST
        if heads:
            if embeds and mb == 0 and self.grads.mode == "bucket":
                x = x + self.grads.first_use("root", "lm_head")
            outputs = [("", x)]
            for depth, layer in enumerate(self.mtp):
                outputs.append((f"mtp{depth}.", self._mtp_forward(f"{pre}mtp{depth}.", outputs[-1][1], layer, mb)))
            for name, x in outputs:
                issued = self._issue_head(pre + name + "head_issue", "fwd")
                x = prog.compute(pre + name + "final_norm", z.final_norm[0], x, "fwd")
                x = self.tp.gather(pre + name + "head", x, "fwd")
                x = prog.compute(pre + name + "lm_head", z.head.forward(), x, "fwd")
                x = prog.coll(pre + name + "loss_allreduce", "tp", AR, z.tokens * LOSS_REDUCE_BYTES_PER_TOKEN, x,
                              "fwd")
                prog.compute(pre + name + "loss", z.loss[0], x, "fwd")
                prog.issued(issued)
        else:
            to_chunk = chunk if not self.last else chunk + 1
            prog.p2p(names + "send_activation", True, +1, self._tag(False, to_chunk, mb), z.act_local_bytes, x,
                     "fwd")

    def _backward_steps(self, mb: int, chunk: int, recv_deps: list[int] | None) -> Generator[str, None, None]:
        """A backward pass; yields B_NEXT before each layer, its layers' pieces, B_LAST after the last layer."""
        pre, prog, z, grads = f"mb{mb}.bwd.", self.prog, self.z, self.grads
        names = self._names(mb, chunk, "bwd")
        embeds, heads = self._holds(chunk)
        if heads:  # the head's backward needs its weights (the embedding lookup's does not)
            gathered = grads.gather(pre + "root", "root", "bwd")
            head_grads = []
            for name in ["", *(f"mtp{depth}." for depth in range(len(self.mtp)))]:
                issued = self._issue_head(pre + name + "head_issue_bwd", "bwd")
                g = prog.compute(pre + name + "loss", z.loss[1], [], "bwd")
                dx = prog.compute(pre + name + "lm_head_dgrad", z.head.dgrad(), g + gathered, "bwd")
                saved = self.tp.gather(pre + name + "head_input", dx, "bwd")
                prog.compute(pre + name + "lm_head_wgrad", z.head.wgrad(), sorted(set(g + saved + gathered)), "bwd")
                g = self.tp.reduce(pre + name + "head_grad", dx, "bwd")
                head_grads.append(prog.compute(pre + name + "final_norm", z.final_norm[1], g, "bwd"))
                prog.issued(issued)
            for depth in reversed(range(len(self.mtp))):  # each depth's gradient reaches the states before it
                head_grads[depth] += self._mtp_backward(f"{pre}mtp{depth}.", head_grads[depth + 1], self.mtp[depth],
                                                        mb)
            g = head_grads[0]
            grads.tensor_ready("root", "lm_head", g, mb)
            if not self.first:
                grads.after_backward("root", g, mb)
        else:
            g = prog.p2p(names + "recv_gradient", False, +1, self._tag(True, chunk, mb), z.act_local_bytes,
                         self._recv_deps(recv_deps), "bwd")
        for layer in reversed(self.chunk_layers[chunk]):
            yield B_NEXT
            g = yield from self._passes(layer).backward_steps(f"{pre}layer{layer}.", g, f"layer{layer}", mb, layer)
            grads.after_backward(f"layer{layer}", g, mb)
        yield B_LAST
        if embeds:
            g = self.tp.gather(pre + "embedding_grad", g, "bwd")
            g = prog.compute(pre + "embedding", z.embed[1], g, "bwd")
            grads.tensor_ready("root", "embedding", g, mb)
            grads.after_backward("root", g, mb)
        else:
            to_chunk = chunk if not self.first else chunk - 1
            prog.p2p(names + "send_gradient", True, -1, self._tag(True, to_chunk, mb), z.act_local_bytes, g, "bwd")

    def _mtp_forward(self, pre: str, hidden: list[int], layer: int, mb: int) -> list[int]:
        """One multi-token-prediction depth: the shifted tokens' embedding and ``hidden`` normed, their pair
        projected (column-parallel, output gathered), and a transformer layer; returns its output's node."""
        prog, z = self.prog, self.z
        x = hidden + (self.grads.first_use(f"layer{layer}") if mb == 0 else [])
        x = prog.compute(pre + "embedding", z.embed[0], x, "fwd")
        x = prog.compute(pre + "mtp_norms", z.mtp_norms[0], x, "fwd")
        x = self.tp.column_forward(pre, "mtp_proj", z.mtp_proj, x, "fwd")
        if self.p.tp > 1:
            x = self.tp.gather(pre + "mtp_proj_output", x, "fwd")
        return self._passes(layer).forward(pre, x, "fwd", layer, first_micro_batch=mb == 0)

    def _mtp_backward(self, pre: str, g: list[int], layer: int, mb: int) -> list[int]:
        """A multi-token-prediction depth's backward; returns the gradient of the hidden states it read."""
        prog, z, grads, unit = self.prog, self.z, self.grads, f"layer{layer}"
        g = self._passes(layer).backward(pre, g, unit, mb, layer)
        dx = self.tp.column_backward(pre, "mtp_proj_input", z.mtp_proj, g)
        grads.tensor_ready(unit, "mtp_proj", [prog.last_compute], mb)
        dx = self.tp.reduce(pre + "mtp_proj_grad", dx, "bwd", bulk=True)
        dx = prog.compute(pre + "mtp_norms", z.mtp_norms[1], dx, "bwd")
        prog.compute(pre + "embedding", z.embed[1], dx, "bwd")  # the shifted tokens' embedding gradient
        grads.after_backward(unit, dx, mb)
        return dx

    def _issue_head(self, name: str, phase: str) -> int | None:
        """The host issuing the output layer and loss (forward or backward); None without the host model."""
        host = self.z.host
        return None if host is None else self.prog.issue(name, host.head(phase == "bwd"), phase)

    def _step(self) -> None:
        """Gradient synchronisation left after the backward passes, the clipping, the optimizer, the parameter
        all-gathers and the loss logged."""
        prog, grads, d = self.prog, self.grads, self.grads.grad_bytes
        end = [prog.last_compute]
        grads.remaining(end)
        extra = []
        if self.z.sp:  # norms (and router) see only their sequence shard: sum their gradients over tp
            extra.append(prog.coll_id("replicated_grad_allreduce", "tp", AR, self.replicated * d, end, "sync"))
        if grads.embedding_params:
            # after the whole backward: issued earlier on the last stage, it would hold the comm slot before the
            # last sends that the first stage waits for (a cross-stage deadlock)
            root = [i for (unit, _), i in grads.last_sync.items() if unit == "root" or unit in grads.root_buckets()]
            extra.append(prog.coll_id("embedding_grad_allreduce", "emb", AR,
                                      grads.shard(grads.embedding_params, grads.dense) * d, sorted({*end, *root}),
                                      "sync"))
        grads.final_syncs += [i for i in extra if i is not None]
        local = grads.local_params()
        ready = self.tail.clip(local, sorted(set(end + grads.final_syncs)))
        step = prog.compute("optimizer", costs.optimizer(local), ready, "optimizer")
        grads.after_step(step)
        if self.last:
            self.tail.log(step)
