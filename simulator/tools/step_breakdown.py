"""Where one simulated training step went, on its slowest rank: compute by kernel class, communication left
exposed (not hidden under compute) by communicator kind, and the pipeline bubble.

The generator names every node, and its stage programs say what each name is (a kernel of class matmul,
attention, elementwise or optimizer; a collective on a tp/dp/ep/edp/emb/cp group; a step of a cp or tp ring,
whose sends and receives are that group's communication; a pipeline send or receive). The run's per-node spans
(kept when a run records a timeline) are grouped by those names:

- compute of a class = the summed time of its kernels (kernels run one at a time on a rank's stream), and
  their number;
- exposed communication of a kind = the time its collectives run while no kernel does (kinds can overlap
  each other, so these can add up to more than the exposed total, which is given too);
- exposed host time = the time a host-side node (the host issuing a block of kernels, workload/llm/host.py) runs
  while no kernel, no collective and no pipeline transfer does: the GPU waits for the host;
- bubble = the rest of the step: the rank idles or waits for a pipeline send/receive (a receive counts from
  when it is posted until its data arrives).

A mixture-of-experts step also gives its experts' part of the compute by class (``expert_compute_ns_by_class``):
the routed tokens' grouped GEMMs, permutations, sorts, activations, casts and biases (the generator's
``expert_*``, ``permute``, ``unpermute``, ``sort_chunks``, ``unsort_chunks``, ``rdma_staging`` nodes and the
activation of a layer with experts); the rest of the compute is the attention, the router, dense layers and the
shared expert (benchmarks/moe_gap.py reads it).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from simulator.breakdown import union_ns
from workload.schema import NodeType

PP = "pp"
HOST = "host"
EXPERT_NODES = ("permute", "unpermute", "sort_chunks", "unsort_chunks", "rdma_staging")


def expert_node_names(programs: list[Any]) -> frozenset[str]:
    """The names of the routed experts' compute nodes (see the module's docstring)."""
    moe_layers = {op.name.rsplit(".", 1)[0] for p in programs for op in p.ops
                  if op.name.rsplit(".", 1)[-1].startswith("expert_in")}
    out = set()
    for p in programs:
        for op in p.ops:
            if op.node_type != NodeType.COMP_NODE or op.host_us is not None:
                continue
            layer, short = op.name.rsplit(".", 1) if "." in op.name else ("", op.name)
            if short.startswith("expert_") or short in EXPERT_NODES or (
                    short.startswith("activation") and layer in moe_layers):
                out.add(op.name)
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class NodeKinds:
    """Node name -> what it is: ("compute", kernel class), ("comm", group kind) or ("host", "").

    Sends and receives carry their group too: "pp" for the pipeline's transfers (a wait there is the bubble), the
    group kind for a ring's steps (context-parallel K/V, tensor-parallel overlap), which are communication."""

    kinds: dict[str, tuple[str, str]]
    experts: frozenset[str] = frozenset()  # the routed experts' compute nodes (expert_node_names)

    @classmethod
    def of_programs(cls, programs: list[Any]) -> NodeKinds:
        kinds: dict[str, tuple[str, str]] = {}
        for program in programs:
            for op in program.ops:
                if op.host_us is not None:
                    kinds[op.name] = (HOST, "")
                elif op.node_type == NodeType.COMP_NODE:
                    kinds[op.name] = ("compute", op.kernel.category if op.kernel is not None else "other")
                elif op.node_type in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
                    kinds[op.name] = ("comm", op.group or PP)
                elif op.node_type == NodeType.COMM_COLL_NODE:
                    kinds[op.name] = ("comm", op.group or "world")
        return cls(kinds, expert_node_names(programs))


def step_breakdown(workload: Any, finish_ns: int, kinds: NodeKinds) -> dict[str, Any]:
    """The breakdown of one simulated rank (a RankWorkload run with a timeline)."""
    if workload.timeline is None:
        raise ValueError("the breakdown needs the run's per-node spans (RunOptions(timeline=True))")
    graph = workload.graph
    compute_ns: dict[str, int] = defaultdict(int)
    expert_ns: dict[str, int] = defaultdict(int)
    kernels: dict[str, int] = defaultdict(int)
    compute: list[tuple[int, int]] = []
    comm: dict[str, list[tuple[int, int]]] = defaultdict(list)
    host: list[tuple[int, int]] = []
    for i, start, end in workload.timeline.spans:
        name = graph.name(i)
        kind = kinds.kinds.get(name)
        if kind is None:
            continue
        if kind[0] == HOST:
            host.append((start, end))
        elif kind[0] == "compute":
            compute_ns[kind[1]] += end - start
            if name in kinds.experts:
                expert_ns[kind[1]] += end - start
            kernels[kind[1]] += 1
            compute.append((start, end))
        else:
            comm[kind[1]].append((start, end))
    busy = union_ns(compute)
    exposed = {k: union_ns(compute + iv) - busy for k, iv in sorted(comm.items())}
    collectives = [span for k, iv in comm.items() if k != PP for span in iv]
    exposed_total = union_ns(compute + collectives) - busy
    # the host's time counts as exposed only where the rank waits neither for a collective nor for a pipeline
    # transfer (a rank idle at a receive is in the bubble even while its host issues ahead)
    waited = compute + collectives + comm.get(PP, [])
    exposed_host = union_ns(waited + host) - union_ns(waited) if host else 0
    out = {"rank": workload.rank, "step_ns": finish_ns, "compute_busy_ns": busy,
           "compute_ns_by_class": dict(sorted(compute_ns.items())),
           "kernels_by_class": dict(sorted(kernels.items())), "exposed_comm_ns_by_kind": exposed,
           "exposed_collectives_ns": exposed_total, "exposed_host_ns": exposed_host,
           "bubble_ns": finish_ns - busy - exposed_total - exposed_host}
    if kinds.experts:
        out["expert_compute_ns_by_class"] = dict(sorted(expert_ns.items()))
    return out


def slowest_rank(sim: Any, result: Any) -> tuple[Any, Any]:
    """The rank that finishes last (its result) and the workload simulated for it (in a folded run, its class's
    representative)."""
    slow = max(result.ranks, key=lambda r: (r.finish_ns, -r.rank))
    rep = result.representative[slow.rank] if result.representative else slow.rank
    return slow, next(w for w in sim.workloads if w.rank == rep)


def slowest_rank_breakdown(sim: Any, result: Any, kinds: NodeKinds) -> dict[str, Any]:
    """The breakdown of the rank that finishes last (in a folded run, its class's representative)."""
    slow, workload = slowest_rank(sim, result)
    out = step_breakdown(workload, slow.finish_ns, kinds)
    out["rank"] = slow.rank
    return out
