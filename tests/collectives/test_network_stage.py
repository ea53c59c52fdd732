"""The network stage of multi-node collectives: NIC bounds per algorithm, transports, chunks in flight."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.collectives.hardware import load_profile, parse_profile
from simulator.collectives.nccl import ALL_REDUCE, NVLS_TREE, RING, CollectiveModel, Communicator
from simulator.collectives.network import (
    TRANSPORT_DEFAULTS,
    chunk_bytes,
    inflight_factor,
    latencies_per_step,
    net_busbw_bound,
    node_nic_GBps,
)
from workload.errors import ConfigError

GiB = 1 << 30


def test_nic_bounds_follow_each_algorithm() -> None:
    """8 GPUs and 8x 400 Gb/s per node (400 GB/s): a ring crosses the node's NICs once; NVLS-tree sends the buffer
    once each way over 2 nodes and twice over more; all-to-all sends every GPU's off-node share."""
    node = node_nic_GBps(8, 50.0, 8, 8)
    assert node == 400.0
    assert net_busbw_bound("ring", ALL_REDUCE, 16, 2, 8, node) == 400.0
    assert net_busbw_bound("nvls_tree", ALL_REDUCE, 16, 2, 8, node) == pytest.approx(400 * 2 * 15 / 16)
    assert net_busbw_bound("nvls_tree", ALL_REDUCE, 32, 4, 8, node) == pytest.approx(200 * 2 * 31 / 32)
    assert net_busbw_bound("direct", "all_to_all", 16, 2, 8, node) == pytest.approx(400 * 15 / (8 * 8))
    assert node_nic_GBps(8, 50.0, 2, 8) == 100.0  # two GPUs of a node use their two nearest NICs
    assert node_nic_GBps(8, 50.0, 1, 16) == 50.0  # at least one NIC


def test_nvls_tree_on_two_nodes_beats_the_nics_ring_and_not_the_switch() -> None:
    model = CollectiveModel(load_profile("aws-p5-h100"))
    comm = Communicator.packed(16, 2)
    plan = model.plan(ALL_REDUCE, 8 * GiB, comm)
    assert plan.chosen.algorithm == NVLS_TREE
    assert model.network_GBps(comm) < plan.chosen.busbw_GBps <= model.up_busbw(NVLS_TREE, ALL_REDUCE, comm)
    ring = model.candidate(RING, "Simple", ALL_REDUCE, 8 * GiB, comm)
    assert ring.busbw_GBps <= model.network_GBps(comm)


def test_all_to_all_over_the_network_is_bound_by_each_gpus_share_of_the_nics() -> None:
    model = CollectiveModel(load_profile("aws-p5-h100"))
    for nodes in (2, 4, 32):
        comm = Communicator.packed(8 * nodes, nodes)
        chosen = model.plan("all_to_all", 2 * GiB, comm).chosen
        n = comm.ranks
        assert chosen.busbw_GBps <= 400.0 * (n - 1) / (8 * (n - 8)) * (1 + 1e-9)


def test_rccl_keeps_ll128_on_one_node() -> None:
    model = CollectiveModel(load_profile("mi355x"))
    assert "LL128" in {p for _, p in model.enabled(ALL_REDUCE, Communicator.packed(8, 1))}
    assert "LL128" not in {p for _, p in model.enabled(ALL_REDUCE, Communicator.packed(16, 2))}
    nccl = CollectiveModel(load_profile("hgx-h100"))
    assert "LL128" in {p for _, p in nccl.enabled(ALL_REDUCE, Communicator.packed(16, 2))}


def test_the_transports_latency_slows_multi_node_calls_only() -> None:
    base = load_profile("hgx-h100")
    assert base.scale_out is not None
    slow = replace(base, scale_out=replace(base.scale_out, latency_us=base.scale_out.latency_us + 50))
    fast_model, slow_model = CollectiveModel(base), CollectiveModel(slow)
    one, two = Communicator.packed(8, 1), Communicator.packed(16, 2)
    assert fast_model.plan(ALL_REDUCE, 4096, one).time_ns == slow_model.plan(ALL_REDUCE, 4096, one).time_ns
    assert slow_model.plan(ALL_REDUCE, 4096, two).time_ns > fast_model.plan(ALL_REDUCE, 4096, two).time_ns + 50_000


