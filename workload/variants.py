"""Read a rank's trace as a variant of one already decoded, without decoding it.

The per-rank files of one job are mostly the same bytes: the ranks of a pipeline stage differ only in the peers
they name and the numbers of their communicator groups, and per-rank exporters give each rank its own node ids and
names. Decoding a file costs a few milliseconds of numpy calls whatever its size, which made decoding most of a
256- or 1,024-rank run. A file as long as a decoded one (its template) whose bytes differ only inside values --
node ids, names, dependency ids, integer and string attribute values -- with every varint keeping its length has
the template's exact wire layout: every tag, length and field in the same place. Its graph is the template's
with those values read again from its own bytes: a comparison and a few numpy calls.

Nothing a full decode would refuse is accepted: node ids must keep their order (so nodes keep their indices and
stay distinct), dependencies must point at the same nodes (so the dependency structure, its checks and warnings
are the template's), and changed attribute values are checked as ``validate`` checks them. A byte that differs
anywhere else -- a tag, a length, a type, a duration, a list, a varint that grows -- and the file is decoded in
full, so a corrupt file is reported, naming file, rank and node, as it always was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workload import schema
from workload.attributes import FIELD_TYPES, AttributeTable, expected_wire_type
from workload.graph import TraceGraph, Variation
from workload.legacy import is_pre_1_0
from workload.protoscan import expand_packed_varints, read_varints, sorted_distinct
from workload.validate import check_changed_values

# what a template's byte is: FIXED bytes must be equal; the others are values (the last three are varint bytes,
# whose length must stay the same)
FIXED, NAME, TEXT, ATTRIBUTE, NODE_ID, DEPENDENCY = range(6)
_IS_VARINT = np.zeros(64, dtype=bool)  # by value field number (3 to 32 in an AttributeTable, 0 for none)
_IS_VARINT[[n for n, (kind, _) in FIELD_TYPES.items() if kind == "scalar" and expected_wire_type(n) == 0]] = True
_IS_TEXT = np.zeros(64, dtype=bool)
_IS_TEXT[[schema.scalar_field_number(t) for t in ("string", "bytes")]] = True
TEMPLATES_PER_LENGTH = 4  # decoded traces of one length tried for a file; beyond that it is decoded


def dependency_positions(ids: np.ndarray, deps: np.ndarray) -> np.ndarray:
    """Each dependency as the index of the node it names (-1: no node has that id); ``ids`` ascending."""
    at = np.searchsorted(ids, deps)
    inside = at < len(ids)
    found = inside.copy()
    found[inside] = ids[at[inside]] == deps[inside]
    return np.where(found, at, -1)


@dataclass(slots=True, eq=False)
class _Template:
    graph: TraceGraph
    roles: np.ndarray  # per byte of graph.buf
    occ_start: np.ndarray  # value starts of the attribute occurrences that may vary, ascending
    occ_index: np.ndarray  # ... and their occurrence indices
    counts: np.ndarray  # per occurrence: whether it is the first of its name on its node (the one readers read)
    positions: tuple[np.ndarray, np.ndarray]  # data and control dependencies as node indices


def _template(graph: TraceGraph) -> _Template:
    """Each byte's role in ``graph``'s buffer, from the places the decoder recorded."""
    buf, layout, a = graph.buf, graph.layout, graph.attrs
    assert layout is not None
    spans: list[tuple[np.ndarray, np.ndarray, int]] = [
        (graph.name_offset, graph.name_offset + graph.name_length, NAME)]

    def varints(at: np.ndarray, role: int) -> None:
        spans.append((at, read_varints(buf, at)[1], role))

    varints(layout.id_at[layout.id_at >= 0], NODE_ID)
    for p_off, p_len, s_off, _ in layout.deps.values():
        spans.append((p_off, p_off + p_len, DEPENDENCY))
        varints(s_off, DEPENDENCY)
    single = np.ones(len(a), dtype=bool)  # attributes written with several value fields stay fixed
    single[list(a.override)] = False
    ints = np.flatnonzero(_IS_VARINT[a.field] & single)
    texts = np.flatnonzero(_IS_TEXT[a.field] & single)
    varints(a.offset[ints], ATTRIBUTE)
    spans.append((a.offset[texts], a.offset[texts] + a.length[texts], TEXT))
    delta = np.zeros(len(buf) + 1, dtype=np.int16)
    for starts, ends, role in spans:  # spans never overlap: +role where one starts, -role where it ends
        np.add.at(delta, starts, role)
        np.add.at(delta, ends, -role)
    roles = np.cumsum(delta[:-1]).astype(np.uint8)
    tracked = np.concatenate((ints, texts))
    order = np.argsort(a.offset[tracked], kind="stable")
    positions = (dependency_positions(graph.ids, graph.data_deps), dependency_positions(graph.ids, graph.ctrl_deps))
    by_name = np.lexsort((a.name_id, a.node))  # stable: file order within a node's attributes of one name
    counts = np.zeros(len(a), dtype=bool)
    if len(a):
        counts[by_name] = np.r_[True, (np.diff(a.node[by_name]) != 0) | (np.diff(a.name_id[by_name]) != 0)]
    return _Template(graph, roles, a.offset[tracked][order], tracked[order], counts, positions)


def _reread_deps(graph: TraceGraph, buf: np.ndarray, number: int) -> np.ndarray:
    """A dependency field's values read from ``buf`` at the places the template's were found."""
    assert graph.layout is not None
    p_off, p_len, s_off, order = graph.layout.deps[number]
    packed, _ = expand_packed_varints(buf, p_off, p_len)
    return np.concatenate((packed, read_varints(buf, s_off)[0]))[order]


def differing_bytes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Positions where two uint8 arrays of one length differ (compared 8 bytes at a time: few differ)."""
    whole = len(a) // 8 * 8
    words = np.flatnonzero(a[:whole].view(np.uint64) != b[:whole].view(np.uint64))
    at = (words[:, None] * 8 + np.arange(8)).ravel()
    at = at[a[at] != b[at]]
    tail = np.flatnonzero(a[whole:] != b[whole:]) + whole
    return np.concatenate((at, tail)) if tail.size else at


