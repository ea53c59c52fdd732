"""Traces read as variants of a decoded one (workload/variants.py) equal their full decode, and anything a full
decode refuses is refused alike, naming file, rank and node."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.canonical import behaviour_key
from simulator.node_table import node_table
from tests.conftest import trace_bytes
from workload.errors import TraceError
from workload.graph import TraceGraph
from workload.protoscan import PADDING
from workload.reader import decode_trace
from workload.schema import NodeType
from workload.traceset import TraceLoader
from workload.validate import validate
from workload.variants import FIXED, _template
from workload.writer import make_node


def rank_nodes(rank: int, base: int, peer: int, group: str, size: int = 1 << 20) -> list[Any]:
    """One rank's trace: its own node ids (from ``base``) and names, a send/receive pair with ``peer``, a
    collective on group ``group``."""
    return [
        make_node(base + 1, f"fwd_rank{rank}", NodeType.COMP_NODE, duration_micros=5,
                  attrs={"num_ops": 1000, "tensor_size": 64}),
        make_node(base + 2, f"allreduce_rank{rank}", NodeType.COMM_COLL_NODE, data_deps=[base + 1],
                  attrs={"comm_type": 0, "comm_size": size, "pg_name": group, "involved_dim": [True]}),
        make_node(base + 3, f"send_rank{rank}", NodeType.COMM_SEND_NODE, ctrl_deps=[base + 2],
                  attrs=[("comm_dst", peer), ("comm_size", 4096), ("comm_tag", "sint32_val", 7)]),
        make_node(base + 4, f"recv_rank{rank}", NodeType.COMM_RECV_NODE, data_deps=[base + 2],
                  attrs=[("comm_src", peer), ("comm_size", 4096), ("comm_tag", "sint32_val", 7)]),
        make_node(base + 5, f"bwd_rank{rank}", NodeType.COMP_NODE, data_deps=[base + 3, base + 4],
                  duration_micros=7),
    ]


def loaded(files: list[bytes], loader: TraceLoader | None = None) -> list[TraceGraph | str]:
    """Each rank's graph as one loader reads the set (an error ends the set: the rank's message)."""
    loader = loader or TraceLoader()
    out: list[TraceGraph | str] = []
    for r in range(len(files)):
        try:
            out.append(loader.load(f"t.{r}.et", r, lambda rank: files[rank]))
        except TraceError as e:
            out.append(str(e))
            break
    return out


def alone(files: list[bytes], r: int) -> TraceGraph | str:
    """Rank ``r``'s file decoded in full by itself."""
    try:
        return TraceLoader().load(f"t.{r}.et", r, lambda rank: files[rank])
    except TraceError as e:
        return str(e)


def outcome(compute: Any) -> Any:
    """What ``compute()`` gives, or the message of the TraceError it raises."""
    try:
        return compute()
    except TraceError as e:
        return str(e)