@settings(max_examples=80, deadline=None)
@given(st.floats(1.0, 1e9), st.floats(1.0, 1e9), st.integers(1, 64), st.floats(0.1, 100.0), st.floats(0.0, 500.0))
def test_chunks_in_flight_never_exceed_the_channel_and_grow_with_the_chunk(a: float, b: float, slots: int,
                                                                           channel_GBps: float, rtt_us: float) -> None:
    small, large = sorted((a, b))
    f_small = inflight_factor(small, slots, channel_GBps, rtt_us)
    f_large = inflight_factor(large, slots, channel_GBps, rtt_us)
    assert 0 < f_small <= f_large <= 1.0


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(("ring", "tree", "nvls_tree", "direct", "p2p")), st.integers(1, 1 << 36),
       st.integers(1, 1 << 36))
def test_chunks_grow_with_the_buffer(algorithm: str, a: int, b: int) -> None:
    small, large = sorted((a, b))
    c_small, slots = chunk_bytes(algorithm, ALL_REDUCE, small, 16, 16, 8)
    c_large, _ = chunk_bytes(algorithm, ALL_REDUCE, large, 16, 16, 8)
    assert 0 < c_small <= c_large and slots >= 1


def test_scale_out_options_are_checked() -> None:
    good = {"name": "x", "gpu": "g", "gpus_per_node": 8, "library": "nccl", "library_version": "2", "arch": "hopper",
            "scale_up": {"fabric": "nvswitch", "links_per_gpu": 18, "link_bandwidth_GBps": 25, "latency_us": 1},
            "scale_out": {"nics_per_node": 8, "nic_bandwidth_Gbps": 400, "transport": "efa", "latency_us": 35}}
    profile = parse_profile(good, "p.yml")
    assert profile.scale_out is not None
    assert profile.scale_out.stream_efficiency == TRANSPORT_DEFAULTS["efa"].efficiency
    tuned = parse_profile({**good, "scale_out": {**good["scale_out"], "efficiency": 0.7, "buffsize_bytes": 8 << 20}},
                          "p.yml")
    assert tuned.scale_out is not None and tuned.scale_out.stream_efficiency == 0.7
    for bad in ({"efficiency": 1.5}, {"efficiency": 0}, {"buffsize_bytes": 0}, {"nvls_chunk_bytes": "big"}):
        with pytest.raises(ConfigError, match="scale_out"):
            parse_profile({**good, "scale_out": {**good["scale_out"], **bad}}, "p.yml")
    assert math.isinf(CollectiveModel(profile).network_GBps(Communicator.packed(8, 1)))


def test_platform_environment_restricts_algorithms_and_protocols() -> None:
    """GPUDirect-TCPX's NCCL environment (NCCL_ALGO=Ring,Tree, NCCL_PROTO=Simple) and TCPXO's (Simple,LL128): the
    library never picks anything else, while all-to-all keeps its direct exchange."""
    high, mega = CollectiveModel(load_profile("gcp-a3-high")), CollectiveModel(load_profile("gcp-a3-mega"))
    two = Communicator.packed(16, 2)
    for size in (8, 1 << 16, 1 << 24, 1 << 32):
        for kind in (ALL_REDUCE, "all_gather"):
            assert {(c.algorithm, c.protocol) for c in high.plan(kind, size, two).candidates} <= {
                (RING, "Simple"), ("tree", "Simple")}
            assert all(c.protocol != "LL" for c in mega.plan(kind, size, two).candidates)
    assert high.plan("all_to_all", 1 << 20, two).chosen.algorithm == "direct"
    one = Communicator.packed(8, 1)
    assert high.plan(ALL_REDUCE, 1 << 30, one).chosen.algorithm == RING  # NVLS is not in its NCCL_ALGO


