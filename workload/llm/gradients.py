"""Data-parallel gradient and parameter communication: DDP, the distributed optimizer (ZeRO 1 and 2) and FSDP
(ZeRO 3), per layer or in Megatron's buckets.

Dense parameters are synchronised over the data-parallel group (data x context parallel when cp > 1, as
Megatron-Core's dp-cp group), experts over their expert-data-parallel group. ZeRO 0 all-reduces the
gradients; ZeRO 1 and 2 (Megatron's distributed optimizer) reduce-scatter them and all-gather the updated
parameters after the optimizer step on the shard; ZeRO 3 (FSDP) all-gathers each layer's parameters before its
forward (prefetched one layer ahead) and, unless ``reshard_after_forward`` is off, again before its backward, and
reduce-scatters its gradients after its backward.

When the gradients travel (see workload/llm/options.py): per layer ("unit") at the end of its backward in the last
micro-batch (ZeRO 0 and 2, and with ``overlap_grad_reduce``), after the whole backward (ZeRO 1, or
``overlap_grad_reduce`` off), or every micro-batch (ZeRO 3, unless ``fsdp_grad_sync`` "last"). With a bucket size
the distributed-data-parallel stages (0 to 2) use Megatron's buckets instead of layers: the weight tensors in
backward order fill a bucket until it holds ``bucket_size`` parameters, and a bucket is reduced once its last
tensor's gradient is ready (a single bucket per model chunk on pipeline stages after the first and on chunks
after the first, where Megatron turns bucketing off).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from workload.llm.model import LayerParams, ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan
from workload.llm.program import Program
from workload.llm.sizes import FP8_BYTES, kind_tensors
from workload.schema import CollectiveType

AR, AG, RS = CollectiveType.ALL_REDUCE, CollectiveType.ALL_GATHER, CollectiveType.REDUCE_SCATTER
GEMM_TENSORS = ("qkv", "q_down", "kv_down", "q_up", "kv_up", "attn_out", "mlp_in", "mlp_out", "expert_in",
                "expert_out", "shared_in", "shared_out", "mtp_proj", "lm_head", "mamba_in", "mamba_out")


@dataclass(slots=True)
class Bucket:
    """Gradients reduced together: their group kind, parameters (all, and in FP8 GEMM weights) and tensors."""

    index: int
    kind: str
    params: int = 0
    fp8_params: int = 0
    tensors: list[tuple[str, str]] = field(default_factory=list)  # (unit, tensor)


class GradientSync:
    """Adds one stage's gradient and parameter collectives (see the module docstring)."""

    def __init__(self, program: Program, model: ModelConfig, plan: ParallelPlan, options: TrainingOptions,
                 stage: int, chunk_units: list[list[str]]) -> None:
        self.prog, self.m, self.p, self.o = program, model, plan, options
        self.first, self.last = stage == 0, stage == plan.pp - 1
        self.dense = "dpcp" if plan.cp > 1 else "dp"
        self.d = model.dtype_bytes
        self.grad_bytes = options.grad_bytes(model.dtype_bytes)
        self.mode = "fsdp" if plan.zero_stage == 3 else (
            "bucket" if options.bucket_params(plan.dp, plan.cp) is not None else "layer")
        overlap = options.overlap_grad_reduce
        self.overlap = plan.zero_stage in (0, 2) if overlap is None else overlap
        # per layer kind (ModelConfig.layer_kind)
        kinds = {model.layer_kind(i) for i in range(model.num_layers + model.mtp_layers)}
        self.layers = {kind: model.kind_params(kind, plan.tp, plan.ep, plan.expert_tp) for kind in kinds}
        self.tensor_sets = {kind: kind_tensors(model, plan, kind) for kind in kinds}
        vocab_rows = plan.padded_vocab(model) // plan.tp * model.hidden_size
        shared = model.shares_embedding(plan.pp)
        self.embedding_params = vocab_rows if shared and (self.first or self.last) else 0
        # the last stage's output layer and norm, and its copy of the embeddings where the two are shared (tied,
        # or untied and read by multi-token prediction: a copy beside the output layer)
        copies = (0 if model.tied_embeddings else 1) + (1 if shared else 0)
        self.head_params = model.norm_params() + copies * vocab_rows if self.last else 0
        self.input_params = vocab_rows + model.embedding_params() - model.vocab_size * model.hidden_size \
            if self.first else 0
        self.root_params = self.head_params + self.input_params
        self.units = [u for units in chunk_units for u in units]
        self.gathers: list[int] = []  # ZeRO-3 parameter all-gathers, in issue order
        self.unit_ends: list[int] = []  # last compute node of each layer pass, in program order
        self.last_sync: dict[tuple[str, str], int] = {}  # (unit or bucket, group kind) -> last gradient collective
        self.final_syncs: list[int] = []
        self.buckets: list[Bucket] = []
        self.closing: dict[tuple[str, str], list[Bucket]] = {}  # (unit, tensor) -> buckets it completes
        self.bucket_of: dict[str, list[Bucket]] = {}  # unit -> buckets holding its tensors
        self.param_gathers: dict[int, int] = {}  # position in the gather list -> its all-gather (overlapped)
        self.gather_ahead = False  # overlap_param_gather: all-gathers dispatched one ahead of the forward
        self.dispatched = 0  # positions of the gather list issued so far
        self.last_gather: list[int] = []
        if self.mode == "bucket":
            for chunk, units in enumerate(chunk_units):
                self._fill_buckets(chunk, units)

    # --- sizes -------------------------------------------------------------------------------------------
    def shard(self, params: int, kind: str) -> int:
        """Parameters per rank after ZeRO sharding over the group ``kind``."""
        p = self.p
        n = {"dp": p.dp, "dpcp": p.dp * p.cp, "edp": p.tp * p.cp * p.dp // (p.expert_tp * p.ep)}[kind]
        return -(-params // n) if p.zero_stage >= 1 else params

    def unit_params(self, unit: str) -> list[tuple[str, int]]:
        if unit == "root":
            return [(self.dense, self.root_params)]
        layer = self.layer(unit)
        return [(self.dense, layer.dense), ("edp", layer.expert)]

    def _kind(self, unit: str) -> tuple[str, bool]:
        """(layer unit ``unit``'s kind (ModelConfig.layer_kind), whether it is a multi-token-prediction depth's)."""
        index = int(unit.removeprefix("layer"))
        return self.m.layer_kind(index), index >= self.m.num_layers

    def _shares_weights(self, unit: str) -> bool:
        """Whether ``unit`` is a multi-token-prediction depth running the first depth's stored block (a repeated
        layer): its gradient accumulates into that block's, complete after the first depth's backward (the
        depths' backward runs last depth first)."""
        return self.m.mtp_repeated_layer and int(unit.removeprefix("layer")) > self.m.num_layers

    def layer(self, unit: str) -> LayerParams:
        """The parameters of layer unit ``unit`` ("layerN"; N >= the model's layers: a multi-token-prediction
        depth's layer with its projection and norms; none of its own for a repeated layer's later depths) on this
        rank."""
        kind, mtp = self._kind(unit)
        layer = self.layers[kind]
        if not mtp:
            return layer
        if self._shares_weights(unit):
            return LayerParams(0, 0, 0, 0)
        proj, norms = self.m.mtp_params(self.p.tp)
        return replace(layer, dense=layer.dense + proj + norms, dense_matmul=layer.dense_matmul + proj,
                       replicated=layer.replicated + norms)

    def tensors(self, unit: str) -> dict[str, tuple[str, int]]:
        """The weight tensors of layer unit ``unit`` (see sizes.tensor_params), in backward order."""
        kind, mtp = self._kind(unit)
        if not mtp:
            return self.tensor_sets[kind]
        if self._shares_weights(unit):
            return {}
        return {**self.tensor_sets[kind], "mtp_proj": ("dense", sum(self.m.mtp_params(self.p.tp)))}

    def _unit_fp8(self, unit: str, kind: str) -> int:
        if unit == "root":
            return 0
        return sum(n for name, (buf, n) in self.tensors(unit).items()
                   if name in GEMM_TENSORS and (buf == "expert") == (kind == "edp"))

    def param_bytes(self, params: int, fp8_params: int, kind: str) -> int:
        """Bytes per rank of a parameter all-gather (the shard): FP8 GEMM weights with fp8_param_gather."""
        if not self.o.fp8_param_gather:
            return self.shard(params, kind) * self.d
        total = fp8_params * FP8_BYTES + (params - fp8_params) * self.d
        return self.shard(total, kind)

    # --- ZeRO 3 ------------------------------------------------------------------------------------------
    def gather(self, name: str, unit: str, phase: str) -> list[int]:
        """ZeRO-3: all-gather a unit's parameters, prefetched while the unit before the previous one computes."""
        if self.p.zero_stage != 3 or (phase == "bwd" and not self.o.reshard_after_forward):
            return []
        out = []
        for kind, params in self.unit_params(unit):
            got = self.prog.coll_id(f"{name}_{kind}_param_allgather", kind, AG,
                                    self.param_bytes(params, self._unit_fp8(unit, kind), kind),
                                    self.gathers[-1:] + self.unit_ends[-2:-1], phase)
            if got is not None:
                self.gathers.append(got)
                out.append(got)
        return out

    def unit_end(self) -> None:
        self.unit_ends.append(self.prog.last_compute)

    # --- gradients ---------------------------------------------------------------------------------------
    def _reduce(self, name: str, key: str, kind: str, params: int, deps: list[int], final: bool) -> None:
        ctype = AR if self.p.zero_stage == 0 else RS
        prev = [self.last_sync[key, kind]] if (key, kind) in self.last_sync else []
        what = "allreduce" if ctype == AR else "reducescatter"
        got = self.prog.coll_id(f"{name}_{kind}_grad_{what}", kind, ctype, params * self.grad_bytes, deps + prev,
                                "sync")
        if got is not None:
            self.last_sync[key, kind] = got
            if final:
                self.final_syncs.append(got)

    def after_backward(self, unit: str, end: list[int], micro_batch: int) -> None:
        """A unit's backward is done: reduce its gradients now if this mode does so per unit."""
        is_last = micro_batch == self.p.num_micro_batches - 1
        if self.mode == "fsdp":
            now = self.o.fsdp_grad_sync == "every" or is_last
        else:
            now = self.mode == "layer" and self.overlap and is_last
        if now:
            for kind, params in self.unit_params(unit):
                self._reduce(f"mb{micro_batch}.bwd.{unit}", unit, kind, params, end, is_last)

    def tensor_ready(self, unit: str, tensor: str, node: list[int], micro_batch: int) -> None:
        """A weight tensor's gradient is complete (bucket mode): reduce the buckets it closes."""
        if self.mode != "bucket" or not self.overlap or micro_batch != self.p.num_micro_batches - 1:
            return
        for bucket in self.closing.get((unit, tensor), []):
            self._reduce(f"mb{micro_batch}.bwd.bucket{bucket.index}", f"bucket{bucket.index}", bucket.kind,
                         bucket.params, node, True)

    def _fill_buckets(self, chunk: int, units: list[str]) -> None:
        """Megatron's buckets of one model chunk: its weight tensors in backward order, per buffer (dense, expert)."""
        limit = self.o.bucket_params(self.p.dp, self.p.cp)
        if self.p.pp > 1 and (not self.first or chunk > 0):
            limit = None  # one bucket: this chunk's gradients are off the critical path (Megatron)
        pieces: list[tuple[str, str, str, int]] = []
        for unit in reversed(units):
            if unit == "root":
                continue
            for name, (buf, n) in self.tensors(unit).items():
                pieces.append((unit, name, self.dense if buf == "dense" else "edp", n))
        if "root" in units:
            pieces = [("root", "lm_head", self.dense, self.head_params), *pieces,
                      ("root", "embedding", self.dense, self.input_params)]
        open_: dict[str, Bucket] = {}
        for unit, name, kind, n in pieces:
            if n == 0 or kind not in self.prog.kinds:
                continue
            bucket = open_.get(kind)
            if bucket is None:
                bucket = open_[kind] = Bucket(len(self.buckets), kind)
                self.buckets.append(bucket)
            bucket.params += n
            bucket.fp8_params += n if name in GEMM_TENSORS and name != "lm_head" else 0
            bucket.tensors.append((unit, name))
            self.bucket_of.setdefault(unit, [])
            if bucket not in self.bucket_of[unit]:
                self.bucket_of[unit].append(bucket)
            if limit is not None and bucket.params >= limit:
                self.closing.setdefault((unit, name), []).append(bucket)
                del open_[kind]
        for bucket in open_.values():
            self.closing.setdefault(bucket.tensors[-1], []).append(bucket)

    # --- the end of the iteration --------------------------------------------------------------------------
    def remaining(self, end: list[int]) -> None:
        """Gradient collectives left after the backward passes (those not reduced during them)."""
        units = self.units
        if self.mode == "layer" and not self.overlap:
            for unit in reversed(units):
                for kind, params in self.unit_params(unit):
                    self._reduce(unit, unit, kind, params, end, True)
        elif self.mode == "bucket" and not self.overlap:
            for b in self.buckets:
                self._reduce(f"bucket{b.index}", f"bucket{b.index}", b.kind, b.params, end, True)

    def root_buckets(self) -> set[str]:
        """The buckets holding the embedding's or the output layer's gradients (bucket mode)."""
        return {f"bucket{b.index}" for b in self.bucket_of.get("root", [])}

    def local_params(self) -> int:
        """Parameters this rank updates (its shard with ZeRO >= 1)."""
        return sum(self.shard(params, kind) for unit in self.units for kind, params in self.unit_params(unit))

    def _gather_list(self) -> list[tuple[str, str, int, int]]:
        """The distributed optimizer's parameter all-gathers in forward order: (name, kind, params, fp8 params)."""
        if self.mode == "bucket":
            return [(f"bucket{b.index}", b.kind, b.params, b.fp8_params) for b in reversed(self.buckets)]
        return [(unit, kind, params, self._unit_fp8(unit, kind)) for unit in self.units
                for kind, params in self.unit_params(unit)]

    def after_step(self, step: list[int]) -> None:
        """ZeRO 1 and 2: all-gather the updated parameters after the optimizer step (unless overlapped with the
        next iteration's forward: see start)."""
        if self.p.zero_stage not in (1, 2) or self.o.overlap_param_gather:
            return
        for name, kind, params, fp8 in self._gather_list():
            self.prog.coll(f"{name}_{kind}_param_allgather", kind, AG, self.param_bytes(params, fp8, kind), step,
                           "optimizer")

    def start(self) -> None:
        """With overlap_param_gather: the first parameter all-gather (of the previous step's update) at the start
        of the iteration; the next ones follow in forward order as the forward reaches them (first_use)."""
        self.gather_ahead = self.p.zero_stage in (1, 2) and self.o.overlap_param_gather
        if self.gather_ahead:
            self._dispatch_through(0, [])

    def _dispatch_through(self, index: int, gate: list[int]) -> None:
        """Issue the parameter all-gathers up to ``index`` of the gather list (each after the one before and
        after ``gate``)."""
        gathers = self._gather_list()
        while self.dispatched <= min(index, len(gathers) - 1):
            name, kind, params, fp8 = gathers[self.dispatched]
            got = self.prog.coll_id(f"{name}_{kind}_param_allgather", kind, AG, self.param_bytes(params, fp8, kind),
                                    sorted({*self.last_gather, *gate}), "fwd")
            if got is not None:
                self.param_gathers[self.dispatched] = got
                self.last_gather = [got]
            self.dispatched += 1

    def first_use(self, unit: str, tensor: str | None = None) -> list[int]:
        """The parameter all-gathers ``unit``'s first forward waits for (overlap_param_gather); in bucket mode
        ``tensor`` narrows it to the buckets holding that tensor of the unit (the embedding waits for its own
        bucket at the start of the forward, the final norm and output layer for theirs at its end: Megatron's
        forward pre-hook waits per module).

        Waiting for a bucket's all-gather dispatches the next bucket's (Megatron-Core r0.8's
        _finish_param_sync_helper, one bucket ahead so that communication kernels do not block compute kernels
        in the single hardware queue of CUDA_DEVICE_MAX_CONNECTIONS=1): it starts once that one is done and the
        kernel before this module has started (it is queued behind the kernels issued before it)."""
        if not self.gather_ahead:
            return []
        gathers = self._gather_list()
        if self.mode == "bucket":
            wanted = {f"bucket{b.index}" for b in self.bucket_of.get(unit, [])
                      if tensor is None or (unit, tensor) in b.tensors}
            indices = [i for i, g in enumerate(gathers) if g[0] in wanted]
        else:
            indices = [i for i, g in enumerate(gathers) if g[0] == unit]
        if not indices:
            return []
        gate = [self.prog.prev_compute] if self.prog.prev_compute else []
        self._dispatch_through(max(indices), gate)
        self._dispatch_through(max(indices) + 1, gate)
        return sorted(self.param_gathers[i] for i in indices if i in self.param_gathers)
