"""Read a Chakra ET file into a TraceGraph: frame, then decode every node at once with numpy."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from workload import legacy
from workload.attributes import AttributeTable, build_attribute_table
from workload.errors import TraceError
from workload.graph import TraceGraph, WireLayout
from workload.limits import available_memory_bytes
from workload.protoscan import (
    PADDING,
    MalformedMessage,
    Round,
    expand_packed_varints,
    padded_buffer,
    scan_fields,
)
from workload.wire import frame_messages, read_trace_buffer

_U64 = np.uint64
DECODED_BYTES_PER_NODE = 100  # the least a decoded node takes (columns, dependency lists, scan temporaries)


def read_trace(path: str | os.PathLike[str]) -> TraceGraph:
    """Decode one ET file (plain or gzip). Raises TraceError naming the file and byte offset if it is broken."""
    path = os.fspath(path)
    buf = read_trace_buffer(path, PADDING)
    try:
        return decode_trace(buf, path)
    except TraceError as e:
        raise e.located(path=path) from None


def decode_trace(data: bytes | np.ndarray, path: str = "<memory>") -> TraceGraph:
    """Decode an ET stream (already gunzipped): bytes, or a buffer from ``padded_buffer``."""
    buf = data if isinstance(data, np.ndarray) else padded_buffer(data)
    raw = memoryview(buf)[: len(buf) - PADDING]
    warnings: list[str] = []
    max_nodes = available_memory_bytes() // DECODED_BYTES_PER_NODE
    starts, ends = (np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, np.int64)
                    for a in frame_messages(raw, max_nodes, warnings))
    if len(starts) == 0:
        raise TraceError("empty file: no GlobalMetadata and no nodes", hint="is this really a Chakra ET file?")
    if not legacy.starts_with_metadata(bytes(raw[int(starts[0]) : int(ends[0])])):
        upgraded = legacy.upgrade_stream(raw, starts, ends, path)
        if upgraded is not None:  # an older schema's nodes, rewritten with today's field numbers
            return _upgraded_graph(upgraded, path, warnings)
    version, metadata = _decode_metadata(buf, int(starts[0]), int(ends[0]))
    starts, ends = starts[1:], ends[1:]
    empty = int(np.count_nonzero(starts == ends))
    if empty:
        warnings.append(
            f"{empty} zero-length node message(s), read as all-default nodes (id 0, INVALID_NODE); "
            "the official Python tools stop reading at the first one")
    try:
        nodes = _NodeColumns(buf, starts, ends)
    except MalformedMessage as e:
        raise TraceError(f"{e.problem} (node message #{e.message_index})", offset=e.offset, hint=e.hint) from None
    return nodes.graph(version, metadata, warnings, path)


def _upgraded_graph(upgraded: legacy.Upgraded, path: str, warnings: list[str]) -> TraceGraph:
    graph = decode_trace(upgraded.data, path)
    graph.warnings[:0] = warnings + upgraded.notes
    graph.layout = None  # its buffer holds the rewritten stream, not the file's bytes
    if upgraded.duration_ns:  # run times in ns that the 1.0 schema's microseconds cannot hold
        ns = graph.duration_micros.astype(np.int64) * 1000
        for node_id, value in upgraded.duration_ns.items():
            index = graph.index_of(node_id)
            if index is not None:
                ns[index] = value
        graph.duration_ns = ns
    return graph


def _decode_metadata(buf: np.ndarray, start: int, end: int) -> tuple[str, dict[str, Any]]:
    problem = "the first message is not a GlobalMetadata"
    hint = "Chakra ET files start with a GlobalMetadata message; is this a Chakra ET file, and is it complete?"
    version = ""
    attr_starts: list[int] = []
    attr_ends: list[int] = []
    try:
        for r in scan_fields(buf, np.array([start]), np.array([end]), "GlobalMetadata"):
            if not ((r.field == 1) | (r.field == 2)).all() or not (r.wire == 2).all():
                raise TraceError(problem + " (it looks like a Node): the file lacks its metadata header",
                                 offset=start, hint=hint)
            off, n = int(r.offset[0]), int(r.length[0])
            if r.field[0] == 1:
                version = buf[off : off + n].tobytes().decode("utf-8", "replace")
            else:
                attr_starts.append(off)
                attr_ends.append(off + n)
    except MalformedMessage:
        raise TraceError(problem, offset=start, hint=hint) from None
    if not attr_starts:
        return version, {}
    count = len(attr_starts)
    table = build_attribute_table(buf, np.zeros(count, dtype=np.int64), np.array(attr_starts, dtype=np.int64),
                                  np.array(attr_ends, dtype=np.int64), np.zeros(1, dtype=_U64), "GlobalMetadata")
    return version, {table.names[int(table.name_id[k])]: table.value_at(k) for k in range(count)}


class _Pieces:
    """Occurrences of one repeated field collected round by round: (message, seq, value, offset, length)."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(self, r: Round, where: np.ndarray) -> None:
        if where.size:
            self.parts.append((r.message[where], np.full(where.size, r.seq, dtype=np.int32), r.value[where],
                               r.offset[where], r.length[where]))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if not self.parts:
            return (np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, _U64), np.zeros(0, np.int64),
                    np.zeros(0, np.int64))
        m, q, v, o, n = (np.concatenate(c) for c in zip(*self.parts, strict=True))
        return m, q, v, o, n


