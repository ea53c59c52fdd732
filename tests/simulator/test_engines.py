"""The representative-rank (symmetric) engine gives exactly the message-level engine's results."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import simulate
from workload.schema import NodeType
from workload.writer import make_node

KIND = {"all_reduce": 0, "all_gather": 2, "reduce_scatter": 7, "all_to_all": 6}


@st.composite
def symmetric_runs(draw: st.DrawFn) -> dict:
    dims = draw(st.integers(1, 3))
    counts = draw(st.lists(st.sampled_from([2, 3, 4, 5, 8]), min_size=dims, max_size=dims).filter(
        lambda c: math.prod(c) <= 48))
    topology = draw(st.lists(st.sampled_from(["Ring", "FullyConnected", "Switch"]), min_size=dims, max_size=dims))
    algo = st.sampled_from(["ring", "direct", "direct2"])
    impls = {f"{k.replace('_', '-')}-implementation": draw(st.lists(algo, min_size=dims, max_size=dims))
             for k in KIND}
    if dims == 1 and draw(st.booleans()):  # one ring over all NPUs is a symmetry on one dimension only
        impls = {k: [draw(st.sampled_from(["oneRing", "oneDirect"]))] for k in impls}
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        deps = [i - 1] if i and draw(st.booleans()) else []
        if draw(st.integers(0, 3)):
            kind = draw(st.sampled_from(sorted(KIND)))
            size = draw(st.sampled_from([1 << 20, 65536, 99999, 4096]))
            nodes.append(make_node(i, f"c{i}", NodeType.COMM_COLL_NODE, data_deps=deps,
                                   attrs={"comm_type": KIND[kind], "comm_size": size,
                                          "comm_priority": draw(st.integers(0, 3))}))
        else:
            nodes.append(make_node(i, f"p{i}", NodeType.COMP_NODE, data_deps=deps,
                                   duration_micros=draw(st.integers(0, 40))))
    return {
        "network": {"topology": topology, "npus_count": counts,
                    "bandwidth": draw(st.lists(st.sampled_from([25.0, 50.0, 400.0]), min_size=dims, max_size=dims)),
                    "latency": draw(st.lists(st.sampled_from([0.0, 100.0, 936.25]), min_size=dims, max_size=dims))},
        "system": {**impls, "scheduling-policy": draw(st.sampled_from(["LIFO", "FIFO", "EXPLICIT"])),
                   "collective-optimization": draw(st.sampled_from(["localBWAware", "baseline"])),
                   "active-chunks-per-dimension": draw(st.integers(1, 3)),
                   "preferred-dataset-splits": draw(st.integers(1, 5)),
                   "endpoint-delay": draw(st.sampled_from([0, 10, 37]))},
        "backend": draw(st.sampled_from(["analytical-unaware", "analytical-aware"])),
        "queues_per_dim": draw(st.integers(1, 2)),
        "rendezvous": draw(st.booleans()),
        "nodes": nodes,
        "renumber": draw(st.booleans()),
    }


def renumbered(nodes: list, rank: int) -> list:
    """The nodes with ids and names of the rank's own (as per-rank exporters write them), same structure."""
    out = []
    for node in nodes:
        copy = type(node)()
        copy.CopyFrom(node)
        copy.id = node.id + 1000 * rank + 3
        copy.name = f"{node.name}@rank{rank}"
        del copy.data_deps[:]
        copy.data_deps.extend(d + 1000 * rank + 3 for d in node.data_deps)
        out.append(copy)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(symmetric_runs())
def test_symmetric_engine_equals_message_engine(tmp_path: Path, run: dict) -> None:
    npus = math.prod(run["network"]["npus_count"])
    traces = [renumbered(run["nodes"], r) for r in range(npus)] if run["renumber"] else [run["nodes"]] * npus
    kw = {k: run[k] for k in ("backend", "queues_per_dim", "rendezvous")}
    fast = simulate(tmp_path, traces, run["network"], run["system"], engine="auto", **kw)
    event(f"engine used: {fast.engine}")
    slow = simulate(tmp_path, traces, run["network"], run["system"], engine="message", **kw)
    assert [(r.finish_ns, r.exposed_comm_ns, r.comm_ns) for r in fast.ranks] == \
        [(r.finish_ns, r.exposed_comm_ns, r.comm_ns) for r in slow.ranks]


def test_symmetric_engine_refuses_asymmetric_runs(tmp_path: Path) -> None:
    from workload.errors import InputError

    nodes = [make_node(1, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0, "comm_size": 4096})]
    # the double binary tree gives each position of its only dimension its own role: no shift keeps it
    with pytest.raises(InputError, match="doubleBinaryTree"):
        simulate(tmp_path, [nodes] * 4, system={"all-reduce-implementation": ["doubleBinaryTree"]},
                 engine="symmetric")
    # halving-doubling is kept by exchanging positions (i -> i XOR c), on a Ring only by the half turn: folded
    # exactly (it was refused before)
    system = {"all-reduce-implementation": ["halvingDoubling"]}
    for topology, classes in (("Switch", 1), ("Ring", 2)):
        network = {"topology": [topology], "npus_count": [4], "bandwidth": [50.0], "latency": [500.0]}
        folded = simulate(tmp_path, [nodes] * 4, network, system=system, engine="symmetric")
        assert folded.simulated_ranks == classes
        assert folded.ranks == simulate(tmp_path, [nodes] * 4, network, system=system, engine="message").ranks


@pytest.mark.parametrize("backend", ["analytical-unaware", "analytical-aware"])
@pytest.mark.parametrize("topology", ["Ring", "Switch", "FullyConnected"])
def test_regular_runs_use_the_representative_rank(tmp_path: Path, backend: str, topology: str) -> None:
    nodes = [make_node(1, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0, "comm_size": 1 << 20})]
    network = {"topology": [topology], "npus_count": [16], "bandwidth": [50.0], "latency": [500.0]}
    fast = simulate(tmp_path, [nodes] * 16, network, backend=backend)
    slow = simulate(tmp_path, [nodes] * 16, network, backend=backend, engine="message")
    assert fast.engine == "symmetric" and slow.engine == "message"
    assert fast.ranks == slow.ranks


def test_ranks_numbering_their_own_nodes_share_the_representative(tmp_path: Path) -> None:
    """Per-rank node ids and names do not break symmetry; a different structure does."""
    nodes = [make_node(1, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0, "comm_size": 1 << 20}),
             make_node(2, "ag", NodeType.COMM_COLL_NODE, data_deps=[1], attrs={"comm_type": 2, "comm_size": 65536})]
    traces = [renumbered(nodes, r) for r in range(8)]
    fast = simulate(tmp_path, traces)
    slow = simulate(tmp_path, traces, engine="message")
    assert fast.engine == "symmetric" and fast.ranks == slow.ranks
    unchained = [make_node(1, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0, "comm_size": 1 << 20}),
                 make_node(2, "ag", NodeType.COMM_COLL_NODE, attrs={"comm_type": 2, "comm_size": 65536})]
    assert simulate(tmp_path, [unchained, *traces[1:]]).engine == "message"
