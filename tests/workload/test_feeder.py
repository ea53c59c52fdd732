"""The feeder releases a node only after all its parents finished, lowest id first."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import trace_bytes
from workload.feeder import Feeder, walk
from workload.reader import decode_trace
from workload.validate import validate
from workload.writer import make_node


def _graph(spec: dict[int, tuple[list[int], list[int]]]):
    nodes = [make_node(i, f"n{i}", 4, data_deps=d, ctrl_deps=c) for i, (d, c) in spec.items()]
    g = decode_trace(trace_bytes(nodes))
    return g, validate(g)


def test_lowest_id_first_among_issuable() -> None:
    g, deps = _graph({5: ([], []), 3: ([], []), 9: ([3], []), 1: ([5], [])})
    assert [g.node_id(i) for i in walk(g, deps)] == [3, 5, 1, 9]


def test_node_waits_for_data_and_control_parents() -> None:
    g, deps = _graph({1: ([], []), 2: ([], []), 3: ([1], [2])})
    f = Feeder(g, deps)
    a = f.take_lowest()
    assert g.node_id(a) == 1
    f.finish(a)
    b = f.take_lowest()
    assert g.node_id(b) == 2 and f.take_lowest() is None  # 3 still waits for 2
    f.finish(b)
    c = f.take_lowest()
    assert g.node_id(c) == 3
    f.finish(c)
    assert f.done


def test_duplicate_and_mixed_dependencies_count_once() -> None:
    g, deps = _graph({1: ([], []), 2: ([1, 1], [1])})
    f = Feeder(g, deps)
    f.finish(f.take_lowest())
    assert g.node_id(f.take_lowest()) == 2


def test_lanes_and_deferred_release() -> None:
    g, deps = _graph({1: ([], []), 2: ([], []), 3: ([1], []), 4: ([1], [])})
    lanes = [0, 1, 0, 1]  # by index: nodes 1 and 3 in lane 0, nodes 2 and 4 in lane 1
    f = Feeder(g, deps, lanes=lanes, num_lanes=2)
    assert f.lane_heads() == [0, 1]
    first = f.take(0)
    f.finish(first, defer=True)
    assert f.lane_heads() == [None, 1]  # the released children wait for release_deferred
    f.release_deferred()
    assert f.lane_heads() == [2, 1]
    f.push_back(f.take(1))
    assert f.peek(1) == 1


@st.composite
def dags(draw: st.DrawFn) -> dict[int, tuple[list[int], list[int]]]:
    n = draw(st.integers(1, 40))
    ids = draw(st.permutations(list(range(100, 100 + n))))  # a random topological order over the ids
    spec = {}
    for k, node_id in enumerate(ids):
        earlier = ids[:k]
        data = draw(st.lists(st.sampled_from(earlier), max_size=3)) if earlier else []
        ctrl = draw(st.lists(st.sampled_from(earlier), max_size=2)) if earlier else []
        spec[node_id] = (data, ctrl)
    return spec


@settings(max_examples=100, deadline=None)
@given(dags())
def test_walk_is_a_topological_order_with_lowest_id_first(spec: dict[int, tuple[list[int], list[int]]]) -> None:
    g, deps = _graph(spec)
    order = [g.node_id(i) for i in walk(g, deps)]
    assert sorted(order) == sorted(spec)
    done: set[int] = set()
    for node_id in order:
        data, ctrl = spec[node_id]
        assert set(data) | set(ctrl) <= done
        ready = [i for i in spec if i not in done and set(spec[i][0]) | set(spec[i][1]) <= done]
        assert node_id == min(ready)
        done.add(node_id)
