"""``astrasim-py trace inspect``: what a trace set holds, per rank and in total.

Any trace that decodes is summarised: what would stop a simulation (a send without its destination, a
dependency on an absent node, a cycle, ...) is reported beside the summary, not instead of it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from workload.errors import TraceError, printable
from workload.graph import TraceGraph
from workload.limits import format_bytes
from workload.schema import NodeType, collective_name, node_type_name
from workload.validate import Dependencies, resolve_dependencies, topological_order, validate


@dataclass(slots=True)
class RankSummary:
    rank: int
    file: str
    nodes: int
    nodes_by_type: dict[str, int]
    collectives: dict[str, dict[int, int]]  # collective type -> {comm_size bytes: count}
    collective_bytes: int
    send_bytes: int
    recv_bytes: int
    memory_bytes: int
    compute_micros: int  # sum of COMP_NODE duration_micros
    compute_ops: int  # sum of COMP_NODE num_ops
    depth: int  # nodes on the longest dependency chain
    roots: int
    edges: int
    dropped_dangling: int  # dependencies on absent nodes (or of a node on itself), left out of the summary
    version: str
    warnings: list[str] = field(default_factory=list)
    problem: str | None = None  # the first reason the trace would not simulate, if any


def dependency_depth(deps: Dependencies) -> int:
    """The number of nodes on the longest dependency chain."""
    n = len(deps.parent_ptr) - 1
    if n == 0:
        return 0
    owner = np.repeat(np.arange(n), np.diff(deps.parent_ptr))
    if np.all(deps.parents < owner):  # index order is already topological
        order: list[int] | range = range(n)
    else:
        order = topological_order(deps)
    ptr = deps.parent_ptr.tolist()
    parents = deps.parents.tolist()
    depth = [0] * n
    for i in order:
        lo, hi = ptr[i], ptr[i + 1]
        depth[i] = 1 + (max(depth[p] for p in parents[lo:hi]) if hi > lo else 0)
    return max(depth)


def summarize_rank(rank: int, path: str, graph: TraceGraph, drop_dangling: bool = False) -> RankSummary:
    """What one rank's trace holds; attributes of unexpected types count as absent here, and what would stop
    a simulation is recorded in ``problem``."""
    n = graph.num_nodes
    types = graph.types
    kinds, counts = np.unique(types, return_counts=True)
    nodes_by_type = {node_type_name(int(t)): int(c) for t, c in zip(kinds.tolist(), counts.tolist(), strict=True)}
    size, _ = graph.attrs.integers("comm_size", n, strict=False)
    ctype, _ = graph.attrs.integers("comm_type", n, strict=False)
    tensor, _ = graph.attrs.integers("tensor_size", n, strict=False)
    ops, _ = graph.attrs.integers("num_ops", n, strict=False)
    coll = types == NodeType.COMM_COLL_NODE
    collectives: dict[str, dict[int, int]] = {}
    if coll.any():
        pairs, counts = np.unique(np.stack((ctype[coll], size[coll])), axis=1, return_counts=True)
        for (t, s), c in zip(pairs.T.tolist(), counts.tolist(), strict=True):
            collectives.setdefault(collective_name(t), {})[s] = c
    comp = types == NodeType.COMP_NODE
    memory = (types == NodeType.MEM_LOAD_NODE) | (types == NodeType.MEM_STORE_NODE)
    deps = resolve_dependencies(graph, drop_dangling=True)
    return RankSummary(
        rank=rank, file=path, nodes=n, nodes_by_type=nodes_by_type, collectives=collectives,
        collective_bytes=exact_sum(size[coll]),
        send_bytes=exact_sum(size[types == NodeType.COMM_SEND_NODE]),
        recv_bytes=exact_sum(size[types == NodeType.COMM_RECV_NODE]),
        memory_bytes=exact_sum(tensor[memory]),
        compute_micros=exact_sum(graph.duration_micros[comp]),
        compute_ops=exact_sum(ops[comp]),
        depth=dependency_depth(deps), roots=int(np.count_nonzero(deps.num_parents == 0)),
        edges=len(deps.parents), dropped_dangling=deps.dropped_dangling + deps.dropped_self, version=graph.version,
        warnings=list(graph.warnings), problem=simulation_problem(rank, path, graph, drop_dangling),
    )


def simulation_problem(rank: int, path: str, graph: TraceGraph, drop_dangling: bool = False) -> str | None:
    """The first reason the trace would not simulate (as the simulator says it), or None."""
    try:
        validate(graph, drop_dangling=drop_dangling)
    except TraceError as e:
        return str(e.located(path=path, rank=rank))
    return None


def exact_sum(values: np.ndarray) -> int:
    """An exact sum (numpy's int64 sum would wrap around silently)."""
    return sum(values.tolist())


def total(summaries: list[RankSummary]) -> dict[str, Any]:
    """Totals over ranks (collective counts are summed per type and size)."""
    out: dict[str, Any] = {"ranks": len(summaries)}
    for key in ("nodes", "collective_bytes", "send_bytes", "recv_bytes", "memory_bytes", "compute_micros",
                "compute_ops", "edges", "dropped_dangling"):
        out[key] = sum(getattr(s, key) for s in summaries)
    by_type: Counter[str] = Counter()
    colls: dict[str, Counter[int]] = {}
    for s in summaries:
        by_type.update(s.nodes_by_type)
        for t, sizes in s.collectives.items():
            colls.setdefault(t, Counter()).update(sizes)
    out["nodes_by_type"] = dict(sorted(by_type.items()))
    out["collectives"] = {t: dict(sorted(c.items())) for t, c in sorted(colls.items())}
    out["max_depth"] = max((s.depth for s in summaries), default=0)
    return out


def as_json(summaries: list[RankSummary], shared: bool) -> dict[str, Any]:
    return {"shared_file": shared, "total": total(summaries), "ranks": [asdict(s) for s in summaries]}


def format_text(summaries: list[RankSummary], shared: bool, per_rank: bool) -> str:
    t = total(summaries)
    lines = []
    if shared:
        lines.append(f"one trace file, run by every rank: {printable(summaries[0].file)}")
    lines.append(f"ranks: {t['ranks']}   nodes: {t['nodes']}   dependency edges: {t['edges']}   "
                 f"longest dependency chain: {t['max_depth']} nodes")
    versions = sorted({s.version or "(none)" for s in summaries})
    lines.append(f"Chakra schema version: {', '.join(printable(v) for v in versions)}")
    lines.append("nodes by type: " + ", ".join(f"{k} {v}" for k, v in t["nodes_by_type"].items()))
    if t["collectives"]:
        lines.append("collectives (type: size x count, over all ranks):")
        for ctype, sizes in t["collectives"].items():
            lines.append(f"  {ctype}: " + ", ".join(f"{format_bytes(s)} x {c}" for s, c in sizes.items()))
    lines.append(f"bytes: collectives {format_bytes(t['collective_bytes'])}, sends {format_bytes(t['send_bytes'])}, "
                 f"receives {format_bytes(t['recv_bytes'])}, remote memory {format_bytes(t['memory_bytes'])}")
    lines.append(f"compute: {t['compute_micros']} µs recorded duration, {t['compute_ops']:.3e} ops")
    if t["dropped_dangling"]:
        lines.append(f"dependencies on absent nodes or of nodes on themselves, left out: {t['dropped_dangling']}")
    problems = [s.problem for s in summaries if s.problem]
    if problems:
        more = f" (and {len(problems) - 1} more rank(s))" if len(problems) > 1 else ""
        lines.append(f"would not simulate as is: {printable(problems[0])}{more}")
    if per_rank and len(summaries) > 1:
        lines.append("")
        lines.append(f"{'rank':>5} {'nodes':>9} {'depth':>7} {'coll bytes':>12} {'compute µs':>12}  file")
        for s in summaries:
            lines.append(f"{s.rank:>5} {s.nodes:>9} {s.depth:>7} {format_bytes(s.collective_bytes):>12} "
                         f"{s.compute_micros:>12}  {printable(s.file)}")
    return "\n".join(lines)
