"""One rank's Chakra nodes for an ASTRA-sim 1.0 text workload, following ASTRA-sim 1.0's training loops.

What each parallelism does per pass (t = layer index, L layers; "waits" = a dependency):
- DATA: forward computes 0..L-1; backward from L-1: weight-gradient compute, its collective over all NPUs
  (not waited for), then the input-gradient compute (none for layer 0). A layer's next forward waits for
  its weight-gradient collective.
- MODEL / HYBRID_DATA_MODEL / HYBRID_MODEL_DATA: forward compute then its collective, waited for (model
  group; all NPUs for MODEL); backward per layer: input-gradient compute, its collective (t > 0, not waited
  for until the layer is done), weight-gradient compute, its collective over the data group (none in MODEL).
- HYBRID_TRANSFORMER: like the hybrids but the input-gradient collective is waited for (also at t = 0).
  _FWD_IN_BCKWD additionally recomputes the forward from the nearest checkpoint before the input gradient
  of each initiating layer. With pp > 1 or ga > 1 each stage runs its micro-batches in a 1F1B schedule,
  sending activations / gradients of pp_comm bytes to the neighbouring stages; weight-gradient
  collectives follow the last micro-batch.
- HYBRID_DLRM(_ENHANCED): like DATA, plus layer 0's forward all-to-all (waited for by the layer after the
  last bottom layer) and layer 0's input-gradient all-to-all issued after the input gradient of that layer
  (waited for at the end of the pass by HYBRID_DLRM only).
- MICRO: every layer's weight-gradient collective, one after another. DISTRIBUTED_INFERENCE: forward only.
Each pass starts when the previous one has ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workload.convert.text_format import DLRM, TRANSFORMER, Comm, Layer
from workload.convert.text_layout import GroupTable, Layout
from workload.groups import process_groups_node
from workload.schema import CollectiveType, NodeType
from workload.writer import make_node

Ids = list[int]
# Communicator of each phase's collectives per parallelism: "all" NPUs, the "model" or "data" group, or None
# when ASTRA-sim 1.0 never issues that phase's collective.
PHASE_GROUPS: dict[str, tuple[str | None, str | None, str | None]] = {
    "MICRO": (None, None, "all"),
    "DATA": (None, None, "all"),
    "MODEL": ("all", "all", None),
    "HYBRID_DATA_MODEL": ("model", "model", "data"),
    "HYBRID_MODEL_DATA": ("model", "model", "data"),
    "HYBRID_DLRM": ("all", "all", "all"),
    "HYBRID_DLRM_ENHANCED": ("all", "all", "all"),
    "HYBRID_TRANSFORMER": ("model", "model", "data"),
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD": ("model", "model", "data"),
    "DISTRIBUTED_INFERENCE": ("all", None, None),
}


@dataclass(frozen=True, slots=True)
class Plan:
    keyword: str
    layers: tuple[Layer, ...]
    layout: Layout
    passes: int = 1
    micro_batches: int = 1
    pp_comm_bytes: int = 0
    recompute: dict[int, tuple[int, ...]] = field(default_factory=dict)  # initiating layer -> layers to redo
    last_bottom_layer: int = 0  # DLRM


class Clock:
    """Whole-µs durations from ns, carrying each rounding remainder into the next node so that the rank's
    total compute time stays within 0.5 µs of the exact sum."""

    def __init__(self) -> None:
        self.exact_ns = 0.0
        self.emitted_us = 0
        self.max_shift_ns = 0.0

    def duration_us(self, time_ns: float) -> int:
        self.exact_ns += time_ns
        us = max(0, round(self.exact_ns / 1000) - self.emitted_us)
        self.emitted_us += us
        self.max_shift_ns = max(self.max_shift_ns, abs(us * 1000 - time_ns))
        return us


class RankProgram:
    """Emits one rank's nodes; ids start at 1 (0 is the METADATA node declaring the rank's groups)."""

    def __init__(self, rank: int, layout: Layout, groups: GroupTable) -> None:
        self.rank = rank
        self.layout = layout
        self.groups = groups
        self.clock = Clock()
        self.nodes: list[Any] = []
        self.used_groups: set[int] = set()
        self.dropped_single = 0  # collectives over one-rank groups (nothing to communicate)

    def _add(self, name: str, node_type: NodeType, deps: Iterable[int], **kwargs: Any) -> Ids:
        node_id = len(self.nodes) + 1
        self.nodes.append(make_node(node_id, name, node_type, data_deps=list(dict.fromkeys(deps)), **kwargs))
        return [node_id]

    def compute(self, name: str, time_ns: float, deps: Ids) -> Ids:
        """A compute node after ``deps`` (its id), or ``deps`` itself when the time is zero."""
        if time_ns <= 0:
            return deps
        return self._add(name, NodeType.COMP_NODE, deps, duration_micros=self.clock.duration_us(time_ns),
                         attrs=[("is_cpu_op", False)])

    def collective(self, name: str, comm: Comm | None, kind: str | None, deps: Ids) -> Ids:
        """The collective(s) of ``comm`` over the rank's ``kind`` group (the word's _EP/_DP_EP group first);
        returns the last one's id, or [] when there is nothing to communicate."""
        if comm is None or kind is None:
            return []
        members = self.layout.group(self.rank, comm.group or kind) if (comm.group or kind) != "all" \
            else tuple(range(self.layout.npus))
        if len(members) == 1:
            self.dropped_single += 1
            return []
        pg = self.groups.pg_name(members)
        last = deps
        for ctype in comm.types:
            attrs: list[tuple[str, Any]] = [("is_cpu_op", False), ("comm_type", int(ctype)),
                                            ("comm_size", comm.size_bytes)]
            if pg:
                attrs.append(("pg_name", pg))
                self.used_groups.add(int(pg))
            suffix = "" if len(comm.types) == 1 else f".{CollectiveType(ctype).name.lower()}"
            last = self._add(name + suffix, NodeType.COMM_COLL_NODE, last, attrs=attrs)
        return last

    def point_to_point(self, name: str, send: bool, peer: int, size_bytes: int, tag: int, deps: Ids) -> Ids:
        src, dst = (self.rank, peer) if send else (peer, self.rank)
        return self._add(name, NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE, deps, attrs=[
            ("is_cpu_op", False), ("comm_src", src), ("comm_dst", dst), ("comm_size", size_bytes),
            ("comm_tag", tag)])

    def finished_nodes(self) -> list[Any]:
        groups = self.groups.members()
        declared = {gid: groups[gid] for gid in sorted(self.used_groups)}
        head = [process_groups_node(0, declared)] if declared else []
        return head + self.nodes


