"""One transformer layer's forward and backward: norms, the tensor-parallel GEMMs, the attention core and the
MLP, dense or mixture-of-experts.

A mixture-of-experts layer follows Megatron-Core's alltoall token dispatcher: the router scores the rank's own
tokens, they are permuted and sent to their experts' ranks with an all-to-all over the expert-parallel group,
gathered over the expert-tensor-parallel group when the experts are split (etp > 1), run through the grouped
expert GEMMs, reduce-scattered back over that group, returned with a second all-to-all and unpermuted; a shared
expert (a dense tensor-parallel FFN every token passes through) runs before the router and its backward last
(Megatron-Core's order without moe_shared_expert_overlap, which is not modelled). Without
sequence parallelism every tensor-parallel rank holds all tokens and the layer's output is all-reduced over tp.
With a host model (workload/llm/host.py) each block of a pass (attention, MLP, MoE routing, MoE expert section)
ends no earlier than the host has issued it; with ``moe_host_sync`` (Megatron-Core's dropless dispatcher) the
host waits for the token counts' all-gather before issuing the expert section.

Recompute (Megatron's --recompute-granularity): "full" runs the layer's forward again before its backward (with
its communication), "selective" the modules Megatron-Core's --recompute-modules names: the attention core
(core_attn, the default; Korthikanti et al.) right before its backward, the norms (layernorm) when their block's
backward starts, the experts' activation (moe_act) before the second expert GEMM's backward, the latent
attention's up-projections and RoPE (mla_up_proj, from the saved latents) before the attention core's backward, a
dense layer's MLP (mlp) before its backward, a mixture-of-experts block's whole forward (moe: router, exchanges,
experts) before its backward. A hybrid model's layers (ModelConfig.layer_pattern) hold one block each: a Mamba-2
mixer (workload/llm/mamba.py), attention, a dense MLP or a mixture-of-experts MLP.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from workload.llm import costs
from workload.llm.attention import Attention
from workload.llm.costs import Matmul
from workload.llm.gradients import GradientSync
from workload.llm.host import HostModel
from workload.llm.model import ModelConfig
from workload.llm.plan import ParallelPlan
from workload.llm.program import Program
from workload.llm.sizes import Ffn, StageSizes
from workload.llm.tensor_parallel import TensorParallel
from workload.schema import CollectiveType

A2A, AG, AR, RS = (CollectiveType.ALL_TO_ALL, CollectiveType.ALL_GATHER, CollectiveType.ALL_REDUCE,
                   CollectiveType.REDUCE_SCATTER)
# Where a layer pass pauses for Megatron-Core's EP A2A overlap (--overlap-moe-expert-parallel-comm), which runs
# one micro-batch's layer forward and another's layer backward together (workload/llm/build.py): a forward yields
# before its dispatch, after it and after its combine (the experts before it); a backward after its combine's gradient
# exchange, after the experts' gradients and after the dispatch's gradient exchange.
F_PRE, F_DISPATCH, F_COMBINE = "f_pre", "f_dispatch", "f_combine"
B_COMBINE, B_MLP, B_DISPATCH = "b_combine", "b_mlp", "b_dispatch"
Steps = Generator[str, None, list[int]]


def run_steps(steps: Generator[str, None, Any]) -> Any:
    """Run a pass's pieces one after the other; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class LayerPasses:
    """Adds layer forwards and backwards to a stage program."""

    def __init__(self, program: Program, sizes: StageSizes, model: ModelConfig, plan: ParallelPlan,
                 tp: TensorParallel, grads: GradientSync, ep_overlap: bool = False) -> None:
        self.prog, self.z, self.m, self.tp, self.grads = program, sizes, model, tp, grads
        self.ep_overlap = ep_overlap  # Megatron-Core's EP A2A overlap (combined 1F1B)
        self.recompute = plan.recompute_mode
        self.recomputed = plan.recomputed  # selective recompute's modules
        self.attention = Attention(program, sizes, model, plan)
        if model.is_moe:
            elements = sizes.local_tokens * model.top_k * model.expert_width
            if sizes.permute_at == "receive":  # the tokens a rank received (and gathered over etp)
                elements = sizes.mlp_in.tokens * model.expert_width
            self.permute = costs.elementwise("permute", elements, 1, 1, 1, model.dtype_bytes)
            self.unpermute = costs.elementwise("unpermute", elements, 2, 1, 1, model.dtype_bytes)
            # the copies between the dispatch and the experts' GEMMs in forward order, each with its inverse between
            # the experts and the combine: (name, kernels, inverse's name, its kernels)
            copies = ((("sort_chunks", sizes.sort_chunks, "unsort_chunks", sizes.sort_chunks),)
                      if sizes.sort_chunks is not None else ())
            if sizes.permute_at == "receive":
                copies += (("permute", self.permute, "unpermute", self.unpermute),)
            if sizes.quantization_padding is not None:
                copies += (("quantization_padding", sizes.quantization_padding, "quantization_unpadding",
                            sizes.quantization_padding),)
            self.receive_copies = copies

    def forward(self, pre: str, x: list[int], phase: str, layer: int = 0, first_micro_batch: bool = False
                ) -> list[int]:
        """``pre`` is the node name prefix (e.g. "mb0.fwd.layer3."), ``layer`` the layer's index in the model,
        ``first_micro_batch``: the iteration's first forward of the layer (low-precision weights are quantized
        there, then cached); returns the layer output's node."""
        return run_steps(self.forward_steps(pre, x, phase, layer, first_micro_batch))

    def forward_steps(self, pre: str, x: list[int], phase: str, layer: int = 0, first_micro_batch: bool = False
                      ) -> Steps:
        """``forward`` in the pieces Megatron-Core's EP A2A overlap interleaves with another micro-batch's backward:
        yields F_PRE (before the dispatch), F_DISPATCH, F_COMBINE (the experts and the combine's exchange
        issued); returns the output's node."""
        c, z = self.prog.compute, self.z
        self.tp.cast_weights = first_micro_batch
        if phase == "fwd":
            x = x + self.grads.gather(pre[:-1], f"layer{layer}", phase)
        blocks = self.m.layer_blocks(layer)
        if "attention" in blocks:
            x = self._attention_forward(pre, x, phase, layer)
        if "mamba" in blocks:
            x = self._mamba_forward(pre, x, phase)
        if blocks[-1] == "moe":
            issued = self._issue(pre + "route_issue", phase, lambda h: h.routing(False, self.z.latent is not None))
            x = c(pre + "mlp_norm", z.norm[0], x, phase)
            x = yield from self._moe_forward(pre, x, phase, issued)
        elif blocks[-1] == "mlp":
            issued = self._issue(pre + "mlp_issue", phase, lambda h: h.mlp(False))
            x = c(pre + "mlp_norm", z.norm[0], x, phase)
            assert z.dense is not None
            yield F_PRE
            yield F_DISPATCH
            x = self._ffn_forward(pre, z.dense, x, phase)
            self.prog.issued(issued)
            yield F_COMBINE
        else:  # a hybrid layer without an MLP
            yield F_PRE
            yield F_DISPATCH
            yield F_COMBINE
        if phase == "fwd":
            self.grads.unit_end()
        return x

    def _attention_forward(self, pre: str, x: list[int], phase: str, layer: int) -> list[int]:
        """The attention block: pre-norm, projections, the core, the output projection."""
        c, z = self.prog.compute, self.z
        issued = self._issue(pre + "attn_issue", phase, lambda h: h.attention(False, self.m.qk_norm))
        x = c(pre + "attn_norm", z.norm[0], x, phase)
        if z.mla is not None:
            x = self._latent_forward(pre, x, phase)
        else:
            x = self.tp.column_forward(pre, "attn", z.qkv, x, phase)
            if z.qk_norm is not None:
                x = c(pre + "qk_norm", z.qk_norm[0], x, phase)
        if z.rope is not None:
            x = c(pre + "rope", z.rope[0], x, phase)
        x = self.attention.forward(pre, x, phase, self.m.windowed(layer))
        x = self.tp.row_forward(pre, "attn", z.attn_out, x, phase)
        self.prog.issued(issued)
        return x

    def _mamba_forward(self, pre: str, x: list[int], phase: str) -> list[int]:
        """A hybrid model's Mamba-2 block (workload/llm/mamba.py): pre-norm, in_proj, convolution, the SSD scan's
        kernels, gated norm, out_proj."""
        c, mixer = self.prog.compute, self.z.mamba
        assert mixer is not None
        issued = self._issue(pre + "mamba_issue", phase, lambda h: h.mamba(False))
        x = c(pre + "mamba_norm", self.z.norm[0], x, phase)
        x = self.tp.column_forward(pre, "mamba", mixer.in_proj, x, phase)
        for kernel in mixer.forward:
            x = c(pre + kernel.name, kernel, x, phase)
        x = c(pre + "mamba_gated_norm", mixer.gated_norm[0], x, phase)
        x = self.tp.row_forward(pre, "mamba", mixer.out_proj, x, phase)
        self.prog.issued(issued)
        return x

    def _mamba_backward(self, pre: str, g: list[int], unit: str, micro_batch: int) -> list[int]:
        """``_mamba_forward``'s backward; returns its input gradient."""
        c, mixer, ready = self.prog.compute, self.z.mamba, self.grads.tensor_ready
        assert mixer is not None
        # no layernorm recompute here: Megatron-Core fuses a Mamba layer's pre-norm into in_proj's module
        issued = self._issue(pre + "mamba_issue_bwd", "bwd", lambda h: h.mamba(True))
        dx = self.tp.row_backward(pre, "mamba_grad", mixer.out_proj, g)
        ready(unit, "mamba_out", [self.prog.last_compute], micro_batch)
        dx = c(pre + "mamba_gated_norm", mixer.gated_norm[1], dx, "bwd")
        again = pre.replace(".bwd.", ".recompute.")  # the memory-efficient scan's own recompute (mamba.py)
        for kernel in mixer.recompute:
            dx = c(again + kernel.name, kernel, dx, "recompute")
        for kernel in mixer.backward:
            dx = c(pre + kernel.name, kernel, dx, "bwd")
        ready(unit, "mamba_mix", dx, micro_batch)
        return self._input_backward(pre, "mamba", mixer.in_proj, "mamba_in", dx, unit, micro_batch, issued)

    def _input_backward(self, pre: str, block: str, gemm: Matmul, tensor: str, dx: list[int], unit: str,
                        micro_batch: int, issued: int | None) -> list[int]:
        """A block's column-parallel input GEMM's backward (weight ``tensor``), its input gradient reduced over tp,
        then the block's pre-norm's backward; returns the block's input gradient."""
        ready = self.grads.tensor_ready
        dx_in = self.tp.column_backward(pre, block + "_input", gemm, dx)
        ready(unit, tensor, [self.prog.last_compute], micro_batch)
        g = self.tp.reduce(pre + block + "_grad", dx_in, "bwd", bulk=True)
        return self._norm_backward(pre, block, g, unit, micro_batch, issued)

    def _norm_backward(self, pre: str, block: str, g: list[int], unit: str, micro_batch: int, issued: int | None
                       ) -> list[int]:
        g = self.prog.compute(pre + block + "_norm", self.z.norm[1], g, "bwd")
        self.prog.issued(issued)
        self.grads.tensor_ready(unit, block + "_norm", g, micro_batch)
        return g

    def _ffn_forward(self, pre: str, ffn: Ffn, x: list[int], phase: str) -> list[int]:
        """A dense tensor-parallel FFN (a dense layer's MLP, a shared expert): gather, GEMM, activation, GEMM,
        reduce."""
        x = self.tp.column_forward(pre, ffn.name, ffn.up, x, phase)
        x = self.prog.compute(pre + ffn.act[0].name, ffn.act[0], x, phase)
        return self.tp.row_forward(pre, ffn.name, ffn.down, x, phase)

    def _ffn_backward(self, pre: str, ffn: Ffn, g: list[int], unit: str, micro_batch: int) -> list[int]:
        """``_ffn_forward``'s backward; returns its input gradient, not yet reduced over tp."""
        ready = self.grads.tensor_ready
        dx = self.tp.row_backward(pre, ffn.name + "_grad", ffn.down, g)
        ready(unit, ffn.down.name, [self.prog.last_compute], micro_batch)
        dx = self.prog.compute(pre + ffn.act[0].name, ffn.act[1], dx, "bwd")
        dx_in = self.tp.column_backward(pre, ffn.name + "_input", ffn.up, dx)
        ready(unit, ffn.up.name, [self.prog.last_compute], micro_batch)
        return dx_in

    def _latent_forward(self, pre: str, x: list[int], phase: str) -> list[int]:
        """Multi-head latent attention up to the core's inputs: the latents projected down from the rank's tokens,
        normed, gathered over tp (sequence parallel), projected up to the rank's heads."""
        c, mla, tp = self.prog.compute, self.z.mla, self.tp
        assert mla is not None
        q = c(pre + "q_down", mla.q_down.forward(), tp.gemm_inputs(pre, mla.q_down, x, phase), phase)
        kv = c(pre + "kv_down", mla.kv_down.forward(), tp.gemm_inputs(pre, mla.kv_down, x, phase), phase)
        x = c(pre + "latent_norm", mla.norm[0], q + kv, phase)
        if self.z.sp:
            x = self.prog.coll(pre + "latent_allgather", "tp", AG, mla.gather_bytes, x, phase)
        q = c(pre + "q_up", mla.q_up.forward(), tp.gemm_inputs(pre, mla.q_up, x, phase), phase)
        kv = c(pre + "kv_up", mla.kv_up.forward(), tp.gemm_inputs(pre, mla.kv_up, x, phase), phase)
        return q + kv

    def _latent_backward(self, pre: str, dx: list[int], unit: str, micro_batch: int) -> list[int]:
        """The latent projections' backward; returns the input gradient of the rank's tokens, complete (the latents'
        gradients are summed over tp before the down-projections, which every rank holds whole)."""
        mla = self.z.mla
        assert mla is not None
        back = self._projection_backward
        latents = back(pre, mla.q_up, dx, unit, micro_batch) + back(pre, mla.kv_up, dx, unit, micro_batch)
        if self.z.sp:
            latents = self.prog.coll(pre + "latent_grad_reducescatter", "tp", RS, mla.reduce_bytes, latents, "bwd")
        elif self.grads.p.tp > 1:
            latents = self.prog.coll(pre + "latent_grad_allreduce", "tp", AR, mla.reduce_bytes, latents, "bwd")
        latents = self.prog.compute(pre + "latent_norm", mla.norm[1], latents, "bwd")
        return back(pre, mla.q_down, latents, unit, micro_batch) + back(pre, mla.kv_down, latents, unit, micro_batch)

    def _projection_backward(self, pre: str, gemm: Matmul, g: list[int], unit: str, micro_batch: int) -> list[int]:
        """The backward of a GEMM whose weight every tensor-parallel rank holds whole (a latent projection): its
        output gradient quantized, the input and weight gradients; returns the input gradient."""
        c = self.prog.compute
        g = self.tp.quantized(pre, gemm, "grad", g, "bwd")
        dx_in = c(pre + gemm.name + "_dgrad", gemm.dgrad(), g, "bwd")
        c(pre + gemm.name + "_wgrad", gemm.wgrad(), g, "bwd")
        self.grads.tensor_ready(unit, gemm.name, [self.prog.last_compute], micro_batch)
        return dx_in

    def _issue(self, name: str, phase: str, cost: Callable[[HostModel], int], waits_for: list[int] | None = None
               ) -> int | None:
        """A host node issuing the next block, ``cost(host)`` us long (None without the host model)."""
        host = self.z.host
        return None if host is None else self.prog.issue(name, cost(host), phase, waits_for)

    def _host_wait(self, pre: str, x: list[int], phase: str) -> list[int]:
        """With the dropless dispatcher the token counts are copied to the host, which waits for them and only then
        launches the dispatch (the host model is always on with the sync): the dispatch's dependencies."""
        if not self.z.moe_host_sync:
            return x
        returned = self._issue(pre + "dispatch_issue", phase, lambda h: h.sync_return(), x)
        return [*x, returned] if returned else x

    @property
    def delayed_wgrad(self) -> bool:
        """Megatron-Core's delay_wgrad_compute, which the EP A2A overlap sets: the experts' weight gradients run
        after the dispatch's gradient exchange is issued instead of before it."""
        return self.ep_overlap

    @property
    def _extras(self) -> tuple[bool, bool, bool]:
        """The expert section's calls beside the grouped linears: (clamped GLU, scaled biases, the latent
        projection up)."""
        return self.z.act_clamp is not None, self.z.expert_bias is not None, self.z.latent is not None

    def _activation(self, pre: str, x: list[int], phase: str) -> list[int]:
        """The experts' activation (forward or recomputed). With the clamped GLU: the clamp's kernels, then
        Megatron-Core makes the linear offset a GPU tensor, a blocking copy: the host waits for everything queued so
        far, and only then issues the activation."""
        z = self.z
        if z.fused_mlp:  # in the first GEMM's kernel (its backward in the second GEMM's input gradient's)
            return x
        if z.act_clamp is not None:
            x = self.prog.compute(pre + "activation_clamp", z.act_clamp[0], x, phase)
            returned = self._issue(pre + "activation_offset_copy", phase, lambda h: h.copy_wait(), x)
            x = [*x, returned] if returned else x
        return self.prog.compute(pre + "activation", z.act[0], x, phase)

    def _received_order(self, pre: str, g: list[int]) -> list[int]:
        """The experts' input gradient back in the order the dispatch delivered the tokens: the backward of the
        quantization padding, of the flex dispatchers' permutation or of the alltoall dispatcher's sort by local
        expert."""
        for name, kernels, _, _ in reversed(self.receive_copies):
            g = self.prog.compute(pre + name, kernels[1], g, "bwd")
        return g

    def _exchange(self, name: str, deps: list[int], phase: str) -> list[int]:
        """One expert-parallel exchange (dispatch, combine or either's gradient): an all-to-all over the ep group,
        or, for the flex dispatcher across NVLink domains, its two stages at once (they pipeline in DeepEP's and
        HybridEP's kernels): the copies across domains over epx, the forwarding inside each domain over epd."""
        z, coll, library = self.z, self.prog.coll, self.z.exchange_library
        if z.expert_domains is None:
            return coll(name, "ep", A2A, z.dispatch_bytes, deps, phase, library=library)
        across = coll(name + "_across", "epx", A2A, z.dispatch_domain_bytes, deps, phase, library=library)
        within = coll(name + "_within", "epd", A2A, z.dispatch_bytes, deps, phase, library=library)
        return sorted(set(across + within))

    def _moe_forward(self, pre: str, x: list[int], phase: str, routing_issued: int | None) -> Steps:
        c, z, coll = self.prog.compute, self.z, self.prog.coll
        shared: list[int] = []
        if z.shared is not None:  # Megatron-Core runs it first, before the router
            issued = self._issue(pre + "shared_issue", phase, lambda h: h.shared_expert(False))
            shared = self._ffn_forward(pre, z.shared, x, phase)
            self.prog.issued(issued)
            x = [*x, self.prog.last_compute]  # stream order
        x = c(pre + "router", z.router.forward(), x, phase)
        if z.latent is not None:  # after the router, on the same stream
            x = c(pre + "latent_down", z.latent[0].forward(), self.tp.gemm_inputs(pre, z.latent[0], x, phase),
                  phase)
        if z.permute_at == "send":
            x = c(pre + "permute", self.permute[0], x, phase)
        self.prog.issued(routing_issued)
        if z.moe_host_sync or z.gathers_routing_map:  # the token counts (HybridEP: the routing map) all-gathered
            x = coll(pre + ("dispatch_routing_map_allgather" if z.gathers_routing_map else "dispatch_counts_allgather"),
                     "ep", AG, z.dispatch_gather_bytes, x, phase)
        def expert_issue(h: HostModel) -> int:
            return h.experts(z.local_experts, False, *self._extras)

        if self.ep_overlap:  # Megatron-Core's combined 1F1B issues the other micro-batch's
            # expert backward before this dispatch, whose call holds the wait, and this pass's experts after that
            # backward's dispatch (model_chunk_schedule_plan.py), so the backward runs during the wait. HybridEP's
            # staging copy, on the communication stream there, goes before the wait here: after it, on the compute
            # stream, it would hold that backward back
            if z.rdma_staging is not None:
                x = c(pre + "rdma_staging", z.rdma_staging, x, phase)
            yield F_PRE
            x = self._host_wait(pre, x, phase)
            x = self._exchange(pre + "dispatch_alltoall", x, phase)
            yield F_DISPATCH
            issued = self._issue(pre + "expert_issue", phase, expert_issue)
        else:
            x = self._host_wait(pre, x, phase)
            if z.rdma_staging is not None:
                x = c(pre + "rdma_staging", z.rdma_staging, x, phase)
            issued = self._issue(pre + "expert_issue", phase, expert_issue)
            yield F_PRE
            x = self._exchange(pre + "dispatch_alltoall", x, phase)
            yield F_DISPATCH
        if z.expert_gather:
            x = coll(pre + "expert_allgather", "etp", AG, z.expert_gather_bytes, x, phase)
        for name, kernels, _, _ in self.receive_copies:
            x = c(pre + name, kernels[0], x, phase)
        x = c(pre + z.mlp_in.name, z.mlp_in.forward(), self.tp.gemm_inputs(pre, z.mlp_in, x, phase), phase)
        x = self._activation(pre, x, phase)
        # the fused grouped MLP's first kernel writes the second GEMM's quantized input: only its weight's cast
        x = self.tp.quantized(pre, z.mlp_out, "weight", x, phase) if z.fused_mlp else \
            self.tp.gemm_inputs(pre, z.mlp_out, x, phase)
        x = c(pre + z.mlp_out.name, z.mlp_out.forward(), x, phase)
        if z.expert_bias is not None:
            x = c(pre + "expert_bias", z.expert_bias[0], x, phase)
        for _, _, inverse, kernels in reversed(self.receive_copies):
            x = c(pre + inverse, kernels[0], x, phase)
        if z.expert_gather:
            x = coll(pre + "expert_reducescatter", "etp", RS, z.expert_gather_bytes * self.grads.p.expert_tp, x,
                     phase)
        x = self._exchange(pre + "combine_alltoall", x, phase)
        yield F_COMBINE
        if z.permute_at == "send":
            x = c(pre + "unpermute", self.unpermute[0], x, phase)
        if z.latent is not None:
            x = c(pre + "latent_up", z.latent[1].forward(), self.tp.gemm_inputs(pre, z.latent[1], x, phase),
                  phase)
        self.prog.issued(issued)
        return (x if z.sp else self.tp.reduce(pre + "mlp", x, phase)) + shared


    def backward(self, pre: str, g: list[int], unit: str, micro_batch: int, layer: int = 0) -> list[int]:
        """The layer's backward (after its recompute); returns its input gradient's node."""
        return run_steps(self.backward_steps(pre, g, unit, micro_batch, layer))

    def backward_steps(self, pre: str, g: list[int], unit: str, micro_batch: int, layer: int = 0) -> Steps:
        """``backward`` in the pieces the EP A2A overlap interleaves: yields B_COMBINE (the combine's gradient
        exchange issued), B_MLP (the experts' gradients done), B_DISPATCH, returns the input gradient's node."""
        c, z, ready = self.prog.compute, self.z, self.grads.tensor_ready
        g = g + self.grads.gather(pre[:-1], f"layer{layer}", "bwd")
        again = pre.replace(".bwd.", ".recompute.")
        if self.recompute == "full":
            self.forward(again, g, "recompute", layer)
        blocks = self.m.layer_blocks(layer)
        if blocks[-1] in ("mlp", "moe"):
            if "layernorm" in self.recomputed:  # the norm's output, dropped after the forward, when its block's
                c(again + "mlp_norm", z.norm[0], g, "recompute")  # backward starts (Megatron-Core's output hook)
            if blocks[-1] == "moe":
                if "moe" in self.recomputed and self.recompute != "full":  # the whole MoE block, its exchanges too
                    run_steps(self._moe_forward(again, g, "recompute", None))
                g, issued = yield from self._moe_backward(pre, g, unit, micro_batch)
            else:
                assert z.dense is not None
                yield B_COMBINE
                issued = self._issue(pre + "mlp_issue_bwd", "bwd", lambda h: h.mlp(True))
                if "mlp" in self.recomputed and self.recompute != "full":  # a dense layer's MLP, from its saved input
                    self._ffn_forward(again, z.dense, g, "recompute")
                dx_in = self._ffn_backward(pre, z.dense, g, unit, micro_batch)
                yield B_MLP
                yield B_DISPATCH
                g = self.tp.reduce(pre + "mlp_grad", dx_in, "bwd", bulk=True)
            g = c(pre + "mlp_norm", z.norm[1], g, "bwd")
            self.prog.issued(issued)
            ready(unit, "mlp_norm", g, micro_batch)
        else:  # a hybrid layer without an MLP
            yield B_COMBINE
            yield B_MLP
            yield B_DISPATCH
        if "attention" in blocks:
            g = self._attention_backward(pre, g, unit, micro_batch, layer)
        if "mamba" in blocks:
            g = self._mamba_backward(pre, g, unit, micro_batch)
        self.grads.unit_end()
        return g

    def _attention_backward(self, pre: str, g: list[int], unit: str, micro_batch: int, layer: int) -> list[int]:
        """The attention block's backward (with its selective recompute); returns its input gradient."""
        c, z, ready = self.prog.compute, self.z, self.grads.tensor_ready
        again = pre.replace(".bwd.", ".recompute.")
        issued = self._issue(pre + "attn_issue_bwd", "bwd", lambda h: h.attention(True, self.m.qk_norm))
        if "layernorm" in self.recomputed:
            c(again + "attn_norm", z.norm[0], g, "recompute")
        dx = self.tp.row_backward(pre, "attn_grad", z.attn_out, g)
        ready(unit, "attn_out", [self.prog.last_compute], micro_batch)
        if "mla_up_proj" in self.recomputed and z.mla is not None:  # the core's inputs, from the saved latents
            up = c(again + "q_up", z.mla.q_up.forward(), dx, "recompute")
            up = c(again + "kv_up", z.mla.kv_up.forward(), up, "recompute")
            if z.rope is not None:
                c(again + "rope", z.rope[0], up, "recompute")
        if "core_attn" in self.recomputed:
            self.attention.forward(again, dx, "recompute", self.m.windowed(layer))
        dx = self.attention.backward(pre, dx, self.m.windowed(layer))
        if z.rope is not None:
            dx = c(pre + "rope", z.rope[1], dx, "bwd")
        if z.qk_norm is not None:
            dx = c(pre + "qk_norm", z.qk_norm[1], dx, "bwd")
        if z.mla is not None:
            return self._norm_backward(pre, "attn", self._latent_backward(pre, dx, unit, micro_batch), unit,
                                       micro_batch, issued)
        return self._input_backward(pre, "attn", z.qkv, "qkv", dx, unit, micro_batch, issued)

    def _moe_backward(self, pre: str, g: list[int], unit: str, micro_batch: int
                      ) -> Generator[str, None, tuple[list[int], int | None]]:
        """The MoE block's backward up to the router; returns its gradient and the routing backward's host node
        (the pre-MLP norm's gradient, which the caller adds, closes that block)."""
        c, z, coll, ready = self.prog.compute, self.z, self.prog.coll, self.grads.tensor_ready
        etp = self.grads.p.expert_tp
        issued = self._issue(pre + "expert_issue_bwd", "bwd", lambda h: h.experts(z.local_experts, True, *self._extras))
        output_grad = g
        if z.latent is not None:
            g = self._projection_backward(pre, z.latent[1], g, unit, micro_batch)
        if z.permute_at == "send":
            g = c(pre + "unpermute", self.unpermute[1], g, "bwd")
        if z.rdma_staging is not None:  # the combine's gradient is a HybridEP dispatch
            g = c(pre + "rdma_staging", z.rdma_staging, g, "bwd")
        g = self._exchange(pre + "combine_grad_alltoall", g, "bwd")
        yield B_COMBINE
        if z.expert_gather:
            g = coll(pre + "expert_grad_allgather", "etp", AG, z.expert_gather_bytes, g, "bwd")
        for _, _, inverse, kernels in self.receive_copies:
            g = c(pre + inverse, kernels[1], g, "bwd")
        if z.expert_bias is not None:
            g = c(pre + "expert_bias", z.expert_bias[1], g, "bwd")
        g = self.tp.quantized(pre, z.mlp_out, "grad", g, "bwd")
        if "moe_act" in self.recomputed:  # the experts' activation, for the second GEMM's weight gradient
            self._activation(pre.replace(".bwd.", ".recompute."), g, "recompute")
        dx = c(pre + z.mlp_out.name + "_dgrad", z.mlp_out.dgrad(), g, "bwd")
        c(pre + z.mlp_out.name + "_wgrad", z.mlp_out.wgrad(), g, "bwd")
        ready(unit, "expert_out", [self.prog.last_compute], micro_batch)
        if not z.fused_mlp:  # fused: the second GEMM's input-gradient kernel applies it and quantizes its output
            dx = c(pre + "activation", z.act[1], dx, "bwd")
            if z.act_clamp is not None:
                dx = c(pre + "activation_clamp", z.act_clamp[1], dx, "bwd")
            dx = self.tp.quantized(pre, z.mlp_in, "grad", dx, "bwd")
        dx_in = c(pre + z.mlp_in.name + "_dgrad", z.mlp_in.dgrad(), dx, "bwd")
        if self.delayed_wgrad:  # the dispatch's backward (its local permutation first) before the weight gradient
            dx_in = self._received_order(pre, dx_in)
        wgrad = c(pre + z.mlp_in.name + "_wgrad", z.mlp_in.wgrad(), dx, "bwd")
        ready(unit, "expert_in", wgrad, micro_batch)
        if not self.delayed_wgrad:
            dx_in = self._received_order(pre, dx_in)
        yield B_MLP
        # The autograd engine issues the dispatch's backward once the grouped GEMMs' backward has returned, and
        # that enqueues the weight gradient after the input gradient on the same stream: the exchange waits for both
        after = dx_in if self.delayed_wgrad else dx_in + wgrad
        if self.ep_overlap and self.prog.last_host:  # the host issues it once back from the other micro-batch's
            # dispatch call (the wait in it), which it issued first (model_chunk_schedule_plan.py)
            after = [*after, self.prog.last_host]
        if z.expert_gather:
            after = coll(pre + "expert_grad_reducescatter", "etp", RS, z.expert_gather_bytes * etp, after, "bwd")
        g = self._exchange(pre + "dispatch_grad_alltoall", after, "bwd")
        yield B_DISPATCH
        if z.permute_at == "send":
            g = c(pre + "permute", self.permute[1], g, "bwd")
        if z.latent is not None:
            g = self._projection_backward(pre, z.latent[0], g, unit, micro_batch)
        self.prog.issued(issued)
        issued = self._issue(pre + "route_issue_bwd", "bwd", lambda h: h.routing(True, self.z.latent is not None))
        g = c(pre + "router_dgrad", z.router.dgrad(), g, "bwd")
        c(pre + "router_wgrad", z.router.wgrad(), g, "bwd")
        ready(unit, "router", [self.prog.last_compute], micro_batch)
        shared: list[int] = []
        if z.shared is not None:  # created first in the forward, so the autograd engine reaches it last
            issued_shared = self._issue(pre + "shared_issue_bwd", "bwd", lambda h: h.shared_expert(True))
            shared = self._ffn_backward(pre, z.shared, [*output_grad, self.prog.last_compute], unit, micro_batch)
            self.prog.issued(issued_shared)
            shared = self.tp.reduce(pre + "shared_grad", shared, "bwd", bulk=True)
        return (g if z.sp else self.tp.reduce(pre + "mlp_grad", g, "bwd")) + shared, issued