def _variant(t: _Template, buf: np.ndarray, diff: np.ndarray, path: str, checks: bool) -> TraceGraph | None:
    """``buf`` (as long as the template's, differing at ``diff``) read against the template; None when it is not
    a variant of it."""
    base = t.graph
    role = t.roles[diff]
    if not role.all():
        return None
    varint = role >= ATTRIBUTE
    if ((buf[diff[varint]] ^ base.buf[diff[varint]]) & 0x80).any():
        return None  # a varint changes its length: the fields after it move
    ids, data_deps, ctrl_deps = base.ids, base.data_deps, base.ctrl_deps
    moved = role >= NODE_ID
    if moved.any():
        layout = base.layout
        assert layout is not None
        if (role == NODE_ID).any():
            ids = ids.copy()
            has = layout.id_at >= 0
            ids[has] = read_varints(buf, layout.id_at[has])[0]
            if not (ids[1:] > ids[:-1]).all():
                return None  # the nodes would change places
        if (role == DEPENDENCY).any():
            data_deps, ctrl_deps = _reread_deps(base, buf, 5), _reread_deps(base, buf, 4)
        if not (np.array_equal(dependency_positions(ids, data_deps), t.positions[0])
                and np.array_equal(dependency_positions(ids, ctrl_deps), t.positions[1])):
            return None  # dependencies name other nodes: a different graph
    a = base.attrs
    tracked = diff[(role == TEXT) | (role == ATTRIBUTE)]
    occ = sorted_distinct(t.occ_index[np.searchsorted(t.occ_start, tracked, side="right") - 1])
    raw = a.raw
    ints = occ[_IS_VARINT[a.field[occ]]]
    if ints.size:
        raw = raw.copy()
        raw[ints] = read_varints(buf, a.offset[ints])[0]
    occ = occ[t.counts[occ]]  # a later attribute of a name already on its node is read by no one
    changed = frozenset(a.names[i] for i in set(a.name_id[occ].tolist()))
    attrs = AttributeTable(buf=buf, ids=ids, names=a.names, node=a.node, name_id=a.name_id, field=a.field, raw=raw,
                           offset=a.offset, length=a.length, override=dict(a.override), _first=dict(a._first))
    graph = TraceGraph(
        path=path, version=base.version, metadata=base.metadata, ids=ids, record=base.record, types=base.types,
        start_time_micros=base.start_time_micros, duration_micros=base.duration_micros, buf=buf,
        name_offset=base.name_offset, name_length=base.name_length, data_ptr=base.data_ptr, data_deps=data_deps,
        ctrl_ptr=base.ctrl_ptr, ctrl_deps=ctrl_deps, io_node=base.io_node, io_field=base.io_field,
        io_offset=base.io_offset, io_length=base.io_length, attrs=attrs, warnings=list(base.warnings),
        duration_ns=base.duration_ns, layout=base.layout, variant=Variation(base, changed, occ),
        # the dependency structure is the template's: its nodes keep their indices and dependencies their targets
        cache={k: v for k, v in base.cache.items() if isinstance(k, str) and k.startswith("deps:")})
    if checks and changed:
        check_changed_values(graph, occ, changed)
    return graph


class Variants:
    """Decoded traces that later files of a set may be read against, by buffer length."""

    def __init__(self) -> None:
        self._decoded: dict[int, list[TraceGraph | _Template]] = {}
        self._read: dict[tuple[int, bytes, bytes], TraceGraph] = {}  # variants by their differences: equal files
        # share one graph

    def add(self, graph: TraceGraph) -> None:
        """Offer a decoded (and, when checked, validated) trace as a template."""
        if graph.layout is None or graph.duration_ns is not None or is_pre_1_0(graph.version):
            return  # rewritten from an older schema: its buffer is not the file's bytes
        same = self._decoded.setdefault(len(graph.buf), [])
        if len(same) < TEMPLATES_PER_LENGTH:
            same.append(graph)

    def read(self, buf: np.ndarray, path: str, checks: bool = True) -> tuple[TraceGraph, bool] | None:
        """``buf`` read as a variant of a template, or None; with it whether it was read now (False: the bytes of
        a trace read before, whose graph it shares). With ``checks``, changed attribute values are checked as
        validate does (TraceError naming the node)."""
        same = self._decoded.get(len(buf))
        if not same:
            return None
        for k, entry in enumerate(same):
            if isinstance(entry, TraceGraph):  # each byte's role, found when a file first needs it
                entry = same[k] = _template(entry)
            diff = differing_bytes(buf, entry.graph.buf)
            if not diff.size:
                return entry.graph, False
            seen = (id(entry), diff.tobytes(), buf[diff].tobytes())
            if seen in self._read:
                return self._read[seen], False
            graph = _variant(entry, buf, diff, path, checks)
            if graph is not None:
                self._read[seen] = graph
                if k:  # the template that fits is tried first next time
                    same.insert(0, same.pop(k))
                return graph, True
        return None
