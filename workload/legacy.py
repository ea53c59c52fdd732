"""Chakra traces written before schema 1.0: say which schema a file is, and read it as the ASTRA-sim of its era did.

Three older encodings are still in circulation, ASTRA-sim's own 2.0-era examples among them:

* **0.0.1, the ``.eg`` era** (Chakra until mid-2023, ASTRA-sim 2.0's first releases): no GlobalMetadata, and a
  node's facts in fields of its own (``node_type`` with COMP_NODE = 3, ``parent``, ``simulated_run_time`` in ns,
  ``num_ops`` 12, ``comm_type`` 13 with ALL_REDUCE = 1, ``involved_dim`` 14, ``comm_size`` 18 ...).
* **0.0.4 without a GlobalMetadata** (late 2023): today's field numbers, but the file starts with a node.
* **0.0.4** (October 2023 on): today's wire format. The ASTRA-sim of that era (Chakra's first feeder) read an
  absent ``is_cpu_op`` as true, so a collective without it ran as a CPU op with no duration, i.e. not at all;
  ASTRA-sim 2.x today reads it as a GPU collective and needs its ``comm_size``.

A stream without GlobalMetadata is rewritten here into a 1.0 stream (``upgrade_stream``) that the ordinary
reader decodes; the 0.0.4 reading is applied to the decoded graph (``apply_era_reading``). Each difference from
what ASTRA-sim 2.x does today is reported in one warning that names the reading used. The trade-off: the old
streams are rewritten node by node in Python, which is fine for the sizes those tools wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from workload.errors import TraceError, shown
from workload.graph import TraceGraph
from workload.protoscan import MalformedMessage, message_fields, packed_values, scan_fields
from workload.schema import CollectiveType, NodeType

EG_ERA = "0.0.1 (.eg era: node fields, no GlobalMetadata)"
V004_NO_METADATA = "0.0.4 (no GlobalMetadata)"

# schema 0.0.1's NodeType and CollectiveCommType numbers, as today's
_EG_NODE_TYPES = {0: NodeType.INVALID_NODE, 1: NodeType.MEM_LOAD_NODE, 2: NodeType.MEM_STORE_NODE,
                  3: NodeType.COMP_NODE, 4: NodeType.COMM_SEND_NODE, 5: NodeType.COMM_RECV_NODE,
                  6: NodeType.COMM_COLL_NODE}
_EG_COLLECTIVES = {1: CollectiveType.ALL_REDUCE, 2: CollectiveType.ALL_TO_ALL, 3: CollectiveType.ALL_GATHER,
                   4: CollectiveType.REDUCE_SCATTER}
# (field, wire type) pairs that only one of the metadata-less encodings writes
_EG_ONLY = frozenset({(8, 0), (9, 0), (10, 0), (11, 0), (12, 0), (13, 0), (14, 0), (14, 2), (15, 0), (16, 0),
                      (17, 0), (18, 0), (19, 0), (20, 0)})
_V004_ONLY = frozenset({(8, 2), (9, 2), (10, 2)})
_NODE_FIELDS = {(1, 0), (2, 2), (3, 0), (4, 0), (4, 2), (5, 0), (5, 2), (6, 0), (7, 0)} | _EG_ONLY | _V004_ONLY


TYPED_ATTRIBUTE_FIELD = 11  # Node.attribute in Chakra 0.0.2 / 0.0.3: typed attributes (name, type enum, value)


def typed_attributes_error(message_index: int) -> TraceError:
    """The refusal of a Chakra 0.0.2 / 0.0.3 trace (mid-2023): no ASTRA-sim read that schema, whose attribute
    value fields changed meaning between its versions."""
    return TraceError(f"Chakra schema 0.0.2/0.0.3 (mid-2023: typed attributes in field 11 of node message #"
                      f"{message_index}): not read, as no ASTRA-sim release read it and its attribute fields changed "
                      "numbering between versions", hint="convert the source trace again with a current Chakra")


@dataclass(slots=True)
class Upgraded:
    """A legacy stream rewritten with today's field numbers: the bytes, the schema it was, what differs."""

    data: bytes
    schema: str
    notes: list[str] = field(default_factory=list)
    duration_ns: dict[int, int] = field(default_factory=dict)  # node id -> run time not a whole number of µs