class _NodeColumns:
    """Per-node columns filled from the rounds of a lock-step scan (a later occurrence overwrites)."""

    def __init__(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        n = len(starts)
        self.buf = buf
        self.n = n
        self.ids = np.zeros(n, dtype=_U64)
        self.raw_type = np.zeros(n, dtype=_U64)
        self.start_time = np.zeros(n, dtype=_U64)
        self.duration = np.zeros(n, dtype=_U64)
        self.id_offset = np.full(n, -1, dtype=np.int64)  # where each node's (last) id varint starts
        self.name_offset = np.zeros(n, dtype=np.int64)
        self.name_length = np.zeros(n, dtype=np.int64)
        self.packed = {4: _Pieces(), 5: _Pieces()}  # ctrl_deps, data_deps as packed lists
        self.single = {4: _Pieces(), 5: _Pieces()}  # ... and as single values (unpacked encoding)
        self.io = {8: _Pieces(), 9: _Pieces()}  # inputs, outputs
        self.attrs = _Pieces()
        scalars = ((1, self.ids), (3, self.raw_type), (6, self.start_time), (7, self.duration))
        for r in scan_fields(buf, starts, ends, "node"):
            for number, column in scalars:
                w = r.where(number, 0)
                column[r.message[w]] = r.value[w]
                if number == 1:
                    self.id_offset[r.message[w]] = r.offset[w]
            w = r.where(2, 2)
            self.name_offset[r.message[w]] = r.offset[w]
            self.name_length[r.message[w]] = r.length[w]
            for number in (4, 5):
                self.packed[number].add(r, r.where(number, 2))
                self.single[number].add(r, r.where(number, 0))
            for number in (8, 9):
                self.io[number].add(r, r.where(number, 2))
            self.attrs.add(r, r.where(10, 2))
            typed = r.where(legacy.TYPED_ATTRIBUTE_FIELD, 2)
            if typed.size:  # Chakra 0.0.2 / 0.0.3 kept attributes in field 11, which today's schema leaves unused
                raise legacy.typed_attributes_error(int(r.message[typed[0]]))

    def graph(self, version: str, metadata: dict[str, Any], warnings: list[str], path: str) -> TraceGraph:
        n = self.n
        types = (self.raw_type & _U64(0xFFFFFFFF)).astype(np.int64)
        types = np.where(types >= 1 << 31, types - (1 << 32), types).astype(np.int32)  # proto3 enums are int32
        # nodes are kept in ascending id order; ``new`` maps a record position to its index
        order = np.argsort(self.ids, kind="stable")
        new = np.empty(n, dtype=np.int64)
        new[order] = np.arange(n)
        data_ptr, data_deps, data_at = self._dependency_lists(5, new)
        ctrl_ptr, ctrl_deps, ctrl_at = self._dependency_lists(4, new)
        (in_msg, in_seq, _, in_off, in_len), (out_msg, out_seq, _, out_off, out_len) = \
            self.io[8].arrays(), self.io[9].arrays()
        io_node = new[np.concatenate((in_msg, out_msg))]
        io_seq = np.concatenate((in_seq, out_seq))
        io_field = np.concatenate((np.full(len(in_msg), 8, np.int8), np.full(len(out_msg), 9, np.int8)))
        io_sort = np.lexsort((io_seq, io_node))
        ids = self.ids[order]
        self._check_io(ids, new)
        return TraceGraph(
            path=path, version=version, metadata=metadata, ids=ids, record=order,
            types=types[order], start_time_micros=self.start_time[order], duration_micros=self.duration[order],
            buf=self.buf, name_offset=self.name_offset[order], name_length=self.name_length[order],
            data_ptr=data_ptr, data_deps=data_deps, ctrl_ptr=ctrl_ptr, ctrl_deps=ctrl_deps,
            io_node=io_node[io_sort], io_field=io_field[io_sort],
            io_offset=np.concatenate((in_off, out_off))[io_sort],
            io_length=np.concatenate((in_len, out_len))[io_sort],
            attrs=self._attribute_table(new, ids), warnings=warnings,
            layout=WireLayout(id_at=self.id_offset[order], deps={5: data_at, 4: ctrl_at}),
        )

    def _dependency_lists(self, number: int, new: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """CSR (pointers, node ids) of a repeated uint64 field, accepting packed and unpacked encodings, and where
        its values lie (WireLayout.deps)."""
        p_msg, p_seq, _, p_off, p_len = self.packed[number].arrays()
        s_msg, s_seq, s_val, s_off, _ = self.single[number].arrays()
        values, seg = expand_packed_varints(self.buf, p_off, p_len)
        node = new[np.concatenate((p_msg[seg], s_msg))]
        seq = np.concatenate((p_seq[seg], s_seq))
        values = np.concatenate((values, s_val))
        order = np.lexsort((seq, node))  # stable: a packed list keeps its order
        ptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(node, minlength=self.n), out=ptr[1:])
        return ptr, values[order], (p_off, p_len, s_off, order)

    def _attribute_table(self, new: np.ndarray, ids: np.ndarray) -> AttributeTable:
        msg, seq, _, offset, length = self.attrs.arrays()
        node = new[msg]
        order = np.lexsort((seq, node))
        node, starts = node[order], offset[order]
        return build_attribute_table(self.buf, node, starts, starts + length[order], ids)

    def _check_io(self, ids: np.ndarray, new: np.ndarray) -> None:
        """Check the wire format of every inputs / outputs IOInfo message (their strings are read on demand)."""
        for number, what in ((8, "inputs"), (9, "outputs")):
            msg, _, _, offset, length = self.io[number].arrays()
            try:
                for _ in scan_fields(self.buf, offset, offset + length, f"{what} (IOInfo)"):
                    pass
            except MalformedMessage as e:
                node_id = int(ids[new[msg[e.message_index]]])
                raise TraceError(f"{e.problem} of node {node_id}", node_id=node_id, offset=e.offset,
                                 hint=e.hint) from None
