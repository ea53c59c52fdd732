"""Per-node facts the simulator needs, pulled out of a TraceGraph once into plain lists.

Lanes are ASTRA-sim's hardware slots: one CPU op, one GPU compute op and one GPU communication op may be
in flight per rank; receives take no slot. With ``--comm-streams communicator`` (``communicator_lanes``) a
rank has one communication slot per communicator instead, as NCCL runs every communicator on its own CUDA
stream: a collective's slot is its group's, a send's the peer's (a two-rank communicator), and collectives
without a group share ASTRA-sim's slot.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from workload.errors import TraceError
from workload.graph import TraceGraph
from workload.schema import CollectiveType, NodeType

CPU_LANE, COMPUTE_LANE, COMM_LANE, RECV_LANE = 0, 1, 2, 3
NUM_LANES = 4
SINGLE_STREAM, COMMUNICATOR_STREAMS = "single", "communicator"
COMM_STREAMS = (SINGLE_STREAM, COMMUNICATOR_STREAMS)
NO_VALUE = -1
MAX_DURATION_MICROS = (2**63 - 1) // 1000  # one node's time must fit a signed 64-bit count of ns

COLLECTIVE_KINDS = {
    CollectiveType.ALL_REDUCE: "all_reduce",
    CollectiveType.ALL_GATHER: "all_gather",
    CollectiveType.REDUCE_SCATTER: "reduce_scatter",
    CollectiveType.ALL_TO_ALL: "all_to_all",
}


@dataclass(slots=True, eq=False)
class NodeTable:
    types: list[int]
    is_cpu: list[bool]
    lanes: list[int]
    replay_ns: list[int]  # duration_micros * 1000, and 1 ns for a zero duration
    comm_type: list[int]
    comm_size: list[int]
    comm_src: list[int]  # NO_VALUE when absent
    comm_dst: list[int]
    comm_tag: list[int]
    comm_priority: list[int]
    tensor_size: list[int]
    num_ops: list[int]
    has_num_ops: list[bool]
    has_tensor_size: list[bool]
    pg_name: dict[int, str]
    involved_dim: dict[int, list[bool]]


# the attributes a NodeTable reads
TABLE_ATTRIBUTES = frozenset(("is_cpu_op", "comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag",
                              "comm_priority", "tensor_size", "num_ops", "pg_name", "involved_dim"))


def node_table(graph: TraceGraph) -> NodeTable:
    """The graph's NodeTable, built once and cached on the graph (ranks sharing a graph share it). A variant
    (workload/variants.py) shares its template's columns but those of the attributes whose values differ."""
    table = graph.cache.get("node_table")
    if table is not None:
        return table  # type: ignore[no-any-return]
    variant = graph.variant
    if variant is None:
        table = NodeTable(**_columns(graph, TABLE_ATTRIBUTES, whole=True))
    else:
        base = node_table(variant.template)
        changed = variant.attributes & TABLE_ATTRIBUTES
        table = replace(base, **_patched(graph, base, changed, variant.occurrences)) if changed else base
    graph.cache["node_table"] = table
    return table


def _patched(graph: TraceGraph, base: NodeTable, changed: Collection[str], occurrences: np.ndarray
             ) -> dict[str, Any]:
    """The columns of a variant's table that differ from its template's ``base``: the values of the attribute
    ``occurrences`` that differ (each the first of its name on its node); which nodes have which attributes is
    the template's."""
    attrs = graph.attrs
    out: dict[str, Any] = {}
    name_ids = attrs.name_id[occurrences]
    nodes = attrs.node[occurrences].tolist()
    for name in sorted(changed):
        if name in ("is_cpu_op", "involved_dim"):  # rare (involved_dim never: lists are not read as values)
            out.update(_columns(graph, (name,), whole=False))
            continue
        which = occurrences[name_ids == attrs.names.index(name)]
        at = [nodes[k] for k in np.flatnonzero(name_ids == attrs.names.index(name)).tolist()]
        if name == "pg_name":  # strings (the template's are, and the fields are the same)
            column: Any = dict(base.pg_name)
            offsets, ends = attrs.offset[which], attrs.offset[which] + attrs.length[which]
            if offsets.size:
                low = int(offsets.min())
                text = attrs.buf[low : int(ends.max())].tobytes()
                for n, a, b in zip(at, (offsets - low).tolist(), (ends - low).tolist(), strict=True):
                    column[n] = text[a:b].decode("utf-8", "replace")
        else:
            column = list(getattr(base, name))
            for n, value in zip(at, attrs.integers_at(which).tolist(), strict=True):
                column[n] = value
        out[name] = column
    return out


def _columns(graph: TraceGraph, which: Collection[str], whole: bool) -> dict[str, Any]:
    """The NodeTable columns filled by the attributes ``which`` names (``whole``: every column)."""
    n = graph.num_nodes
    attrs = graph.attrs
    types = graph.types.astype(np.int64)
    out: dict[str, Any] = {}
    if "is_cpu_op" in which:
        is_cpu = attrs.integers("is_cpu_op", n)[0] != 0
        lanes = np.where(types == NodeType.COMP_NODE, COMPUTE_LANE, COMM_LANE)
        lanes = np.where(types == NodeType.COMM_RECV_NODE, RECV_LANE, lanes)
        out["is_cpu"] = is_cpu.tolist()
        out["lanes"] = np.where(is_cpu, CPU_LANE, lanes).tolist()
    if whole:
        micros = graph.duration_micros
        too_long = np.flatnonzero(micros > MAX_DURATION_MICROS)
        if too_long.size:
            i = int(too_long[0])
            raise TraceError(f"duration_micros {int(micros[i])} is beyond the longest time the simulator represents "
                             f"({MAX_DURATION_MICROS} µs, about 292 years)", node_id=graph.node_id(i))
        duration = micros.astype(np.int64) * 1000 if graph.duration_ns is None else graph.duration_ns
        out["types"] = types.tolist()
        out["replay_ns"] = np.where(duration == 0, 1, duration).tolist()
    for name in ("num_ops", "tensor_size", "comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag",
                 "comm_priority"):
        if name not in which:
            continue
        values, present = attrs.integers(name, n, NO_VALUE)
        column = values.tolist()
        if name == "comm_priority":
            column = [0 if v == NO_VALUE else v for v in column]
        out[name] = column
        if name in ("tensor_size", "num_ops"):
            out[f"has_{name}"] = present.tolist()
    if "pg_name" in which:
        out["pg_name"] = attrs.strings("pg_name")
    if "involved_dim" in which:
        out["involved_dim"] = attrs.bool_lists("involved_dim")
    return out


def communicator_lanes(table: NodeTable) -> tuple[list[int], int]:
    """(lane of every node, number of lanes) with one communication lane per communicator: collectives by their
    group (``pg_name``), sends by their peer; everything else in ASTRA-sim's lanes. Lanes are numbered in node
    order, so ranks whose traces are images of each other number them alike."""
    lanes = list(table.lanes)
    numbers: dict[tuple[int, str | int], int] = {}
    for i, lane in enumerate(lanes):
        if lane != COMM_LANE:
            continue
        ntype = table.types[i]
        if ntype == NodeType.COMM_COLL_NODE:
            name = table.pg_name.get(i, "")
            if name in ("", "0"):
                continue
            key: tuple[int, str | int] = (ntype, name)
        elif ntype == NodeType.COMM_SEND_NODE and table.comm_dst[i] != NO_VALUE:
            key = (ntype, table.comm_dst[i])
        else:
            continue
        lanes[i] = numbers.setdefault(key, NUM_LANES + len(numbers))
    return lanes, NUM_LANES + len(numbers)
