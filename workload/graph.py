"""The compact in-memory form of one decoded ET file: numpy columns, no protobuf objects.

Nodes are held in ascending id order; ``index`` in this package always means a position in that
order, ``node_id`` the Chakra id written in the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workload import schema
from workload.attributes import AttributeTable
from workload.protoscan import message_fields

_IO_FIELDS = {1: "values", 2: "shapes", 3: "types"}


@dataclass(frozen=True, slots=True, eq=False)
class WireLayout:
    """Where the decoder found a trace's node ids and dependency ids in its buffer: enough to read those values
    again from another file laid out alike (workload/variants.py)."""

    id_at: np.ndarray  # per node index: offset of its id varint (-1: the node has no id field)
    # per dependency field (4 control, 5 data): packed payload offsets and lengths, offsets of unpacked values, and
    # the order that puts their concatenated values into the graph's dependency list
    deps: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


@dataclass(frozen=True, slots=True, eq=False)
class Variation:
    """How a trace read as a variant differs from the decoded trace it was read against (its template): only in
    values, every field in the same place; nodes keep their indices and dependencies their targets."""

    template: TraceGraph
    attributes: frozenset[str]  # names of the attributes whose values differ on some node
    # the attribute occurrences (AttributeTable indices) whose values differ, each the first of its name on its
    # node (the one that is read)
    occurrences: np.ndarray


@dataclass(slots=True, eq=False)
class TraceGraph:
    """One rank's execution trace, decoded once into arrays.

    Per node (index i, ascending id): ``ids[i]``, ``types[i]`` (NodeType value), ``duration_micros[i]``,
    ``start_time_micros[i]``, ``record[i]`` (its position among the file's node messages), its name,
    its dependencies as written (``data_deps[data_ptr[i]:data_ptr[i+1]]``, likewise ``ctrl_deps``,
    both as node ids) and its attributes (``attrs``).
    """

    path: str
    version: str
    metadata: dict[str, Any]
    ids: np.ndarray
    record: np.ndarray
    types: np.ndarray
    start_time_micros: np.ndarray
    duration_micros: np.ndarray
    buf: np.ndarray
    name_offset: np.ndarray
    name_length: np.ndarray
    data_ptr: np.ndarray
    data_deps: np.ndarray
    ctrl_ptr: np.ndarray
    ctrl_deps: np.ndarray
    io_node: np.ndarray
    io_field: np.ndarray
    io_offset: np.ndarray
    io_length: np.ndarray
    attrs: AttributeTable
    warnings: list[str] = field(default_factory=list)
    # per node, its run time in ns where an older schema held one finer than the µs of duration_micros
    duration_ns: np.ndarray | None = None
    cache: dict[str, Any] = field(default_factory=dict)  # derived structures, built once on demand
    # where the decoder found values in ``buf`` (None for a trace rewritten from an older schema), and for a trace
    # read as a variant of another (workload/variants.py) how it differs from it
    layout: WireLayout | None = None
    variant: Variation | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.ids)

    def node_id(self, index: int) -> int:
        return int(self.ids[index])

    def index_of(self, node_id: int) -> int | None:
        """The index of the node with this id, or None when the trace has no such node."""
        i = int(np.searchsorted(self.ids, np.uint64(node_id)))
        return i if i < len(self.ids) and int(self.ids[i]) == node_id else None

    def name(self, index: int) -> str:
        off = int(self.name_offset[index])
        return self.buf[off : off + int(self.name_length[index])].tobytes().decode("utf-8", "replace")

    def node_type(self, index: int) -> schema.NodeType | int:
        t = int(self.types[index])
        return schema.NodeType(t) if 0 <= t <= 7 else t

    def data_deps_of(self, index: int) -> list[int]:
        return self.data_deps[self.data_ptr[index] : self.data_ptr[index + 1]].tolist()

    def ctrl_deps_of(self, index: int) -> list[int]:
        return self.ctrl_deps[self.ctrl_ptr[index] : self.ctrl_ptr[index + 1]].tolist()

    def io_info(self, index: int, which: str) -> dict[str, str] | None:
        """The node's ``inputs`` or ``outputs`` (values, shapes, types), or None when not written."""
        number = 8 if which == "inputs" else 9
        lo = int(np.searchsorted(self.io_node, index, side="left"))
        hi = int(np.searchsorted(self.io_node, index, side="right"))
        found = False
        out = {"values": "", "shapes": "", "types": ""}
        for k in range(lo, hi):  # pieces merge as protobuf merges messages: the last value of a field wins
            if int(self.io_field[k]) != number:
                continue
            found = True
            base = int(self.io_offset[k])
            data = self.buf[base : base + int(self.io_length[k])].tobytes()
            for field_number, wire, _, first, last in message_fields(data, base, which):
                if wire == 2 and 1 <= field_number <= 3:
                    out[_IO_FIELDS[field_number]] = data[first:last].decode("utf-8", "replace")
        return out if found else None

    def attributes(self, index: int) -> list[tuple[str, str, Any]]:
        """The node's attributes in file order as (name, value type such as ``int64_val``, value)."""
        a = self.attrs
        return [(a.names[int(a.name_id[k])], a.type_name_at(k), a.value_at(k)) for k in a.of_node(index)]

    def attribute(self, index: int, name: str, default: Any = None) -> Any:
        """The value of the node's first attribute called ``name`` (``default`` when absent)."""
        a = self.attrs
        for k in a.of_node(index):
            if a.names[int(a.name_id[k])] == name:
                return a.value_at(k)
        return default
