"""Statistics that describe a workload's character: node-type mix, value distributions and graph shape.

Used for a profile's summary (aggregated only: histograms and quantiles, no per-node values) and for the
fidelity report that compares an original workload with a synthetic one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workload.graph import TraceGraph
from workload.groups import metadata_groups
from workload.schema import CollectiveType, NodeType
from workload.validate import Dependencies, topological_order, validate

COMM_TYPES = (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)
QUANTILES = (0.1, 0.5, 0.9)


def coarse_kind(node_type: int) -> str:
    if node_type == NodeType.COMP_NODE:
        return "compute"
    return "comm" if node_type in COMM_TYPES else "other"


def critical_phases(graph: TraceGraph, deps: Dependencies, skip: np.ndarray) -> tuple[int, list[list[Any]]]:
    """(depth in nodes, phases): along the longest dependency chain, weighted by recorded duration + 1 so that
    compute-heavy chains win ties, the runs of compute / communication / other nodes as [kind, count]."""
    n = graph.num_nodes
    if n == 0:
        return 0, []
    weight = graph.duration_micros.astype(np.float64) + 1.0
    weight[skip] = 0.0
    ptr, parents = deps.parent_ptr.tolist(), deps.parents.tolist()
    best = [0.0] * n
    depth = [0] * n
    via = [-1] * n
    for i in topological_order(deps):
        lo, hi = ptr[i], ptr[i + 1]
        if hi > lo:
            p = max(parents[lo:hi], key=lambda q: best[q])
            via[i], best[i] = p, best[p]
            depth[i] = max(depth[q] for q in parents[lo:hi])
        best[i] += float(weight[i])
        depth[i] += 0 if skip[i] else 1
    node = int(np.argmax(best))
    path = []
    while node >= 0:
        if not skip[node]:
            path.append(coarse_kind(int(graph.types[node])))
        node = via[node]
    phases: list[list[Any]] = []
    for kind in reversed(path):
        if phases and phases[-1][0] == kind:
            phases[-1][1] += 1
        else:
            phases.append([kind, 1])
    return max(depth), phases


@dataclass(slots=True)
class TraceStats:
    """Pooled statistics of a set of per-rank traces (group-declaring METADATA nodes left out)."""

    ranks: int = 0
    type_counts: dict[str, int] = field(default_factory=dict)
    collective_sizes: dict[str, list[int]] = field(default_factory=dict)
    p2p_sizes: list[int] = field(default_factory=list)
    compute_us: list[int] = field(default_factory=list)
    compute_ops: list[int] = field(default_factory=list)
    compute_bytes: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    fan_in: list[int] = field(default_factory=list)
    fan_out: list[int] = field(default_factory=list)
    phases: list[int] = field(default_factory=list)  # per rank: runs on the critical path

    @property
    def nodes(self) -> int:
        return sum(self.type_counts.values())

    def type_shares(self) -> dict[str, float]:
        total = self.nodes or 1
        return {name: count / total for name, count in sorted(self.type_counts.items())}


def trace_stats(graphs: Sequence[TraceGraph]) -> TraceStats:
    """Statistics of one trace per rank (pass the same graph object for ranks sharing a file)."""
    stats = TraceStats(ranks=len(graphs))
    seen: dict[int, TraceStats] = {}
    for graph in graphs:
        part = seen.get(id(graph))
        if part is None:
            part = seen[id(graph)] = _graph_stats(graph)
        stats.depth += part.depth
        stats.phases += part.phases
        for name, count in part.type_counts.items():
            stats.type_counts[name] = stats.type_counts.get(name, 0) + count
        for name, sizes in part.collective_sizes.items():
            stats.collective_sizes.setdefault(name, []).extend(sizes)
        for attr in ("p2p_sizes", "compute_us", "compute_ops", "compute_bytes", "fan_in", "fan_out"):
            getattr(stats, attr).extend(getattr(part, attr))
    return stats


def _graph_stats(graph: TraceGraph) -> TraceStats:
    n = graph.num_nodes
    deps = validate(graph)
    skip = np.array([metadata_groups(graph, i) is not None for i in range(n)], dtype=bool) if n else \
        np.zeros(0, dtype=bool)
    keep = ~skip
    types = graph.types.astype(np.int64)
    s = TraceStats(ranks=1)
    for t in np.unique(types[keep]).tolist():
        s.type_counts[NodeType(t).name] = int(np.count_nonzero(types[keep] == t))
    comm_type, _ = graph.attrs.integers("comm_type", n)
    comm_size, has_size = graph.attrs.integers("comm_size", n)
    is_cpu = graph.attrs.integers("is_cpu_op", n)[0] != 0
    coll = (types == NodeType.COMM_COLL_NODE) & has_size & ~is_cpu
    for ct in np.unique(comm_type[coll]).tolist():
        name = CollectiveType(ct).name if 0 <= ct <= max(CollectiveType) else str(ct)
        s.collective_sizes[name] = comm_size[coll & (comm_type == ct)].tolist()
    p2p = ((types == NodeType.COMM_SEND_NODE) | (types == NodeType.COMM_RECV_NODE)) & has_size & ~is_cpu
    s.p2p_sizes = comm_size[p2p].tolist()
    comp = types == NodeType.COMP_NODE
    s.compute_us = graph.duration_micros[comp].astype(np.int64).tolist()
    ops, has_ops = graph.attrs.integers("num_ops", n)
    size, has_bytes = graph.attrs.integers("tensor_size", n)
    s.compute_ops = ops[comp & has_ops].tolist()
    s.compute_bytes = size[comp & has_bytes].tolist()
    s.fan_in = deps.num_parents[keep].tolist()
    s.fan_out = np.diff(deps.child_ptr)[keep].tolist()
    depth, phases = critical_phases(graph, deps, skip)
    s.depth = [depth]
    s.phases = [len(phases)]
    return s


def histogram(values: Sequence[int], cap: int = 8) -> list[int]:
    """Counts of 0, 1, ..., cap-1 and of cap or more (for fan-in / fan-out)."""
    counts = np.bincount(np.minimum(np.asarray(values, dtype=np.int64), cap), minlength=cap + 1)
    return counts.tolist()


def quantiles(values: Sequence[int]) -> list[float]:
    if len(values) == 0:
        return []
    return [float(q) for q in np.quantile(np.asarray(values, dtype=np.float64), QUANTILES)]


def ks_distance(a: Sequence[float], b: Sequence[float], resolution: float = 0.0) -> float:
    """The two-sample Kolmogorov-Smirnov distance (the largest gap between the empirical CDFs), blind to relative
    differences up to ``resolution``: a value may move by that fraction before it counts as different, so that
    rounded values (134,000,000 for 134,217,728) do not read as a different distribution. 1 if exactly one
    sample is empty."""
    if len(a) == 0 or len(b) == 0:
        return 0.0 if len(a) == len(b) else 1.0
    x, y = np.sort(np.asarray(a, dtype=np.float64)), np.sort(np.asarray(b, dtype=np.float64))
    points = np.concatenate((x, y))
    widened = points + np.abs(points) * resolution
    gap_xy = np.searchsorted(x, points, side="right") / len(x) - np.searchsorted(y, widened, side="right") / len(y)
    gap_yx = np.searchsorted(y, points, side="right") / len(y) - np.searchsorted(x, widened, side="right") / len(x)
    return float(max(0.0, gap_xy.max(), gap_yx.max()))


def summarize(graphs: Sequence[TraceGraph], representatives: Sequence[int], digits: int,
              max_phases: int = 64) -> dict[str, Any]:
    """A profile's summary: aggregates only (shares, histograms, quantiles rounded to ``digits`` significant
    digits) and, per rank class, the compute/communication phases along its critical path."""
    from workload.synthesis.values import round_significant

    s = trace_stats(graphs)

    def q(values: Sequence[int]) -> list[int]:
        return [round_significant(v, digits) for v in quantiles(values)]

    phases = []
    for r in representatives:
        graph = graphs[r]
        skip = np.array([metadata_groups(graph, i) is not None for i in range(graph.num_nodes)], dtype=bool)
        runs = critical_phases(graph, validate(graph), skip)[1]
        phases.append(runs[:max_phases] + ([["...", len(runs) - max_phases]] if len(runs) > max_phases else []))
    return {
        "ranks": s.ranks, "nodes": s.nodes, "type_mix": {k: round(v, 4) for k, v in s.type_shares().items()},
        "depth_quantiles": q(s.depth), "fan_in_histogram": histogram(s.fan_in),
        "fan_out_histogram": histogram(s.fan_out),
        "collectives": {name: {"count": len(v), "size_quantiles": q(v)} for name, v in
                        sorted(s.collective_sizes.items())},
        "p2p": {"count": len(s.p2p_sizes), "size_quantiles": q(s.p2p_sizes)},
        "compute_us_quantiles": q(s.compute_us), "compute_ops_quantiles": q(s.compute_ops),
        "critical_path_phases": phases,
    }