def build_rank(plan: Plan, rank: int, groups: GroupTable) -> RankProgram:
    """Emit every pass of ``plan`` for one rank."""
    p = RankProgram(rank, plan.layout, groups)
    if plan.keyword == "MICRO":
        _micro(p, plan)
    elif plan.keyword == "DATA" or plan.keyword in DLRM:
        _data_or_dlrm(p, plan)
    elif plan.keyword == "DISTRIBUTED_INFERENCE":
        end: Ids = []
        for ps in range(plan.passes):
            end = _forward(p, plan, f"p{ps}.", plan.layers, end, {})
    else:
        _model_family(p, plan)
    return p


def _micro(p: RankProgram, plan: Plan) -> None:
    prev: Ids = []
    for ps in range(plan.passes):
        for layer in plan.layers:
            prev = p.collective(f"p{ps}.{layer.name}.wg_comm", layer.wg.comm, "all", prev) or prev


def _data_or_dlrm(p: RankProgram, plan: Plan) -> None:
    dlrm = plan.keyword in DLRM
    bottom = plan.last_bottom_layer
    first = plan.layers[0]
    wg_done: dict[int, Ids] = {}
    end: Ids = []
    for ps in range(plan.passes):
        tag = f"p{ps}."
        prev, embedding_a2a, embedding_grad = end, [], []
        for layer in plan.layers:
            deps = prev + wg_done.get(layer.index, [])
            if dlrm and layer.index == bottom + 1:
                deps += embedding_a2a
            prev = p.compute(f"{tag}{layer.name}.fwd", layer.fwd.compute_ns, deps)
            if dlrm and _is_all_to_all(layer.fwd.comm):
                a2a = p.collective(f"{tag}{layer.name}.fwd_comm", layer.fwd.comm, "all", prev)
                if layer.index == 0:
                    embedding_a2a = a2a
        for layer in reversed(plan.layers):
            prev = p.compute(f"{tag}{layer.name}.wg", layer.wg.compute_ns, prev)
            wg_done[layer.index] = p.collective(f"{tag}{layer.name}.wg_comm", layer.wg.comm, "all", prev)
            if layer.index > 0:
                prev = p.compute(f"{tag}{layer.name}.ig", layer.ig.compute_ns, prev)
                if dlrm and layer.index == bottom + 1:
                    embedding_grad = p.collective(f"{tag}{first.name}.ig_comm", first.ig.comm, "all", prev)
        end = prev + (embedding_grad if plan.keyword == "HYBRID_DLRM" else [])


