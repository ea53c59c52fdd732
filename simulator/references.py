"""What a rank's trace names of other ranks: the send/receive peers and communicator groups it uses.

The quotient engine (simulator/quotient.py) maps ranks onto each other by shifts; a shift is a symmetry of the
workload when it maps every rank's references onto its image's. Read here once per rank, compactly: the distinct
values in order of first use, and a key for everything else (equal keys: equal traces but for those values).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from simulator.canonical import behaviour_key
from simulator.node_table import NO_VALUE, node_table
from simulator.symmetries import WORLD, Value
from workload.graph import TraceGraph
from workload.groups import metadata_groups
from workload.schema import NodeType

# A rank's references to other ranks, compactly: the distinct values its trace names, in order of first use.
# A value is ("peer", own rank written, peer) for sends and receives, or ("group", collective types, members as
# listed (WORLD for all NPUs), group number (pg_name; 0 for all NPUs)) for collectives. Which node uses which
# value (the template) goes into the rank's key, so two ranks with equal keys differ only in their values, and a
# shift maps one onto the other when it maps the values. Generated workloads give the same form without building
# traces (TraceSet.structure).


def rank_references(graph: TraceGraph, rank: int, comm_groups: dict[int, tuple[int, ...]], npus: int
                    ) -> tuple[bytes, tuple[Value, ...]] | None:
    """(key, values) of the rank's trace, or None when its references cannot be read before the run (an
    undeclared group, a send written into another rank's trace): such traces are simulated rank by rank."""
    t = node_table(graph)
    declared = dict(comm_groups)
    coll, sends, recvs, metadata = _reference_nodes(graph)
    for i in metadata:
        for name, ranks in metadata_groups(graph, i) or ():
            if str(name).isdigit():
                declared[int(name)] = tuple(ranks) if ranks else tuple(range(npus))
    distinct: dict[Any, int] = {}  # value -> its code
    names = [t.pg_name.get(i, "") for i in coll]
    code_of_name: dict[str, int] = {}
    for name in dict.fromkeys(names):
        number = 0 if name in ("", "0") else int(name) if name.isdigit() else -1
        members = WORLD if number == 0 else declared.get(number)
        if members is None:
            return None
        if len(members) == npus and members == tuple(range(npus)):
            members = WORLD
        # a group is its number: two groups of the same ranks (data- and expert-parallel ones) stay apart
        code_of_name[name] = distinct.setdefault(("group", members, number), len(distinct))
    nodes = [coll]
    codes = [np.array([code_of_name[n] for n in names], dtype=np.int64)]
    for which, own_column, peer_column in ((sends, t.comm_src, t.comm_dst), (recvs, t.comm_dst, t.comm_src)):
        own = np.array([own_column[i] for i in which], dtype=np.int64)
        peer = np.array([peer_column[i] for i in which], dtype=np.int64)
        if not (((own == NO_VALUE) | (own == rank)).all() and ((peer >= 0) & (peer < npus)).all()):
            return None
        nodes.append(which)
        codes.append(len(distinct) + (own == rank) * npus + peer)  # ("peer", own == rank, peer)
    index = np.concatenate([np.asarray(n, dtype=np.int64) for n in nodes])
    order = np.argsort(index, kind="stable")
    index, code = index[order], np.concatenate(codes)[order]
    # the values in order of first use, and each node's slot among them (the template)
    by_code = np.argsort(code, kind="stable")
    new = np.r_[True, code[by_code][1:] != code[by_code][:-1]] if code.size else np.zeros(0, dtype=bool)
    first = np.sort(by_code[new])
    slot_of = {c: k for k, c in enumerate(code[first].tolist())}
    groups = {c: v for v, c in distinct.items()}
    kinds: dict[int, set[int]] = {}
    for name, ctype in set(zip(names, (t.comm_type[i] for i in coll), strict=True)):
        kinds.setdefault(code_of_name[name], set()).add(ctype)
    values: list[Value] = []
    for c in slot_of:
        if c in groups:
            values.append(("group", tuple(sorted(kinds[c])), groups[c][1], groups[c][2]))
        else:
            flag, peer = divmod(c - len(distinct), npus)
            values.append(("peer", bool(flag), peer))
    slots = np.array([slot_of[c] for c in code.tolist()], dtype=np.int64)
    key = hashlib.blake2b(behaviour_key(graph, references=False) + index.tobytes() + slots.tobytes(),
                          digest_size=20).digest()
    return key, tuple(values)


def _reference_nodes(graph: TraceGraph) -> tuple[list[int], list[int], list[int], list[int]]:
    """The indices of a trace's collectives, sends and receives (host-side records left out) and of its METADATA
    nodes: the nodes that name other ranks. A variant whose host-side flags are its template's shares them."""
    found = graph.cache.get("reference_nodes")
    if found is not None:
        return found  # type: ignore[no-any-return]
    variant = graph.variant
    if variant is not None and "is_cpu_op" not in variant.attributes:
        found = _reference_nodes(variant.template)
    else:
        t = node_table(graph)
        types = graph.types
        device = ~np.array(t.is_cpu, dtype=bool)
        found = tuple(np.flatnonzero((types == kind) & device).tolist() for kind in
                      (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE))
        found += (np.flatnonzero(types == NodeType.METADATA_NODE).tolist(),)
    graph.cache["reference_nodes"] = found
    return found
