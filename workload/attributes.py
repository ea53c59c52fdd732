"""Typed access to the attributes of a decoded trace, column by column.

Each attribute occurrence keeps the number of the value field it was written with (Chakra's
AttributeProto oneof), its raw varint/fixed bits and, for strings, bytes and lists, where its payload
lies in the file buffer. Columns are converted with numpy on request. As in ASTRA-sim, the first
attribute of a given name on a node is the one that counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workload import schema
from workload.errors import TraceError

_U64 = np.uint64

# value field number -> (kind, type name)
FIELD_TYPES: dict[int, tuple[str, str]] = {}
for _i, (_name, _, _) in enumerate(schema.ATTRIBUTE_VALUE_TYPES):
    FIELD_TYPES[3 + 2 * _i] = ("scalar", _name)
    FIELD_TYPES[4 + 2 * _i] = ("list", _name)

INTEGER_TYPES = {"int32", "int64", "uint32", "uint64", "sint32", "sint64",
                 "fixed32", "fixed64", "sfixed32", "sfixed64", "bool"}



def expected_wire_type(field_number: int) -> int | None:
    """The wire type a value field is written with, or None when the number is not a value field."""
    info = FIELD_TYPES.get(field_number)
    if info is None:
        return None
    if info[0] == "list":
        return 2
    return schema.ATTRIBUTE_VALUE_TYPES[(field_number - 3) // 2][2]


def _integers(field_numbers: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """Integer meaning of raw values written with the given scalar field types (int64 result)."""
    out = raw.view(np.int64).copy()
    low = (raw & _U64(0xFFFFFFFF)).astype(np.int64)
    as_int32 = np.where(low >= 1 << 31, low - (1 << 32), low)
    for number, values in (
        (7, as_int32),  # int32: the varint's low 32 bits, signed
        (11, low),  # uint32
        (15, (low >> 1) ^ -(low & 1)),  # sint32: zigzag
        (17, ((raw >> _U64(1)).view(np.int64)) ^ -((raw & _U64(1)).view(np.int64))),  # sint64
        (19, low),  # fixed32
        (23, as_int32),  # sfixed32
        (27, (raw != 0).astype(np.int64)),  # bool
    ):
        m = field_numbers == number
        if m.any():
            out[m] = values[m]
    return out


@dataclass(slots=True)
class AttributeTable:
    """All attribute occurrences of one trace, ordered by node index then position within the node."""

    buf: np.ndarray
    ids: np.ndarray  # uint64 node id per node index, for error messages
    names: list[str]
    node: np.ndarray  # int64 node index
    name_id: np.ndarray  # int32 index into names
    field: np.ndarray  # int16 value field number, 0 when no value is set
    raw: np.ndarray  # uint64 varint / fixed bits
    offset: np.ndarray  # int64 payload start for strings, bytes and lists
    length: np.ndarray  # int64 payload length
    override: dict[int, Any] = field(default_factory=dict)  # occurrence -> value, for rare encodings
    _first: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    _name_index: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._name_index = {n: i for i, n in enumerate(self.names)}

    def __len__(self) -> int:
        return len(self.node)

    def has(self, name: str) -> bool:
        return name in self._name_index

    def first(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(node indices, occurrence indices) of the first ``name`` attribute of every node that has one."""
        cached = self._first.get(name)
        if cached is not None:
            return cached
        nid = self._name_index.get(name)
        if nid is None:
            result = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        else:
            occ = np.flatnonzero(self.name_id == nid)
            nodes = self.node[occ]
            keep = np.r_[True, nodes[1:] != nodes[:-1]] if occ.size else np.zeros(0, dtype=bool)
            result = (nodes[keep], occ[keep])
        self._first[name] = result
        return result

    def integers(self, name: str, num_nodes: int, default: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """The integer attribute ``name`` per node: (values int64, present mask).

        Any integer or bool encoding is accepted; anything else raises TraceError naming the node.
        Missing values are ``default`` (0 when None; check the mask to tell them apart).
        """
        nodes, occ = self.first(name)
        values = np.full(num_nodes, 0 if default is None else default, dtype=np.int64)
        present = np.zeros(num_nodes, dtype=bool)
        if occ.size:
            numbers = self.field[occ]
            ok = np.isin(numbers, [n for n, (k, t) in FIELD_TYPES.items() if k == "scalar" and t in INTEGER_TYPES])
            if not ok.all():
                bad = int(np.flatnonzero(~ok)[0])
                raise self._type_error(name, int(nodes[bad]), int(numbers[bad]), "an integer")
            values[nodes] = _integers(numbers, self.raw[occ])
            present[nodes] = True
        return values, present

    def strings(self, name: str) -> dict[int, str]:
        """The string attribute ``name`` of every node that has it, as {node index: text}."""
        nodes, occ = self.first(name)
        out: dict[int, str] = {}
        for n, o in zip(nodes.tolist(), occ.tolist(), strict=True):
            value = self.value_at(o)
            if not isinstance(value, str):
                raise self._type_error(name, n, int(self.field[o]), "a string")
            out[n] = value
        return out

    def bool_lists(self, name: str) -> dict[int, list[bool]]:
        """The bool-list attribute ``name`` of every node that has it."""
        nodes, occ = self.first(name)
        out: dict[int, list[bool]] = {}
        for n, o in zip(nodes.tolist(), occ.tolist(), strict=True):
            if int(self.field[o]) != schema.scalar_field_number("bool") + 1 and o not in self.override:
                raise self._type_error(name, n, int(self.field[o]), "a bool list")
            out[n] = [bool(v) for v in self.value_at(o)]
        return out

    def value_at(self, occ: int) -> Any:
        """The Python value of one attribute occurrence (None when no value field is set)."""
        if occ in self.override:
            return self.override[occ]
        number = int(self.field[occ])
        if number == 0:
            return None
        kind, tname = FIELD_TYPES[number]
        if kind == "list":
            payload = self.buf[self.offset[occ] : self.offset[occ] + self.length[occ]].tobytes()
            return list(schema.list_class(tname).FromString(payload).values)
        raw = self.raw[occ : occ + 1]
        if tname in ("string", "bytes"):
            payload = self.buf[self.offset[occ] : self.offset[occ] + self.length[occ]].tobytes()
            return payload.decode("utf-8", "replace") if tname == "string" else payload
        if tname == "double":
            return float(raw.view(np.float64)[0])
        if tname == "float":
            return float(raw.astype(np.uint32).view(np.float32)[0])
        if tname == "bool":
            return bool(raw[0])
        value = int(_integers(np.array([number]), raw)[0])
        if tname in ("uint64", "fixed64"):
            value &= (1 << 64) - 1
        return value

    def type_name_at(self, occ: int) -> str:
        """The value field's name, e.g. ``int64_val`` or ``bool_list`` ("" when none is set)."""
        number = int(self.field[occ])
        return self.type_name_at_field(number) if number else ""

    @staticmethod
    def type_name_at_field(number: int) -> str:
        kind, tname = FIELD_TYPES[number]
        return f"{tname}_{'list' if kind == 'list' else 'val'}"

    def of_node(self, node: int) -> range:
        """Occurrence indices of one node's attributes, in file order."""
        lo = int(np.searchsorted(self.node, node, side="left"))
        hi = int(np.searchsorted(self.node, node, side="right"))
        return range(lo, hi)

    def _type_error(self, name: str, node: int, field_number: int, wanted: str) -> TraceError:
        got = "no value" if field_number == 0 else self.type_name_at_field(field_number)
        return TraceError(f"attribute '{name}' holds {got} where {wanted} is expected",
                          node_id=int(self.ids[node]), hint="write it with the type the Chakra tools use")
