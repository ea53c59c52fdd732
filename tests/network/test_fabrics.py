"""Fabric generators, fabric files, and routing (ECMP on fabrics, dimension order on ASTRA-sim dimensions)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from network.backends import CongestionAware
from network.config import load_network, network_from_dict
from network.fabrics import fabric_from_dict
from network.topology import EcmpRouter, Flows, from_dimensions
from simulator.engine import Engine
from tests.conftest import REPO
from workload.errors import ConfigError


def hops(router: Any, src: int, dst: int, flow: int = 0) -> int:
    return len(router.path(src, dst, flow)) - 1


def test_three_level_fat_tree() -> None:
    fabric = fabric_from_dict({"fabric": "fat-tree", "k": 4, "bandwidth": 100, "latency": 10}, "ft.yml")
    assert (fabric.num_npus, fabric.num_switches, fabric.num_links) == (16, 20, 96)
    assert fabric.logical_dims == (2, 2, 4)
    router = EcmpRouter(fabric)
    assert hops(router, 0, 1) == 2  # same edge switch
    assert hops(router, 0, 2) == 4  # same pod
    assert hops(router, 0, 15) == 6  # through the core
    paths = {tuple(router.path(0, 15, flow)) for flow in range(64)}
    assert len(paths) == 4  # 2 aggregation x 2 core choices, all used
    assert all(p[0] == 0 and p[-1] == 15 for p in paths)


def test_oversubscription_and_leaf_spine() -> None:
    k8 = fabric_from_dict({"fabric": "fat-tree", "k": 8, "levels": 2, "oversubscription": 2, "bandwidth": 1}, "x")
    assert k8.num_npus == 32
    leaf0 = k8.num_npus  # the first switch
    assert len([n for n in k8.graph.successors(leaf0) if n >= k8.num_npus]) == 2  # 4 NPUs, 2 uplinks
    explicit = fabric_from_dict({"fabric": "fat-tree", "npus": 64, "npus_per_leaf": 8, "spines": 2,
                                 "bandwidth": 50, "uplink_bandwidth": 100}, "x")
    assert (explicit.num_switches, explicit.logical_dims) == (10, (8, 8))
    assert explicit.link(64, 72) == (100.0, 0.0)  # leaf0 -> spine0
    assert explicit.link(0, 64) == (50.0, 0.0)


def test_torus_dragonfly_rail_links() -> None:
    torus = fabric_from_dict({"fabric": "torus", "dims": [4, 4], "bandwidth": 10, "latency": 5}, "t")
    assert torus.num_links == 64 and torus.npus_forward
    router = EcmpRouter(torus)
    for a, b in itertools.product(range(16), repeat=2):
        if a != b:
            dx, dy = abs(a % 4 - b % 4), abs(a // 4 - b // 4)
            assert hops(router, a, b) == min(dx, 4 - dx) + min(dy, 4 - dy)

    fly = fabric_from_dict({"fabric": "dragonfly", "routers_per_group": 2, "npus_per_router": 1,
                            "global_links_per_router": 2, "bandwidth": 1}, "d")
    groups = 5
    assert fly.num_npus == 10
    routers = list(range(fly.num_npus, fly.num_npus + 10))
    between = {(a // 2 % groups, b // 2 % groups) for a in routers for b in fly.graph.successors(a) if b in routers
               and (a - fly.num_npus) // 2 != (b - fly.num_npus) // 2}
    assert len(between) == groups * (groups - 1)  # every ordered pair of groups joined once
    assert max(hops(EcmpRouter(fly), a, b) for a in range(10) for b in range(10) if a != b) <= 5

    rail = fabric_from_dict({"fabric": "rail-optimized", "nodes": 2, "gpus_per_node": 4, "nvlink_bandwidth": 400,
                             "nic_bandwidth": 50}, "r")
    router = EcmpRouter(rail)
    assert rail.logical_dims == (4, 2)
    assert [rail.names[n] for n in router.path(0, 3, 0)] == ["npu0", "nvswitch0", "npu3"]
    assert [rail.names[n] for n in router.path(1, 5, 0)] == ["npu1", "rail1", "npu5"]
    assert hops(router, 0, 5) == 4  # other rail, other node: leaf, spine, leaf

    net = load_network(REPO / "configs" / "network" / "links_example.yml")
    assert net.fabric is not None and net.num_npus == 4
    assert [net.fabric.names[n] for n in EcmpRouter(net.fabric).path(0, 3, 0)] == ["npu0", "left", "right", "npu3"]


def test_shipped_fabrics_load() -> None:
    for name in ("fat_tree_64", "fat_tree_64_oversubscribed", "fat_tree_k8", "torus_4x4x4", "dragonfly_72",
                 "rail_optimized_4x8", "links_example"):
        net = load_network(REPO / "configs" / "network" / f"{name}.yml")
        assert net.fabric is not None
        assert net.num_npus == net.fabric.num_npus


@pytest.mark.parametrize(("data", "message"), [
    ({"fabric": "fat-tre"}, "'fabric' must be one of fat-tree, torus, dragonfly, rail-optimized, links"),
    ({"fabric": "fat-tree", "k": 5, "bandwidth": 1}, "'k' must be even"),
    ({"fabric": "fat-tree", "k": 8, "oversubscription": 3, "bandwidth": 1}, "divisible by 'oversubscription'"),
    ({"fabric": "fat-tree", "npus": 10, "npus_per_leaf": 4, "spines": 1, "bandwidth": 1}, "multiple of"),
    ({"fabric": "fat-tree", "npus": 8, "npus_per_leaf": 4, "spines": 1}, "missing key 'bandwidth'"),
    ({"fabric": "fat-tree", "k": 4, "bandwidth": -1}, "'bandwidth' must be above 0"),
    ({"fabric": "fat-tree", "k": 4, "bandwidth": 1, "radix": 4}, "unknown key(s) radix for a fat-tree fabric"),
    ({"fabric": "torus", "dims": [4, 1], "bandwidth": 1}, "'dims' must be a whole number from 2"),
    ({"fabric": "torus", "dims": [4, 4], "bandwidth": [1, 2, 3]}, "'bandwidth' has 3 entries for 2 dimensions"),
    ({"fabric": "dragonfly", "routers_per_group": 2, "npus_per_router": 1, "global_links_per_router": 1,
      "groups": 9, "bandwidth": 1}, "at most routers_per_group x global_links_per_router + 1 = 3 groups"),
    ({"fabric": "dragonfly", "routers_per_group": 2, "npus_per_router": 1, "global_links_per_router": 1,
      "bandwidth": {"local": 1}}, "'bandwidth' needs exactly the link kinds terminal, local, global"),
    ({"fabric": "links", "npus": 3, "links": [[0, 1, 1, 0]]}, "npu2 cannot be reached from npu0"),
    ({"fabric": "links", "npus": 2, "links": [[0, "s9", 1, 0]]}, "links[0]: unknown endpoint 's9'"),
    ({"fabric": "links", "npus": 2, "links": [[0, 0, 1, 0]]}, "a link from npu0 to itself"),
    ({"fabric": "torus", "dims": [4, 4], "bandwidth": 1, "logical_dims": [4, 2]}, "multiply to 8"),
    ({"fabric": "torus", "dims": [4, 4], "bandwidth": 1, "packet": {"mtu": 9000}}, "packet: unknown key(s) mtu"),
    ({"fabric": "torus", "dims": [4], "bandwidth": 1, "packet": {"buffer_bytes": 100}}, "must hold at least one"),
])
def test_fabric_mistakes_are_one_line_errors(tmp_path: Path, data: dict[str, Any], message: str) -> None:
    path = tmp_path / "fabric.yml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_network(path)
    assert message in str(e.value)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_dimension_fabric_routes_like_analytical_aware() -> None:
    net = network_from_dict({"topology": ["Ring", "Switch", "FullyConnected"], "npus_count": [4, 3, 2],
                             "bandwidth": [1, 2, 3], "latency": [1, 1, 1]})
    fabric, router = from_dimensions(net.topology, net.npus_count, net.bandwidth_GiBps, net.latency_ns, net.path)
    aware = CongestionAware(net, Engine())
    for src, dst in itertools.permutations(range(net.num_npus), 2):
        nodes = router.path(src, dst, 0)
        links = aware.route(src, dst)
        assert len(nodes) - 1 == len(links)
        npu_hops = [(a, b) for a, b in itertools.pairwise(nodes) if a < 24 and b < 24]
        assert npu_hops == [(x.src, x.dst) for x in links if x.src < 24 and x.dst < 24]
        for a, b in itertools.pairwise(nodes):
            assert fabric.graph.has_edge(a, b)


def test_flows_number_messages_per_pair() -> None:
    fabric = fabric_from_dict({"fabric": "fat-tree", "k": 4, "bandwidth": 1}, "x")
    first, second = Flows(EcmpRouter(fabric)), Flows(EcmpRouter(fabric))
    assert [first.path(0, 15) for _ in range(20)] == [second.path(0, 15) for _ in range(20)]
