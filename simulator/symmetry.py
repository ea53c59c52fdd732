"""When a run is symmetric enough to simulate one representative rank instead of all of them.

If every rank runs the same trace (up to node ids and names: simulator/canonical.py), collectives use
translation-symmetric algorithms (ring and direct per dimension; their one* forms on one-dimensional networks)
over all NPUs, and nothing breaks the symmetry (point-to-point messages, communicator groups, shared memory
channels), then every rank behaves like rank 0 shifted in space: one rank is simulated and its sends are
mirrored back as its receives (network/messaging.py: MirroredMessaging). Same-time ties between ranks can still
break the symmetry; the engine detects them (simulator/engine.py: CheckedEngine) and the run falls back to every
rank.
"""

from __future__ import annotations

from simulator.canonical import same_behaviour
from simulator.config import MemoryConfig, SystemConfig
from simulator.node_table import node_table
from workload.graph import TraceGraph
from workload.schema import NodeType

SYMMETRIC_ALGORITHMS = ("ring", "oneRing", "direct", "oneDirect")
_KINDS = {0: "all_reduce", 2: "all_gather", 7: "reduce_scatter", 6: "all_to_all"}


def symmetry_blockers(graphs: list[TraceGraph], system: SystemConfig, memory: MemoryConfig,
                      npus_per_dim: tuple[int, ...], comm_groups: dict[int, tuple[int, ...]]) -> list[str]:
    """Why the representative-rank engine cannot run this workload (empty: it can)."""
    if not same_behaviour(graphs):
        return ["ranks run different traces"]
    if system.replay_only:
        return []
    t = node_table(graphs[0])
    total_npus = 1
    for n in npus_per_dim:
        total_npus *= n
    reasons = []
    types = set(t.types)
    if {NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE} & types:
        reasons.append("point-to-point sends/receives")
    if NodeType.METADATA_NODE in types:
        reasons.append("METADATA nodes (process groups)")
    if (NodeType.MEM_LOAD_NODE in types or NodeType.MEM_STORE_NODE in types) and memory.memory_type in (
            "PER_NODE_MEMORY_EXPANSION", "MEMORY_POOL"):
        reasons.append("remote memory channels shared between NPUs")
    for name in t.pg_name.values():
        if name in ("", "0"):
            continue
        members = comm_groups.get(int(name)) if name.isdigit() else None
        if members is None or len(members) != total_npus:
            reasons.append("collectives on communicator groups")
            break
    kinds = {_KINDS.get(t.comm_type[i]) for i, ty in enumerate(t.types)
             if ty == NodeType.COMM_COLL_NODE and not t.is_cpu[i]}
    for kind in sorted(k for k in kinds if k):
        if system.custom(kind) is not None:
            reasons.append(f"a custom {kind} algorithm")
            continue
        for name in system.implementation(kind):
            if not name.startswith(SYMMETRIC_ALGORITHMS):
                reasons.append(f"the {name} algorithm ({kind})")
            elif name.startswith("one") and len(npus_per_dim) > 1:
                # one ring over all NPUs in index order is not a symmetry of a multi-dimensional network
                reasons.append(f"the {name} algorithm on a multi-dimensional network")
    return reasons