def test_unpacking_transports_wait_for_a_completion_every_step() -> None:
    assert latencies_per_step("ib", "LL128") == 1 and latencies_per_step("ib", "Simple") == 2
    assert latencies_per_step("tcp", "LL128") == 2 and latencies_per_step("tcp", "LL") == 2
    profile = load_profile("gcp-a3-mega")
    rdma = CollectiveModel(replace(profile, scale_out=replace(profile.scale_out, transport="roce")))
    tcpxo, two = CollectiveModel(profile), Communicator.packed(16, 2)
    small = {m: m.plan(ALL_REDUCE, 8, two, "tree").chosen for m in (rdma, tcpxo)}
    assert small[tcpxo].protocol == small[rdma].protocol == "LL128"
    steps = 2  # a tree of two nodes: up and down
    assert small[tcpxo].latency_us - small[rdma].latency_us == pytest.approx(steps * profile.scale_out.latency_us)


def test_environment_keys_are_checked() -> None:
    good = {"name": "x", "gpu": "g", "gpus_per_node": 8, "library": "nccl", "library_version": "2", "arch": "hopper",
            "scale_up": {"fabric": "nvswitch", "links_per_gpu": 18, "link_bandwidth_GBps": 25, "latency_us": 1}}
    assert parse_profile({**good, "algorithms": ["ring"], "protocols": ["Simple"]}, "p.yml").algorithms == ("ring",)
    for bad in ({"algorithms": []}, {"algorithms": ["Ring"]}, {"protocols": ["simple"]}, {"protocols": "Simple"}):
        with pytest.raises(ConfigError, match=r"algorithms|protocols"):
            parse_profile({**good, **bad}, "p.yml")


def test_the_machines_gpu_nic_path_slows_timing_not_the_librarys_choice() -> None:
    """A VM whose PCIe path lets half the NICs' line rate through (path_efficiency 0.5): a large multi-node ring takes
    about twice as long, one node is untouched, and the library, which does not know the path, chooses the same."""
    profile = load_profile("dgx-a100")
    assert profile.scale_out is not None and profile.scale_out.path_efficiency == 1.0
    vm = replace(profile, scale_out=replace(profile.scale_out, path_efficiency=0.5))
    bare, slow = CollectiveModel(profile), CollectiveModel(vm)
    two, one = Communicator.packed(16, 2), Communicator.packed(8, 1)
    assert slow.network_GBps(two) == bare.network_GBps(two) / 2 == slow.network_GBps(two, path=False) / 2
    for size in (1 << 10, 1 << 20, 1 << 26, 1 << 33):
        fast_plan, slow_plan = bare.plan(ALL_REDUCE, size, two), slow.plan(ALL_REDUCE, size, two)
        assert [(c.algorithm, c.protocol) for c in fast_plan.candidates] == [
            (c.algorithm, c.protocol) for c in slow_plan.candidates]
        assert slow_plan.time_ns >= fast_plan.time_ns
        assert slow.plan(ALL_REDUCE, size, one).time_ns == bare.plan(ALL_REDUCE, size, one).time_ns
    big = (slow.plan(ALL_REDUCE, 1 << 34, two, "ring").chosen, bare.plan(ALL_REDUCE, 1 << 34, two, "ring").chosen)
    assert big[0].busbw_GBps == pytest.approx(big[1].busbw_GBps / 2, rel=0.05)


def test_path_efficiency_is_checked() -> None:
    good = {"name": "x", "gpu": "g", "gpus_per_node": 8, "library": "nccl", "library_version": "2", "arch": "ampere",
            "scale_up": {"fabric": "nvswitch", "links_per_gpu": 12, "link_bandwidth_GBps": 25, "latency_us": 1},
            "scale_out": {"nics_per_node": 8, "nic_bandwidth_Gbps": 200, "transport": "ib", "latency_us": 2}}
    assert parse_profile({**good, "scale_out": {**good["scale_out"], "path_efficiency": 0.6}},
                         "p.yml").scale_out.path_efficiency == 0.6  # type: ignore[union-attr]
    for bad in (0, 1.2, "half"):
        with pytest.raises(ConfigError, match="path_efficiency"):
            parse_profile({**good, "scale_out": {**good["scale_out"], "path_efficiency": bad}}, "p.yml")
