"""One training iteration as a program per pipeline stage: every rank of a stage runs the same program and
differs only in its communicator groups and send/recv peers (filled in by workload/llm/emit.py).

Per micro-batch, a stage runs the forward of its layers (stage 0 first embeds the tokens, the last stage
ends with the final norm, the output head and the loss) and later their backward, in the 1F1B order of
``one_f_one_b``. Compute nodes form one chain in program order (one GPU stream); collectives sit on the data
path between the kernels that produce and consume their data. Tensor parallelism (Megatron-LM):
forward all-reduce after the attention output and the MLP output projections, backward all-reduce after the
QKV and MLP-input input-gradients; with sequence parallelism each becomes an all-gather before the
column-parallel matmul and a reduce-scatter after the row-parallel one (backward: the reverse, plus the
all-gather of the saved input for the weight gradient). Gradients are synchronised per layer ("bucket"):
ZeRO 0 all-reduces them during the last micro-batch's backward, ZeRO 1 reduce-scatters them after the whole
backward, ZeRO 2 during the last micro-batch's backward, and ZeRO 3 (FSDP) during every micro-batch's
backward, after all-gathering each layer's parameters before its forward and backward (prefetching one
layer ahead). ZeRO 1 and 2 all-gather the updated parameters after the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workload.llm import costs
from workload.llm.costs import Kernel, Matmul
from workload.llm.model import ModelConfig
from workload.llm.plan import ParallelPlan, stage_layers
from workload.schema import CollectiveType, NodeType

AR, AG, RS, A2A = (CollectiveType.ALL_REDUCE, CollectiveType.ALL_GATHER, CollectiveType.REDUCE_SCATTER,
                   CollectiveType.ALL_TO_ALL)
LOSS_REDUCE_BYTES_PER_TOKEN = 3 * 4  # vocabulary-parallel cross-entropy: max, sum of exp, target logit (fp32)


@dataclass(slots=True)
class Op:
    """A node of a stage program; its node id is its index + 1 (id 0 is the METADATA node).

    Collectives name a group kind (tp, dp, ep, edp, emb); sends and receives a stage offset (+1/-1) and tag."""

    name: str
    node_type: int
    phase: str  # fwd, bwd, recompute, optimizer, sync
    deps: list[int]
    ctrl: list[int] = field(default_factory=list)
    kernel: Kernel | None = None
    comm_type: int = 0
    size_bytes: int = 0
    group: str = ""
    peer: int = 0
    tag: int = 0


@dataclass(slots=True)
class StageProgram:
    stage: int
    layers: range
    ops: list[Op]


def one_f_one_b(num_stages: int, stage: int, num_micro_batches: int) -> list[tuple[str, int]]:
    """The non-interleaved 1F1B order of ("F" | "B", micro-batch): pp - stage - 1 warm-up forwards, then
    alternating forward/backward, then the remaining backwards."""
    warmup = min(num_stages - stage - 1, num_micro_batches)
    order = [("F", m) for m in range(warmup)]
    for i in range(num_micro_batches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", m) for m in range(num_micro_batches - warmup, num_micro_batches)]
    return order


def build_programs(model: ModelConfig, plan: ParallelPlan) -> list[StageProgram]:
    """The program of every pipeline stage (plan and model already validated)."""
    return [_StageBuilder(model, plan, s).build() for s in range(plan.pp)]


class _StageBuilder:
    def __init__(self, model: ModelConfig, plan: ParallelPlan, stage: int) -> None:
        self.m, self.p, self.stage = model, plan, stage
        self.first, self.last = stage == 0, stage == plan.pp - 1
        self.layers = stage_layers(model.num_layers, plan.pp, stage)
        self.ops: list[Op] = []
        self.last_compute = 0
        self.kinds = {k for k, on in (("tp", plan.tp > 1), ("dp", plan.dp > 1), ("ep", plan.ep > 1),
                                      ("edp", model.is_moe and plan.dp // plan.ep > 1),
                                      ("emb", model.tied_embeddings and plan.pp > 1 and (self.first or self.last)))
                      if on}
        self.sp = plan.sequence_parallel and plan.tp > 1
        self._kernels()
        self._params()
        self.gathers: list[int] = []  # ZeRO-3 parameter all-gathers, in issue order
        self.unit_ends: list[int] = []  # last compute node of each layer pass, in program order
        self.last_sync: dict[tuple[str, str], int] = {}  # (unit, group kind) -> last gradient collective
        self.final_syncs: list[int] = []

    # --- sizes ----------------------------------------------------------------------------------------
    def _kernels(self) -> None:
        m, p, d = self.m, self.p, self.m.dtype_bytes
        b, s, h, tp = p.micro_batch_size, m.seq_len, m.hidden_size, p.tp
        t = b * s
        t_local = t // tp if self.sp else t  # tokens per rank outside the tensor-parallel matmuls
        heads, kv, hd, f = m.num_heads // tp, m.kv_heads // tp, m.head_size, m.ffn_hidden_size // tp
        self.act_bytes = t * h * d
        self.act_local_bytes = t_local * h * d
        self.tokens = t
        self.norm = costs.elementwise("norm", t_local * h, costs.NORM_FLOPS[m.norm], 2, 2, d)
        self.final_norm = costs.elementwise("final_norm", t_local * h, costs.NORM_FLOPS[m.norm], 1, 1, d)
        self.qkv = Matmul("qkv", t, h, (heads + 2 * kv) * hd, d)
        self.attn = costs.attention(b, s, heads, kv, hd, d)
        self.attn_out = Matmul("attn_out", t, heads * hd, h, d)
        in_width = (2 if m.gated_ffn else 1) * f
        if m.is_moe:
            routed, experts = t * m.top_k, m.num_experts // p.ep
            self.router = Matmul("router", t_local, h, m.num_experts, d)
            self.mlp_in = Matmul("expert_in", routed, h, in_width, d, weights=experts)
            self.mlp_out = Matmul("expert_out", routed, f, h, d, weights=experts)
            self.dispatch_bytes = routed * h * d
        else:
            routed = t
            self.mlp_in = Matmul("mlp_in", t, h, in_width, d)
            self.mlp_out = Matmul("mlp_out", t, f, h, d)
        self.act = costs.elementwise("activation", routed * f, costs.ACTIVATION_FLOPS[m.gated_ffn],
                                     2 if m.gated_ffn else 1, 1, d)
        vocab = p.padded_vocab(m) // tp
        self.head = Matmul("lm_head", t, h, vocab, d)
        self.loss = costs.elementwise("loss", t * vocab, costs.LOSS_FLOPS, 1, 1, d)
        self.embed = costs.elementwise("embedding", t * h, 1, 1, 1, d)

    def _params(self) -> None:
        m, p = self.m, self.p
        self.layer = m.layer_params(p.tp, p.ep)
        vocab_rows = p.padded_vocab(m) // p.tp * m.hidden_size
        # a tied embedding split over pipeline stages: the first and the last stage each hold a copy
        self.embedding_params = vocab_rows if "emb" in self.kinds else 0
        root = 0
        if self.first:
            root += vocab_rows + m.embedding_params() - m.vocab_size * m.hidden_size
        if self.last:
            root += m.norm_params() + (vocab_rows if not m.tied_embeddings or p.pp > 1 else 0)
        self.root_params = root
        self.replicated = len(self.layers) * self.layer.replicated + (m.norm_params() if self.last else 0)

    def _shard(self, params: int, kind: str) -> int:
        """Parameters per rank after ZeRO sharding over the group ``kind`` (dp or edp)."""
        n = self.p.dp if kind == "dp" else self.p.dp // self.p.ep
        return -(-params // n) if self.p.zero_stage >= 1 else params

    # --- node helpers --------------------------------------------------------------------------------
    def _add(self, op: Op) -> int:
        self.ops.append(op)
        return len(self.ops)

    def _compute(self, name: str, kernel: Kernel, deps: list[int], phase: str) -> list[int]:
        ctrl = [self.last_compute] if self.last_compute and self.last_compute not in deps else []
        self.last_compute = self._add(Op(name, NodeType.COMP_NODE, phase, list(deps), ctrl, kernel=kernel))
        return [self.last_compute]

    def _coll_id(self, name: str, kind: str, comm_type: int, size_bytes: int, deps: list[int], phase: str
                 ) -> int | None:
        """A collective on this rank's ``kind`` group; None without such a group (size 1) or data."""
        if kind not in self.kinds or size_bytes == 0:
            return None
        return self._add(Op(name, NodeType.COMM_COLL_NODE, phase, list(deps), comm_type=comm_type,
                            size_bytes=size_bytes, group=kind))

    def _coll(self, name: str, kind: str, comm_type: int, size_bytes: int, deps: list[int], phase: str
              ) -> list[int]:
        """Like _coll_id; returns what the next node depends on (the collective, or else ``deps``)."""
        got = self._coll_id(name, kind, comm_type, size_bytes, deps, phase)
        return deps if got is None else [got]

    def _tp_gather(self, name: str, deps: list[int], phase: str) -> list[int]:
        return self._coll(name + "_allgather", "tp", AG, self.act_local_bytes, deps, phase) if self.sp else deps

    def _tp_reduce(self, name: str, deps: list[int], phase: str) -> list[int]:
        if self.sp:
            return self._coll(name + "_reducescatter", "tp", RS, self.act_bytes, deps, phase)
        return self._coll(name + "_allreduce", "tp", AR, self.act_bytes, deps, phase)

    def _p2p(self, name: str, send: bool, stage_offset: int, tag: int, deps: list[int], phase: str) -> list[int]:
        node_type = NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE
        return [self._add(Op(name, node_type, phase, list(deps), size_bytes=self.act_local_bytes, group="pp",
                             peer=stage_offset, tag=tag))]

    def _gather_params(self, name: str, unit_params: list[tuple[str, int]], phase: str) -> list[int]:
        """ZeRO-3: all-gather a unit's parameters, prefetched while the unit before the previous one computes."""
        if self.p.zero_stage != 3:
            return []
        out = []
        for kind, params in unit_params:
            got = self._coll_id(f"{name}_{kind}_param_allgather", kind, AG,
                                self._shard(params, kind) * self.m.dtype_bytes,
                                self.gathers[-1:] + self.unit_ends[-2:-1], phase)
            if got is not None:
                self.gathers.append(got)
                out.append(got)
        return out

    def _unit_params(self, unit: str) -> list[tuple[str, int]]:
        if unit == "root":
            return [("dp", self.root_params)]
        return [("dp", self.layer.dense), ("edp", self.layer.expert)]

    def _sync_grads(self, pre: str, unit: str, deps: list[int], final: bool) -> None:
        """Reduce one unit's gradients over dp (and its experts' over edp), per the ZeRO stage."""
        ctype = AR if self.p.zero_stage == 0 else RS
        for kind, params in self._unit_params(unit):
            key = (unit, kind)
            prev = [self.last_sync[key]] if key in self.last_sync else []
            what = "allreduce" if ctype == AR else "reducescatter"
            got = self._coll_id(f"{pre}{unit}_{kind}_grad_{what}", kind, ctype, params * self.m.dtype_bytes,
                                deps + prev, "sync")
            if got is not None:
                self.last_sync[key] = got
                if final:
                    self.final_syncs.append(got)

    def _after_backward(self, unit: str, end: list[int], micro_batch: int) -> None:
        is_last = micro_batch == self.p.num_micro_batches - 1
        if self.p.zero_stage == 3 or (self.p.zero_stage in (0, 2) and is_last):
            self._sync_grads(f"mb{micro_batch}.bwd.", unit, end, is_last)

    # --- passes --------------------------------------------------------------------------------------
    def build(self) -> StageProgram:
        for kind, mb in one_f_one_b(self.p.pp, self.stage, self.p.num_micro_batches):
            if kind == "F":
                self._forward(mb)
            else:
                self._backward(mb)
        self._step()
        return StageProgram(self.stage, self.layers, self.ops)

    def _forward(self, mb: int) -> None:
        pre = f"mb{mb}.fwd."
        x = self._gather_params(pre + "root", self._unit_params("root"), "fwd") if self.root_params else []
        if self.first:
            x = self._compute(pre + "embedding", self.embed[0], x, "fwd")
            x = self._tp_reduce(pre + "embedding", x, "fwd")
        else:
            x = self._p2p(pre + "recv_activation", False, -1, mb, [self.last_compute] if self.last_compute else [],
                          "fwd")
        for layer in self.layers:
            x = self._layer_forward(f"{pre}layer{layer}.", x, "fwd")
        if self.last:
            x = self._compute(pre + "final_norm", self.final_norm[0], x, "fwd")
            x = self._tp_gather(pre + "head", x, "fwd")
            x = self._compute(pre + "lm_head", self.head.forward(), x, "fwd")
            x = self._coll(pre + "loss_allreduce", "tp", AR, self.tokens * LOSS_REDUCE_BYTES_PER_TOKEN, x, "fwd")
            self._compute(pre + "loss", self.loss[0], x, "fwd")
        else:
            self._p2p(pre + "send_activation", True, +1, mb, x, "fwd")

    def _layer_forward(self, pre: str, x: list[int], phase: str) -> list[int]:
        if phase == "fwd":
            x = x + self._gather_params(pre[:-1], self._unit_params("layer"), phase)
        x = self._compute(pre + "attn_norm", self.norm[0], x, phase)
        x = self._tp_gather(pre + "attn", x, phase)
        x = self._compute(pre + "qkv", self.qkv.forward(), x, phase)
        x = self._compute(pre + "attention", self.attn[0], x, phase)
        x = self._compute(pre + "attn_out", self.attn_out.forward(), x, phase)
        x = self._tp_reduce(pre + "attn", x, phase)
        x = self._compute(pre + "mlp_norm", self.norm[0], x, phase)
        if self.m.is_moe:
            x = self._compute(pre + "router", self.router.forward(), x, phase)
            x = self._tp_gather(pre + "moe", x, phase)
            x = self._coll(pre + "dispatch_alltoall", "ep", A2A, self.dispatch_bytes, x, phase)
        else:
            x = self._tp_gather(pre + "mlp", x, phase)
        x = self._compute(pre + self.mlp_in.name, self.mlp_in.forward(), x, phase)
        x = self._compute(pre + "activation", self.act[0], x, phase)
        x = self._compute(pre + self.mlp_out.name, self.mlp_out.forward(), x, phase)
        if self.m.is_moe:
            x = self._coll(pre + "combine_alltoall", "ep", A2A, self.dispatch_bytes, x, phase)
        x = self._tp_reduce(pre + "mlp", x, phase)
        if phase == "fwd":
            self.unit_ends.append(self.last_compute)
        return x

    def _backward(self, mb: int) -> None:
        pre = f"mb{mb}.bwd."
        if self.last:  # the head's backward needs its weights (the embedding lookup's does not)
            gathered = self._gather_params(pre + "root", self._unit_params("root"), "bwd")
            g = self._compute(pre + "loss", self.loss[1], [], "bwd")
            dx = self._compute(pre + "lm_head_dgrad", self.head.dgrad(), g + gathered, "bwd")
            saved = self._tp_gather(pre + "head_input", dx, "bwd")
            self._compute(pre + "lm_head_wgrad", self.head.wgrad(), sorted(set(g + saved + gathered)), "bwd")
            g = self._tp_reduce(pre + "head_grad", dx, "bwd") if self.sp else \
                self._coll(pre + "head_grad_allreduce", "tp", AR, self.act_bytes, dx, "bwd")
            g = self._compute(pre + "final_norm", self.final_norm[1], g, "bwd")
            if not self.first:
                self._after_backward("root", g, mb)
        else:
            g = self._p2p(pre + "recv_gradient", False, +1, self.p.num_micro_batches + mb,
                          [self.last_compute] if self.last_compute else [], "bwd")
        for layer in reversed(self.layers):
            g = self._layer_backward(f"{pre}layer{layer}.", g)
            self._after_backward(f"layer{layer}", g, mb)
        if self.first:
            g = self._tp_gather(pre + "embedding_grad", g, "bwd")
            g = self._compute(pre + "embedding", self.embed[1], g, "bwd")
            self._after_backward("root", g, mb)
        else:
            self._p2p(pre + "send_gradient", True, -1, self.p.num_micro_batches + mb, g, "bwd")

    def _layer_backward(self, pre: str, g: list[int]) -> list[int]:
        g = g + self._gather_params(pre[:-1], self._unit_params("layer"), "bwd")
        if self.p.activation_recompute:
            self._layer_forward(pre.replace(".bwd.", ".recompute."), g, "recompute")
        g = self._tp_gather(pre + "mlp_grad", g, "bwd")
        if self.m.is_moe:
            g = self._coll(pre + "combine_grad_alltoall", "ep", A2A, self.dispatch_bytes, g, "bwd")
        dx = self._compute(pre + self.mlp_out.name + "_dgrad", self.mlp_out.dgrad(), g, "bwd")
        self._compute(pre + self.mlp_out.name + "_wgrad", self.mlp_out.wgrad(), g, "bwd")
        dx = self._compute(pre + "activation", self.act[1], dx, "bwd")
        saved = dx if self.m.is_moe else self._tp_gather(pre + "mlp_input", dx, "bwd")
        dx_in = self._compute(pre + self.mlp_in.name + "_dgrad", self.mlp_in.dgrad(), dx, "bwd")
        self._compute(pre + self.mlp_in.name + "_wgrad", self.mlp_in.wgrad(), sorted(set(dx + saved)), "bwd")
        if self.m.is_moe:
            g = self._coll(pre + "dispatch_grad_alltoall", "ep", A2A, self.dispatch_bytes, dx_in, "bwd")
            g = self._tp_reduce(pre + "mlp_grad", g, "bwd") if self.sp else g
            g = self._compute(pre + "router_dgrad", self.router.dgrad(), g, "bwd")
            self._compute(pre + "router_wgrad", self.router.wgrad(), g, "bwd")
            g = g if self.sp else self._tp_reduce(pre + "mlp_grad", g, "bwd")
        else:
            g = self._tp_reduce(pre + "mlp_grad", dx_in, "bwd")
        g = self._compute(pre + "mlp_norm", self.norm[1], g, "bwd")
        g = self._tp_gather(pre + "attn_grad", g, "bwd")
        dx = self._compute(pre + "attn_out_dgrad", self.attn_out.dgrad(), g, "bwd")
        self._compute(pre + "attn_out_wgrad", self.attn_out.wgrad(), g, "bwd")
        dx = self._compute(pre + "attention", self.attn[1], dx, "bwd")
        saved = self._tp_gather(pre + "attn_input", dx, "bwd")
        dx_in = self._compute(pre + "qkv_dgrad", self.qkv.dgrad(), dx, "bwd")
        self._compute(pre + "qkv_wgrad", self.qkv.wgrad(), sorted(set(dx + saved)), "bwd")
        g = self._tp_reduce(pre + "attn_grad", dx_in, "bwd")
        g = self._compute(pre + "attn_norm", self.norm[1], g, "bwd")
        self.unit_ends.append(self.last_compute)
        return g

    def _step(self) -> None:
        """Gradient synchronisation left after the backward passes, the optimizer, the parameter all-gathers."""
        end = [self.last_compute]
        units = ["root"] if self.root_params else []
        units += [f"layer{layer}" for layer in self.layers]
        if self.p.zero_stage == 1:
            for unit in reversed(units):
                self._sync_grads("", unit, end, True)
        extra = []
        if self.sp:  # norms (and router) see only their sequence shard: sum their gradients over tp
            extra.append(self._coll_id("replicated_grad_allreduce", "tp", AR, self.replicated * self.m.dtype_bytes,
                                       end, "sync"))
        if self.embedding_params:
            # after the whole backward: issued earlier on the last stage, it would hold the comm slot before the
            # last sends that the first stage waits for (a cross-stage deadlock)
            deps = sorted({*end, self.last_sync["root", "dp"]}) if ("root", "dp") in self.last_sync else end
            extra.append(self._coll_id("embedding_grad_allreduce", "emb", AR,
                                       self._shard(self.embedding_params, "dp") * self.m.dtype_bytes, deps, "sync"))
        self.final_syncs += [i for i in extra if i is not None]
        local = sum(self._shard(params, kind) for unit in units
                    for kind, params in self._unit_params("root" if unit == "root" else "layer"))
        step = self._compute("optimizer", costs.optimizer(local), sorted(set(end + self.final_syncs)), "optimizer")
        if self.p.zero_stage in (1, 2):
            for unit in units:
                for kind, params in self._unit_params("root" if unit == "root" else "layer"):
                    self._coll(f"{unit}_{kind}_param_allgather", kind, AG,
                               self._shard(params, kind) * self.m.dtype_bytes, step, "optimizer")
