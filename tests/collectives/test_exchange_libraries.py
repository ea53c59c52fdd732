"""The expert-parallel exchange libraries (DeepEP, HybridEP): their network leg across nodes runs at the fraction
of the NICs' line rate their own benchmarks measure, which is low over 2 nodes; within a node NCCL's timing holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.collectives.algorithms import ALL_TO_ALL
from simulator.collectives.exchange import EXCHANGE_FILE, exchange_libraries, exchange_library
from simulator.collectives.hardware import load_profile
from simulator.collectives.library import Communicator
from simulator.collectives.nccl import CollectiveModel
from tests.conftest import simulation
from tests.simulator.test_nccl_run import A2A, coll, switch
from tests.workload.test_llm import SMALL_MOE
from tests.workload.test_llm_step import traces
from workload.errors import InputError
from workload.llm.plan import ParallelPlan

MODEL = CollectiveModel(load_profile("hgx-h100"))  # 8 GPUs and 8 x 400 Gb/s NICs per node
LINE_GBps = 50.0


def test_the_benchmark_metric_becomes_the_share_of_line_rate_that_crosses_a_nic() -> None:
    """The libraries count a token's copy to its own node: over N nodes (N - 1) / N of the metric crosses a NIC."""
    measured = yaml.safe_load(EXCHANGE_FILE.read_text())["libraries"]
    for name, library in exchange_libraries().items():
        for nodes, (dispatch, combine) in measured[name]["measured"].items():
            expected = (dispatch + combine) / 2 * (nodes - 1) / nodes / measured[name]["nic_GBps"]
            assert library.network_efficiency(nodes) == pytest.approx(expected)
    assert exchange_library("hybridep").network_efficiency(2) == pytest.approx(0.673, abs=1e-3)
    assert exchange_library("deepep").network_efficiency(2) == pytest.approx(0.43)


@pytest.mark.parametrize("name", ["hybridep", "deepep"])
def test_efficiency_between_and_beyond_the_measurements(name: str) -> None:
    library = exchange_library(name)
    (n0, e0), (n1, e1) = library.points[:2]
    assert library.network_efficiency((n0 + n1) // 2) == pytest.approx(e0 + (e1 - e0) * ((n0 + n1) // 2 - n0)
                                                                       / (n1 - n0))
    assert library.network_efficiency(1024) == library.points[-1][1]
    assert all(0 < e <= 1 for _, e in library.points)


def test_an_unknown_library_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(InputError, match=r"unknown expert-parallel exchange library 'nope'; valid: deepep, hybridep"):
        MODEL.plan(ALL_TO_ALL, 1 << 20, Communicator.packed(8, 1), exchange="nope")


@pytest.mark.parametrize("name", ["hybridep", "deepep"])
def test_across_two_nodes_the_exchange_crosses_the_nics_at_the_measured_share(name: str) -> None:
    """One rank per node (the exchange's cross-node stage): half of each rank's buffer leaves through its NIC."""
    size = 512 << 20
    two_nodes = Communicator.packed(2, 2)
    nccl = MODEL.plan(ALL_TO_ALL, size, two_nodes)
    plan = MODEL.plan(ALL_TO_ALL, size, two_nodes, exchange=name)
    nic_GBps = size / 2 / plan.time_ns
    assert nic_GBps == pytest.approx(exchange_library(name).network_efficiency(2) * LINE_GBps, rel=0.03)
    assert plan.time_ns > nccl.time_ns


def test_within_a_node_nccls_timing_holds() -> None:
    one_node = Communicator.packed(8, 1)
    for size in (1 << 20, 256 << 20):
        assert MODEL.plan(ALL_TO_ALL, size, one_node, exchange="hybridep").time_ns == \
            MODEL.plan(ALL_TO_ALL, size, one_node).time_ns


def test_the_flex_dispatchers_exchange_names_its_library_in_the_trace(tmp_path: Path) -> None:
    """Across NVLink domains (two of two GPUs here) both stages of the flex exchange carry comm_library; the
    alltoall dispatcher's all-to-all is NCCL's."""
    plan = ParallelPlan(dp=4, ep=4, num_micro_batches=1)
    flex = traces(tmp_path / "flex", SMALL_MOE, plan, moe_dispatcher="flex", moe_flex_backend="hybridep",
                  nvlink_domain=2)[0]
    exchanges = [n for n in flex.nodes if "alltoall_" in n.name and ".layer0." in n.name]
    assert {n.name.rsplit("_", 1)[-1] for n in exchanges} == {"across", "within"}
    assert {n.attrs.get("comm_library") for n in exchanges} == {"hybridep"}
    plain = traces(tmp_path / "a2a", SMALL_MOE, plan)[0]
    assert not [n for n in plain.nodes if "comm_library" in n.attrs]


def test_a_trace_naming_an_unknown_library_is_a_one_line_error_naming_the_node(tmp_path: Path) -> None:
    trace = [[coll(1, A2A, 1 << 20, comm_library="nope")]] * 2
    with pytest.raises(InputError) as e:
        simulation(tmp_path, trace, switch(2), collective_model="nccl", hw_profile="hgx-h100")
    assert "node 1" in str(e.value) and "valid: deepep, hybridep" in str(e.value) and "\n" not in str(e.value)