def starts_with_metadata(first: bytes) -> bool:
    """Whether a stream's first message is a GlobalMetadata (version string, attributes that start with a name)
    rather than a node written without one."""
    try:
        fields = message_fields(first, what="first message")
        for number, wire, _, lo, hi in fields:
            if wire != 2 or number not in (1, 2):
                return False
            if number == 2:
                inner = message_fields(first[lo:hi], what="attribute")
                if not inner or inner[0][:2] != (1, 2):
                    return False
    except TraceError:
        return False
    return True


def upgrade_stream(raw: memoryview, starts: np.ndarray, ends: np.ndarray, path: str = "") -> Upgraded | None:
    """A stream that starts with a node (no GlobalMetadata) as a 1.0 stream, or None when it is not one whose
    nodes some Chakra schema wrote (the caller then reports the missing metadata). When no field tells the two
    metadata-less schemas apart, a file named ``.eg`` (as 0.0.1's were) is read as 0.0.1, any other as 0.0.4."""
    first = bytes(raw[int(starts[0]) : int(ends[0])])
    try:
        fields = {(f, w) for f, w, *_ in message_fields(first)}
        if (TYPED_ATTRIBUTE_FIELD, 2) in fields:
            raise typed_attributes_error(0)
        if not fields <= _NODE_FIELDS:
            return None
        pairs, types = _signature(np.frombuffer(raw, dtype=np.uint8), starts, ends)
    except MalformedMessage:
        return None
    except TraceError as e:
        if e.problem.startswith("Chakra schema 0.0.2"):
            raise
        return None
    eg = pairs & _EG_ONLY
    v004 = pairs & _V004_ONLY or (types & {7})
    if eg and v004:
        raise TraceError("no GlobalMetadata, and its nodes mix the fields of Chakra 0.0.1 (e.g. field "
                         f"{min(eg)[0]}) with those of 0.0.4 and later: not a trace of any one schema",
                         hint="is this really a Chakra ET file?")
    if eg or (not v004 and path.endswith((".eg", ".eg.gz"))):
        return _upgrade_eg(raw, starts, ends)
    return _upgrade_v004(raw, starts, ends, ambiguous=not v004)