def _is_all_to_all(comm: Comm | None) -> bool:
    return comm is not None and comm.types == (CollectiveType.ALL_TO_ALL,)


def _forward(p: RankProgram, plan: Plan, tag: str, layers: Sequence[Layer], prev: Ids, wg_done: dict[int, Ids],
             phase: str = "fwd") -> Ids:
    """Forward computes, each followed by its collective, which the next layer waits for."""
    fwd_kind = PHASE_GROUPS[plan.keyword][0]
    for layer in layers:
        prev = p.compute(f"{tag}{layer.name}.{phase}", layer.fwd.compute_ns, prev + wg_done.get(layer.index, []))
        prev = p.collective(f"{tag}{layer.name}.{phase}_comm", layer.fwd.comm, fwd_kind, prev) or prev
    return prev


def _backward(p: RankProgram, plan: Plan, tag: str, prev: Ids, wg_done: dict[int, Ids] | None) -> Ids:
    """Input and weight gradients from the last layer down; weight-gradient collectives only when
    ``wg_done`` is given (it collects them)."""
    _, ig_kind, wg_kind = PHASE_GROUPS[plan.keyword]
    transformer = plan.keyword in TRANSFORMER
    for layer in reversed(plan.layers):
        redo = plan.recompute.get(layer.index)
        if redo:
            prev = _forward(p, plan, tag, [plan.layers[k] for k in redo], prev, {}, "fwd_recompute")
        ig = p.compute(f"{tag}{layer.name}.ig", layer.ig.compute_ns, prev)
        ig_comm: Ids = []
        if transformer or layer.index > 0:
            ig_comm = p.collective(f"{tag}{layer.name}.ig_comm", layer.ig.comm, ig_kind, ig)
        wg = p.compute(f"{tag}{layer.name}.wg", layer.wg.compute_ns, (ig_comm or ig) if transformer else ig)
        if wg_done is not None:
            wg_done[layer.index] = p.collective(f"{tag}{layer.name}.wg_comm", layer.wg.comm, wg_kind, wg)
        prev = wg if transformer else wg + ig_comm
    return prev


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The 1F1B order of a stage's forward ("F", m) and backward ("B", m) micro-batch steps."""
    warmup = min(stages - 1 - stage, micro_batches)
    order = [("F", m) for m in range(warmup)]
    for m in range(micro_batches - warmup):
        order += [("F", warmup + m), ("B", m)]
    return order + [("B", m) for m in range(micro_batches - warmup, micro_batches)]


def _model_family(p: RankProgram, plan: Plan) -> None:
    layout, count = plan.layout, plan.micro_batches
    stage = layout.coords(p.rank)[2]
    before, after = layout.stage_peer(p.rank, -1), layout.stage_peer(p.rank, 1)
    wg_done: dict[int, Ids] = {}
    end: Ids = []
    for ps in range(plan.passes):
        prev = end
        activations: dict[int, Ids] = {}
        gradients: dict[int, Ids] = {}
        for m in range(count):
            tag = _tag(ps, m, count)
            if before is not None:
                activations[m] = p.point_to_point(f"{tag}recv_activation", False, before, plan.pp_comm_bytes,
                                                  _p2p_tag(ps, m, count, 0), end)
            if after is not None:
                gradients[m] = p.point_to_point(f"{tag}recv_gradient", False, after, plan.pp_comm_bytes,
                                                _p2p_tag(ps, m, count, 1), end)
        waits_for = dict(wg_done)
        for step, m in one_f_one_b(stage, layout.pp, count):
            tag = _tag(ps, m, count)
            if step == "F":
                prev = _forward(p, plan, tag, plan.layers, prev + activations.get(m, []), waits_for)
                waits_for = {}
                if after is not None:
                    p.point_to_point(f"{tag}send_activation", True, after, plan.pp_comm_bytes,
                                     _p2p_tag(ps, m, count, 0), prev)
            else:
                last = m == count - 1
                prev = _backward(p, plan, tag, prev + gradients.get(m, []), wg_done if last else None)
                if before is not None:
                    p.point_to_point(f"{tag}send_gradient", True, before, plan.pp_comm_bytes,
                                     _p2p_tag(ps, m, count, 1), prev)
        end = prev


def _tag(ps: int, m: int, count: int) -> str:
    return f"p{ps}." + (f"mb{m}." if count > 1 else "")


def _p2p_tag(ps: int, m: int, count: int, direction: int) -> int:
    return 2 * (ps * count + m) + direction