def assert_same(a: TraceGraph, b: TraceGraph) -> None:
    """Everything a run or a tool reads from a graph is equal."""
    for name in ("ids", "record", "types", "start_time_micros", "duration_micros", "data_ptr", "data_deps", "ctrl_ptr",
                 "ctrl_deps"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert (a.version, a.metadata, a.warnings, a.path) == (b.version, b.metadata, b.warnings, b.path)
    for i in range(a.num_nodes):
        assert a.name(i) == b.name(i)
        assert a.attributes(i) == b.attributes(i)
        assert a.io_info(i, "inputs") == b.io_info(i, "inputs")
    assert outcome(lambda: asdict(node_table(a))) == outcome(lambda: asdict(node_table(b)))
    assert outcome(lambda: behaviour_key(a)) == outcome(lambda: behaviour_key(b))
    assert outcome(lambda: behaviour_key(a, references=False)) == outcome(lambda: behaviour_key(b, references=False))
    da, db = validate(a), validate(b)
    for name in ("parent_ptr", "parents", "child_ptr", "children"):
        assert np.array_equal(getattr(da, name), getattr(db, name))


def per_rank_set(ranks: int, stride: int = 1000) -> list[bytes]:
    return [trace_bytes(rank_nodes(r, stride * r + 7, (r + 1) % ranks, str(r % 4 + 1))) for r in range(ranks)]


def test_per_rank_ids_names_peers_and_groups_are_read_as_variants() -> None:
    files = per_rank_set(12)
    graphs = loaded(files)
    assert all(isinstance(g, TraceGraph) for g in graphs)
    assert sum(g.variant is None for g in graphs) < 12  # most of them were not decoded
    for r, g in enumerate(graphs):
        full = alone(files, r)
        assert isinstance(g, TraceGraph) and isinstance(full, TraceGraph)
        assert_same(g, full)
    variant = next(g for g in graphs if g.variant is not None)
    assert variant.variant.attributes <= {"comm_src", "comm_dst", "pg_name"}
    # ids, names and peers only: the same trace up to references
    assert behaviour_key(variant, references=False) == behaviour_key(variant.variant.template, references=False)


def test_a_changed_value_that_matters_is_read_and_keyed() -> None:
    files = [trace_bytes(rank_nodes(0, 0, 1, "1", size=1 << 20)), trace_bytes(rank_nodes(1, 0, 0, "1", size=3 << 19))]
    a, b = loaded(files)
    assert isinstance(b, TraceGraph) and b.variant is not None and "comm_size" in b.variant.attributes
    assert node_table(b).comm_size[1] == 3 << 19 and node_table(a).comm_size[1] == 1 << 20
    assert behaviour_key(a, references=False) != behaviour_key(b, references=False)
    full = alone(files, 1)
    assert isinstance(full, TraceGraph)
    assert_same(b, full)


def test_ids_out_of_order_are_decoded_in_full() -> None:
    nodes = rank_nodes(1, 0, 0, "1")
    nodes[0].id, nodes[1].id = 2, 1  # the first two nodes swap ids (and the collective's dependency breaks)
    nodes[1].data_deps[:] = [2]
    files = [trace_bytes(rank_nodes(0, 0, 1, "1")), trace_bytes(nodes)]
    graphs = loaded(files)
    assert isinstance(graphs[1], TraceGraph) and graphs[1].variant is None
    assert_same(graphs[1], alone(files, 1))  # type: ignore[arg-type]


@pytest.mark.parametrize("change, message", [
    (lambda n: setattr(n[2], "id", 2), "rank 1.*node 2.*duplicate node id"),  # same length, now a duplicate
    (lambda n: n[4].data_deps.__setitem__(0, 9), "rank 1.*node 5.*depends on node 9, which is not in the file"),
    (lambda n: n[3].attr[2].__setattr__("sint32_val", -8), "rank 1.*node 4.*'comm_tag' is negative"),
    (lambda n: n[1].attr[0].__setattr__("int64_val", 99), "rank 1.*node 2.*unknown collective comm_type 99"),
])
def test_a_bad_value_in_a_variant_is_refused_naming_file_rank_and_node(change: Any, message: str) -> None:
    nodes = rank_nodes(1, 0, 0, "2")
    change(nodes)
    files = [trace_bytes(rank_nodes(0, 0, 1, "1")), trace_bytes(nodes)]
    assert len(files[0]) == len(files[1])  # read against rank 0's, not decoded, when the values were fine
    graphs = loaded(files)
    assert isinstance(graphs[1], str) and graphs[1] == alone(files, 1)
    assert "t.1.et" in graphs[1]
    assert __import__("re").search(message, graphs[1]), graphs[1]


def _value_positions(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Positions of a file's value bytes (read again in a variant) and of its other bytes."""
    graph = decode_trace(data)
    roles = _template(graph).roles[: len(data)]
    return np.flatnonzero(roles != FIXED), np.flatnonzero(roles == FIXED)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ranks=st.integers(2, 5), stride=st.sampled_from([1, 100, 1000, 1 << 20]), data=st.data())
def test_a_set_reads_each_file_as_its_full_decode(ranks: int, stride: int, data: st.DataObject) -> None:
    """Property: whatever one byte of a file becomes, inside a value or anywhere else, loading the set gives each
    rank what decoding its file alone gives (the same graph, or the same error naming file, rank and node)."""
    files = per_rank_set(ranks, stride)
    r = data.draw(st.integers(1, ranks - 1), label="rank")
    values, others = _value_positions(files[r])
    inside = data.draw(st.booleans(), label="in a value")
    pool = values if inside and values.size else others
    pos = int(pool[data.draw(st.integers(0, len(pool) - 1), label="position")])
    mutated = bytearray(files[r])
    mutated[pos] = data.draw(st.integers(0, 255).filter(lambda b: b != files[r][pos]), label="byte")
    files[r] = bytes(mutated)
    graphs = loaded(files)
    for k, got in enumerate(graphs):
        want = alone(files, k)
        if isinstance(want, str) or isinstance(got, str):
            assert got == want
        else:
            assert_same(got, want)


def test_template_roles_cover_only_values() -> None:
    data = trace_bytes(rank_nodes(3, 3000, 4, "12"))
    graph = decode_trace(data)
    roles = _template(graph).roles
    assert len(roles) == len(data) + PADDING
    text = data.decode("latin-1")
    for word in ("fwd_rank3", "12"):  # a name and a group name are values
        at = text.index(word)
        assert (roles[at : at + len(word)] != FIXED).all()
    for word in ("comm_size", "pg_name"):  # attribute names are not
        at = text.index(word)
        assert (roles[at : at + len(word)] == FIXED).all()
