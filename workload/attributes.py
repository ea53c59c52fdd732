"""Typed access to the attributes of a decoded trace, column by column.

Each attribute occurrence keeps the number of the value field it was written with (Chakra's
AttributeProto oneof), its raw varint/fixed bits and, for strings, bytes and lists, where its payload
lies in the file buffer. Columns are converted with numpy on request. As in ASTRA-sim, the first
attribute of a given name on a node is the one that counts.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workload import schema
from workload.errors import TraceError
from workload.protoscan import (
    MalformedMessage,
    expand_packed_varints,
    intern_strings,
    message_fields,
    packed_values,
    scan_fields,
)

_U64 = np.uint64

# value field number -> (kind, type name)
FIELD_TYPES: dict[int, tuple[str, str]] = {}
for _i, (_name, _, _) in enumerate(schema.ATTRIBUTE_VALUE_TYPES):
    FIELD_TYPES[3 + 2 * _i] = ("scalar", _name)
    FIELD_TYPES[4 + 2 * _i] = ("list", _name)

INTEGER_TYPES = {"int32", "int64", "uint32", "uint64", "sint32", "sint64",
                 "fixed32", "fixed64", "sfixed32", "sfixed64", "bool"}
_INTEGER_FIELDS = [n for n, (k, t) in FIELD_TYPES.items() if k == "scalar" and t in INTEGER_TYPES]
_IS_INTEGER = np.zeros(64, dtype=bool)  # by value field number (3 to 32, 0 for none): an integer or bool one
_IS_INTEGER[_INTEGER_FIELDS] = True
_MASK64 = (1 << 64) - 1


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
    present = np.zeros(64, dtype=bool)  # which field types occur: only theirs are converted
    present[field_numbers] = True
    for number in np.flatnonzero(present).tolist():
        convert = _CONVERSIONS.get(number)
        if convert is not None:
            m = field_numbers == number
            out[m] = convert(raw[m])
    return out


def _low(raw: np.ndarray) -> np.ndarray:
    return (raw & _U64(0xFFFFFFFF)).astype(np.int64)


def _int32(raw: np.ndarray) -> np.ndarray:
    low = _low(raw)
    return np.where(low >= 1 << 31, low - (1 << 32), low)


def _sint32(raw: np.ndarray) -> np.ndarray:
    low = _low(raw)
    return (low >> 1) ^ -(low & 1)  # type: ignore[no-any-return]


def _sint64(raw: np.ndarray) -> np.ndarray:
    return ((raw >> _U64(1)).view(np.int64)) ^ -((raw & _U64(1)).view(np.int64))  # type: ignore[no-any-return]


# by value field number, how a raw varint or fixed value reads as an integer (others: its bits as int64)
_CONVERSIONS = {
    7: _int32,  # int32: the varint's low 32 bits, signed
    11: _low,  # uint32
    15: _sint32,  # sint32: zigzag
    17: _sint64,  # sint64: zigzag
    19: _low,  # fixed32
    23: _int32,  # sfixed32
    27: lambda raw: (raw != 0).astype(np.int64),  # bool
}


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

    def integers(self, name: str, num_nodes: int, default: int | None = None, *, strict: bool = True
                 ) -> tuple[np.ndarray, np.ndarray]:
        """The integer attribute ``name`` per node: (values int64, present mask).

        Any integer or bool encoding is accepted; anything else raises TraceError naming the node, or with
        ``strict=False`` counts as absent. Missing values are ``default`` (0 when None; check the mask).
        """
        nodes, occ = self.first(name)
        values = np.full(num_nodes, 0 if default is None else default, dtype=np.int64)
        present = np.zeros(num_nodes, dtype=bool)
        if occ.size:
            numbers = self.field[occ]
            ok = _IS_INTEGER[numbers]
            if not ok.all():
                if strict:
                    bad = int(np.flatnonzero(~ok)[0])
                    raise self._type_error(name, int(nodes[bad]), int(numbers[bad]), "an integer")
                nodes, occ, numbers = nodes[ok], occ[ok], numbers[ok]
            values[nodes] = _integers(numbers, self.raw[occ])
            present[nodes] = True
        return values, present

    def integers_at(self, occ: np.ndarray) -> np.ndarray:
        """The integer values (int64) of occurrences written with integer or bool value fields."""
        return _integers(self.field[occ], self.raw[occ])

    def strings(self, name: str, *, strict: bool = True) -> dict[int, str]:
        """The string attribute ``name`` of every node that has it, as {node index: text}; another type raises
        TraceError naming the node, or with ``strict=False`` is shown as text."""
        nodes, occ = self.first(name)
        out: dict[int, str] = {}
        for n, o in zip(nodes.tolist(), occ.tolist(), strict=True):
            value = self.value_at(o)
            if not isinstance(value, str):
                if strict:
                    raise self._type_error(name, n, int(self.field[o]), "a string")
                value = "" if value is None else str(value)
            out[n] = value
        return out

    def bool_lists(self, name: str) -> dict[int, list[bool]]:
        """The bool-list attribute ``name`` of every node that has it."""
        nodes, occ = self.first(name)
        out: dict[int, list[bool]] = {}
        for n, o in zip(nodes.tolist(), occ.tolist(), strict=True):
            if int(self.field[o]) != schema.scalar_field_number("bool") + 1:
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
        offset, length = int(self.offset[occ]), int(self.length[occ])
        if kind == "list":
            try:
                return list_values(self.buf[offset : offset + length].tobytes(), tname, offset)
            except TraceError as e:
                raise self._located(e, occ) from None
        if tname in ("string", "bytes"):
            return payload_value(tname, self.buf[offset : offset + length].tobytes())
        return scalar_value(tname, int(self.raw[occ]))

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

    def _located(self, e: TraceError, occ: int) -> TraceError:
        """``e`` about the value of occurrence ``occ``, naming its attribute and node."""
        name = self.names[int(self.name_id[occ])] if len(self.names) else ""
        return TraceError(f"{e.problem} (attribute {name!r})", node_id=int(self.ids[self.node[occ]]),
                          offset=e.offset, hint=e.hint)


def scalar_value(tname: str, raw: int) -> Any:
    """The Python value of a scalar written as ``<tname>_val``, from its varint or fixed-width bits."""
    raw &= _MASK64
    low = raw & 0xFFFFFFFF
    if tname == "double":
        return struct.unpack("<d", raw.to_bytes(8, "little"))[0]
    if tname == "float":
        return struct.unpack("<f", low.to_bytes(4, "little"))[0]
    if tname == "bool":
        return raw != 0
    if tname in ("int32", "sfixed32"):
        return low - (1 << 32) if low >= 1 << 31 else low
    if tname in ("uint32", "fixed32"):
        return low
    if tname == "sint32":
        return (low >> 1) ^ -(low & 1)
    if tname in ("int64", "sfixed64"):
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if tname == "sint64":
        return (raw >> 1) ^ -(raw & 1)
    return raw  # uint64, fixed64


def payload_value(tname: str, payload: bytes) -> str | bytes:
    """A string (invalid UTF-8 replaced, as everywhere in the reader) or bytes value."""
    return payload.decode("utf-8", "replace") if tname == "string" else payload


def list_values(payload: bytes, tname: str, base: int = 0) -> list[Any]:
    """The values of a ``<tname>_list`` message (packed or not, as protobuf accepts); TraceError with the byte
    offset (``base`` + position) when the payload is malformed."""
    wire = schema.ATTRIBUTE_VALUE_TYPES[(schema.scalar_field_number(tname) - 3) // 2][2]
    out: list[Any] = []
    for number, w, raw, first, last in message_fields(payload, base, f"{tname} list"):
        if number != 1:
            continue  # an unknown field, skipped as protobuf does
        if w == wire:
            out.append(payload_value(tname, payload[first:last]) if wire == 2 else scalar_value(tname, raw))
        elif w == 2 and wire != 2:
            out.extend(scalar_value(tname, v)
                       for v in packed_values(payload[first:last], wire, base + first, f"packed {tname} list"))
    return out


def oneof_value(payload: bytes, base: int) -> Any:
    """The value of a serialized AttributeProto by protobuf's oneof rules: the last value field written wins,
    and a list field written several times in a row merges."""
    current, parts = 0, []
    for number, wire, raw, first, last in message_fields(payload, base, "attribute"):
        if expected_wire_type(number) != wire:
            continue  # the name, the doc string, or an unknown field
        if number != current or FIELD_TYPES[number][0] != "list":
            current, parts = number, []
        parts.append((raw, first, last))
    if not current:
        return None
    kind, tname = FIELD_TYPES[current]
    raw, first, last = parts[-1]
    if kind == "list":
        return [v for _, a, b in parts for v in list_values(payload[a:b], tname, base + a)]
    if tname in ("string", "bytes"):
        return payload_value(tname, payload[first:last])
    return scalar_value(tname, raw)


def build_attribute_table(buf: np.ndarray, node: np.ndarray, starts: np.ndarray, ends: np.ndarray, ids: np.ndarray,
                          owner: str = "node") -> AttributeTable:
    """Decode the AttributeProto messages buf[starts[k]:ends[k]] of nodes ``node[k]`` (ordered by node, then
    file order). The wire format of every value, lists included, is checked here: a malformed attribute
    raises TraceError naming its node (``owner`` other than "node", e.g. "GlobalMetadata", names that
    instead)."""
    count = len(node)
    name_offset = np.zeros(count, dtype=np.int64)
    name_length = np.zeros(count, dtype=np.int64)
    field_ = np.zeros(count, dtype=np.int16)
    raw = np.zeros(count, dtype=_U64)
    value_offset = np.zeros(count, dtype=np.int64)
    value_length = np.zeros(count, dtype=np.int64)
    values_seen = np.zeros(count, dtype=np.int8)
    expected = np.full(64, -1, dtype=np.int8)
    for number in range(3, 33):
        expected[number] = expected_wire_type(number)

    def error(problem: str, k: int, offset: int | None, hint: str | None) -> TraceError:
        if owner == "node":
            return TraceError(f"{problem} (attribute of node {int(ids[node[k]])})", node_id=int(ids[node[k]]),
                              offset=offset, hint=hint)
        return TraceError(f"{problem} (attribute of the {owner})", offset=offset, hint=hint)

    try:
        for r in scan_fields(buf, starts, ends, "attribute"):
            w = r.where(1, 2)
            name_offset[r.message[w]] = r.offset[w]
            name_length[r.message[w]] = r.length[w]
            in_range = (r.field >= 3) & (r.field <= 32)
            w = np.flatnonzero(in_range & (expected[np.where(in_range, r.field, 0)] == r.wire))
            m = r.message[w]
            field_[m] = r.field[w]
            raw[m] = r.value[w]
            value_offset[m] = r.offset[w]
            value_length[m] = r.length[w]
            values_seen[m] = np.minimum(values_seen[m] + 1, 2)
    except MalformedMessage as e:
        raise error(e.problem, e.message_index, e.offset, e.hint) from None
    _check_lists(buf, field_, value_offset, value_length, error)
    names, name_id = intern_strings(buf, name_offset, name_length)
    table = AttributeTable(buf=buf, ids=ids, names=names, node=node, name_id=name_id, field=field_, raw=raw,
                           offset=value_offset, length=value_length)
    # An attribute written with more than one value field (never done by Chakra's writers): decode those few
    # by protobuf's oneof and merge rules.
    for k in np.flatnonzero(values_seen > 1).tolist():
        start, end = int(starts[k]), int(ends[k])
        try:
            table.override[k] = oneof_value(buf[start:end].tobytes(), start)
        except TraceError as e:
            raise error(e.problem, k, e.offset, e.hint) from None
    return table


_LIST_FIELDS = np.array([n for n, (k, _) in FIELD_TYPES.items() if k == "list"])
_ELEMENT_WIRE = np.full(64, -1, dtype=np.int8)  # list field number -> wire type of one element
for _n in _LIST_FIELDS.tolist():
    _ELEMENT_WIRE[_n] = schema.ATTRIBUTE_VALUE_TYPES[(_n - 4) // 2][2]


def _check_lists(buf: np.ndarray, field_: np.ndarray, offset: np.ndarray, length: np.ndarray, error: Any) -> None:
    """Check the wire format of every list value (its fields, and its packed numbers) in bulk."""
    lists = np.flatnonzero(np.isin(field_, _LIST_FIELDS))
    if not lists.size:
        return
    starts = offset[lists]
    packed: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (occurrence, offset, length) of varint lists
    try:
        for r in scan_fields(buf, starts, starts + length[lists], "attribute value list"):
            occ = lists[r.message]
            element = _ELEMENT_WIRE[field_[occ]]
            w = np.flatnonzero((r.field == 1) & (r.wire == 2) & (element != 2))
            if not w.size:
                continue
            width = np.where(element[w] == 1, 8, np.where(element[w] == 5, 4, 1))
            bad = np.flatnonzero(r.length[w] % width)
            if bad.size:
                k = int(w[bad[0]])
                raise error(f"malformed packed list: {int(r.length[k])} bytes are no whole number of "
                            f"{int(width[bad[0]])}-byte values", int(occ[k]), int(r.offset[k]),
                            "the file is corrupt or not a Chakra ET file")
            v = w[element[w] == 0]
            packed.append((occ[v], r.offset[v], r.length[v]))
    except MalformedMessage as e:
        raise error(e.problem, int(lists[e.message_index]), e.offset, e.hint) from None
    if packed:
        occ, offs, lens = (np.concatenate(c) for c in zip(*packed, strict=True))
        try:
            expand_packed_varints(buf, offs, lens)
        except TraceError as e:
            k = int(np.flatnonzero((offs <= (e.offset or 0)) & ((e.offset or 0) < offs + np.maximum(lens, 1)))[0])
            raise error(e.problem, int(occ[k]), e.offset, e.hint) from None