def _signature(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[set[tuple[int, int]], set[int]]:
    """The (field, wire type) pairs written in any node, and the node type values used."""
    padded = np.concatenate((buf, np.zeros(16, np.uint8)))
    pairs: set[tuple[int, int]] = set()
    types: set[int] = set()
    for r in scan_fields(padded, starts.astype(np.int64), ends.astype(np.int64), "node"):
        pairs.update(zip(r.field.tolist(), r.wire.tolist(), strict=True))
        types.update(r.value[r.where(3, 0)].tolist())
    return pairs, types


def _framed(version: str, nodes: Sequence[bytes]) -> bytes:
    from workload.wire import frame_payloads
    from workload.writer import make_metadata, serialize

    return frame_payloads([serialize(make_metadata(version)), *nodes])


def _upgrade_v004(raw: memoryview, starts: np.ndarray, ends: np.ndarray, ambiguous: bool) -> Upgraded:
    nodes = [bytes(raw[int(a) : int(b)]) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    first_id, first_name = _id_and_name(nodes[0])
    notes = [f"Chakra schema {V004_NO_METADATA}: the file starts with node {first_id} ({shown(first_name)}), read "
             "as a node; ASTRA-sim reads the first message as the GlobalMetadata and so loses that node (ASTRA-sim 2.x "
             "today then aborts when another node depends on it: 'in ctrl_dep graph, but not found in index')"]
    if ambiguous:
        notes.append("no field tells Chakra 0.0.1 from 0.0.4 apart in this file: read with 0.0.4's field numbers "
                     "(node types COMP_NODE = 4 ..., field 7 the duration in µs), as it is not named .eg")
    return Upgraded(_framed(V004_NO_METADATA, nodes), V004_NO_METADATA, notes)


def _id_and_name(node: bytes) -> tuple[int, str]:
    node_id, name = 0, ""
    for number, wire, value, lo, hi in message_fields(node, what="node"):
        if (number, wire) == (1, 0):
            node_id = value
        elif (number, wire) == (2, 2):
            name = node[lo:hi].decode("utf-8", "replace")
    return node_id, name


@dataclass(slots=True)
class _EgNode:
    """One node in schema 0.0.1's fields (the last occurrence of a scalar wins, lists concatenate)."""

    id: int = 0
    name: str = ""
    node_type: int = 0
    parents: list[int] = field(default_factory=list)
    values: dict[int, int] = field(default_factory=dict)  # field number -> integer value
    involved_dim: list[bool] = field(default_factory=list)


def _parse_eg(data: bytes, base: int) -> _EgNode:
    node = _EgNode()
    for number, wire, value, lo, hi in message_fields(data, base, "node (Chakra 0.0.1)"):
        if number == 2 and wire == 2:
            node.name = data[lo:hi].decode("utf-8", "replace")
        elif number == 4:
            node.parents += [value] if wire == 0 else packed_values(data[lo:hi], 0, base + lo, "parent list")
        elif number == 14:
            bits = [value] if wire == 0 else packed_values(data[lo:hi], 0, base + lo, "involved_dim")
            node.involved_dim += [b != 0 for b in bits]
        elif wire == 0:
            node.values[number] = value
    node.id = node.values.pop(1, 0)
    node.node_type = node.values.pop(3, 0)
    return node


def _upgrade_eg(raw: memoryview, starts: np.ndarray, ends: np.ndarray) -> Upgraded:
    from workload.writer import make_node, serialize

    out: list[bytes] = []
    exact: dict[int, int] = {}
    skipped = roofline = grouped = 0
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        old = _parse_eg(bytes(raw[a:b]), a)
        v = old.values
        new_type = _EG_NODE_TYPES.get(old.node_type)
        if new_type is None:
            raise TraceError(f"node type {old.node_type} is not one of Chakra 0.0.1's (0-6)", node_id=old.id)
        attrs: list[tuple[str, object]] = []
        run_ns = v.get(7, 0)
        duration_micros = 0
        if new_type == NodeType.COMP_NODE:
            if run_ns == 0 and v.get(12, 0) == 0:
                new_type = NodeType.INVALID_NODE  # ASTRA-sim of the era skipped it, taking no time
                skipped += 1
            duration_micros, rest = divmod(run_ns, 1000)
            if rest:
                exact[old.id] = run_ns
            if v.get(12, 0) and run_ns == 0:
                roofline += 1
            attrs += [(name, v[number]) for number, name in ((12, "num_ops"), (6, "tensor_size")) if v.get(number)]
        elif new_type in (NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE):
            attrs.append(("tensor_size", v.get(6, 0)))
        elif new_type == NodeType.COMM_COLL_NODE:
            kind = _EG_COLLECTIVES.get(v.get(13, 0))
            if kind is None:
                raise TraceError(f"COMM_COLL_NODE with comm_type {v.get(13, 0)}, which names no collective in "
                                 "Chakra 0.0.1 (1 all-reduce, 2 all-to-all, 3 all-gather, 4 reduce-scatter)",
                                 node_id=old.id)
            attrs += [("comm_type", int(kind)), ("comm_size", v.get(18, 0))]
            if old.involved_dim:
                attrs.append(("involved_dim", old.involved_dim))
            if v.get(20):
                attrs.append(("comm_priority", v[20]))
            grouped += bool(v.get(15))
        elif new_type in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
            attrs += [("comm_src", v.get(16, 0)), ("comm_dst", v.get(17, 0)), ("comm_size", v.get(18, 0)),
                      ("comm_tag", v.get(19, 0))]
        out.append(serialize(make_node(old.id, old.name, new_type, data_deps=old.parents,
                                       duration_micros=duration_micros, attrs=attrs)))
    notes = [f"Chakra schema {EG_ERA}: read as ASTRA-sim 2.0 of that era did (node types, parents as data "
             "dependencies, simulated_run_time in ns, comm_type 1-4 = all-reduce, all-to-all, all-gather, "
             "reduce-scatter, comm_size from field 18); ASTRA-sim 2.x today reads none of these fields (it takes the "
             "first node for the GlobalMetadata and the others for different fields)"]
    if skipped:
        notes.append(f"{skipped} compute node(s) with neither simulated_run_time nor num_ops: skipped without "
                     "taking time, as ASTRA-sim of that era did")
    if roofline:
        notes.append(f"{roofline} compute node(s) have num_ops but no simulated_run_time: timed by the roofline "
                     "model when it is enabled, with today's units (peak-perf TFLOP/s, local-mem-bw GB/s with "
                     "GB = 10^9 B); ASTRA-sim of that era took the config numbers unscaled and counted cycles of its "
                     "1.275 GHz clock")
    if grouped:
        notes.append(f"{grouped} collective(s) name a communicator_id, which ASTRA-sim of that era ignored (every "
                     "collective spans all ranks): ignored here too")
    return Upgraded(_framed(EG_ERA, out), EG_ERA, notes, exact)


def apply_era_reading(graph: TraceGraph) -> None:
    """Read a decoded 0.0.4 trace's collectives as the ASTRA-sim of its era and of today do, warning where they
    differ: a collective with neither ``comm_size`` nor ``is_cpu_op`` becomes a node that is skipped without
    taking time (that era ran it as a CPU op with no duration; ASTRA-sim 2.x today stops without a result)."""
    if not graph.version.startswith("0.0.4"):
        return
    n = graph.num_nodes
    types = graph.types
    collective = types == NodeType.COMM_COLL_NODE
    comm = collective | (types == NodeType.COMM_SEND_NODE) | (types == NodeType.COMM_RECV_NODE)
    cpu_flag = _has(graph, "is_cpu_op", n)
    unsized = collective & ~cpu_flag & ~_has(graph, "comm_size", n)
    if unsized.any():
        graph.types = np.where(unsized, np.int32(NodeType.INVALID_NODE), types).astype(types.dtype)
        graph.warnings.append(
            f"Chakra schema 0.0.4: {int(unsized.sum())} COMM_COLL_NODE(s) carry neither comm_size nor is_cpu_op "
            "(Chakra's text converter of late 2023 wrote no size). The ASTRA-sim of that era read a missing "
            "is_cpu_op as true and ran them as CPU ops with no duration, i.e. skipped them; ASTRA-sim 2.x today "
            "stops on the missing comm_size without a result ('Attribute comm_size not found'). Read as that era "
            "did: these collectives take no time ('trace upgrade' writes them as INVALID_NODEs, which ASTRA-sim 2.x "
            "skips alike). To simulate the collectives the trace was meant to hold, convert the ASTRA-sim 1.0 text "
            "workload it came from (astrasim-py trace convert text --time-unit us, the unit of this trace's "
            "durations)")
    defaulted = comm & ~cpu_flag & ~unsized
    if defaulted.any():
        graph.warnings.append(
            f"Chakra schema 0.0.4: {int(defaulted.sum())} communication node(s) have no is_cpu_op: run on the GPU, "
            "as ASTRA-sim 2.x does today; the ASTRA-sim of that era read a missing is_cpu_op as true and skipped "
            "them, so its results for this trace have no communication")


def _has(graph: TraceGraph, name: str, n: int) -> np.ndarray:
    """Per node: whether it has an attribute called ``name`` (of any value type)."""
    present = np.zeros(n, dtype=bool)
    present[graph.attrs.first(name)[0]] = True
    return present


def is_pre_1_0(version: str) -> bool:
    """Whether a GlobalMetadata version string (or this module's label for a file without one) names a schema
    older than 1.0."""
    return version.startswith("0.")
