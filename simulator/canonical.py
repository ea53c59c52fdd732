"""The canonical form of a rank's trace: what the simulator does with it, without node ids and names.

Two ranks whose traces differ only in how nodes are numbered (each rank giving its nodes its own ids, as
per-rank exporters do) or named behave alike: the simulator orders nodes by id and never reads an id's value
or a name for timing. ``behaviour_key`` digests everything that does steer a run (node types, durations, the
collective and point-to-point attributes, compute counts, dependencies as positions in id order, process-group
declarations), so equal keys mean interchangeable traces.
"""

from __future__ import annotations

import hashlib

import numpy as np

from simulator.node_table import TABLE_ATTRIBUTES, node_table
from workload.graph import TraceGraph
from workload.groups import metadata_groups
from workload.schema import NodeType
from workload.variants import dependency_positions

# the attributes that name other ranks (``behaviour_key`` without references leaves their values out)
REFERENCE_ATTRIBUTES = frozenset(("comm_src", "comm_dst", "pg_name"))
_STRUCTURAL = TABLE_ATTRIBUTES - REFERENCE_ATTRIBUTES


def behaviour_key(graph: TraceGraph, references: bool = True) -> bytes:
    """A digest equal for traces the simulator runs identically (cached on the graph). Without ``references``
    it leaves out what names other ranks (send/receive peers, communicator groups, process-group declarations):
    equal keys then mean equal traces up to those (``RankReferences`` holds them)."""
    name = "behaviour_key" if references else "structure_key"
    key = graph.cache.get(name)
    if key is not None:
        return key  # type: ignore[no-any-return]
    variant = graph.variant
    if variant is not None and not (variant.attributes & (TABLE_ATTRIBUTES if references else _STRUCTURAL)):
        key = graph.cache[name] = behaviour_key(variant.template, references)  # it differs in nothing keyed
        return key
    t = node_table(graph)
    h = hashlib.blake2b(digest_size=20)
    h.update(np.int64(graph.num_nodes).tobytes())
    peers = (t.comm_src, t.comm_dst) if references else ()
    for column in (t.types, t.is_cpu, t.replay_ns, t.comm_type, t.comm_size, *peers, t.comm_tag,
                   t.comm_priority, t.tensor_size, t.num_ops, t.has_num_ops, t.has_tensor_size):
        h.update(np.asarray(column, dtype=np.int64).tobytes())
    h.update(repr(sorted(t.pg_name.items()) if references else sorted(t.pg_name)).encode())
    h.update(repr(sorted(t.involved_dim.items())).encode())
    for ptr, deps in ((graph.data_ptr, graph.data_deps), (graph.ctrl_ptr, graph.ctrl_deps)):
        h.update(np.asarray(ptr, dtype=np.int64).tobytes())
        h.update(dependency_positions(graph.ids, np.asarray(deps, dtype=np.uint64)).astype(np.int64).tobytes())
    metadata = np.flatnonzero(graph.types == NodeType.METADATA_NODE).tolist()
    h.update(repr([(i, metadata_groups(graph, i)) for i in metadata] if references else metadata).encode())
    key = h.digest()
    graph.cache[name] = key
    return key


def same_behaviour(graphs: list[TraceGraph]) -> bool:
    """Whether every rank's trace is interchangeable with rank 0's."""
    first = graphs[0]
    return all(g is first or behaviour_key(g) == behaviour_key(first) for g in graphs)
