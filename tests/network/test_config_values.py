"""Every config value is checked for type and range: a one-line error naming the file and the key."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from network.config import load_network, load_packet_config
from simulator.config import check_memory_fits, load_memory, load_system
from workload.errors import ConfigError, LimitError
from workload.groups import load_comm_groups

BAD = [True, math.nan, math.inf, -math.inf, 1e308, 10**400, -5, "fast", [1], {"a": 1}, None]
RING = {"topology": ["Ring"], "npus_count": [8], "bandwidth": [50.0], "latency": [500.0]}
FAT_TREE = {"fabric": "fat-tree", "npus": 8, "npus_per_leaf": 4, "spines": 2, "bandwidth": 50, "latency": 500}
DRAGONFLY = {"fabric": "dragonfly", "routers_per_group": 2, "npus_per_router": 2, "global_links_per_router": 1,
             "bandwidth": {"terminal": 100, "local": 100, "global": 50},
             "latency": {"terminal": 100, "local": 200, "global": 1000}}
SYSTEM = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
          "preferred-dataset-splits": 4, "all-reduce-implementation": ["ring"], "local-mem-bw": 1600,
          "peak-perf": 900, "roofline-enabled": 0}
MEMORY = {"memory-type": "PER_NODE_MEMORY_EXPANSION", "remote-mem-latency": 100, "remote-mem-bw": 50,
          "num-nodes": 2, "num-npus-per-node": 4}
PACKET = {"mtu_bytes": 4096, "header_bytes": 0, "buffer_bytes": 1 << 20, "flow_control": "credit"}


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    text = yaml.safe_dump(data) if name.endswith(".yml") else json.dumps(data)
    path.write_text(text, encoding="utf-8")
    return path


def load(kind: str, path: Path) -> Any:
    return {"network": load_network, "system": load_system, "memory": load_memory, "packet": load_packet_config,
            "groups": lambda p: load_comm_groups(p, 8)}[kind](path)


CASES = [("network", "ring.yml", RING, key, index) for key in ("npus_count", "bandwidth", "latency") for index in [0]]
CASES += [("network", "fat.yml", FAT_TREE, key, None) for key in ("npus", "npus_per_leaf", "spines", "bandwidth")]
CASES += [("network", "fly.yml", DRAGONFLY, key, None) for key in ("routers_per_group", "groups", "npus_per_router")]
CASES += [("system", "s.json", SYSTEM, key, None) for key in ("endpoint-delay", "active-chunks-per-dimension",
                                                              "preferred-dataset-splits", "local-mem-bw", "peak-perf")]
CASES += [("memory", "m.json", MEMORY, key, None) for key in ("remote-mem-latency", "remote-mem-bw", "num-nodes")]
CASES += [("packet", "p.yml", PACKET, key, None) for key in ("mtu_bytes", "buffer_bytes", "header_bytes")]


@pytest.mark.parametrize("value", BAD, ids=repr)
@pytest.mark.parametrize(("kind", "name", "base", "key", "index"), CASES, ids=[f"{c[1]}:{c[3]}" for c in CASES])
def test_bad_values_are_one_line_errors_naming_the_key(tmp_path: Path, kind: str, name: str, base: dict[str, Any],
                                                       key: str, index: int | None, value: Any) -> None:
    data = json.loads(json.dumps(base))
    if index is None:
        data[key] = value
    else:
        data[key][index] = value
    path = write(tmp_path, name, data)
    with pytest.raises((ConfigError, LimitError)) as e:
        load(kind, path)
    message = str(e.value)
    if name.endswith(".json") and isinstance(value, float) and not math.isfinite(value):
        key = "not valid JSON"  # JSON has no NaN or Infinity: the file itself is refused
    assert key in message and "\n" not in message and len(message) < 600, message


def test_yes_no_keys_take_only_yes_or_no(tmp_path: Path) -> None:
    links = {"fabric": "links", "npus": 2, "switches": 1, "links": [[0, "s0", 50, 10], [1, "s0", 50, 10]]}
    for value in ("no", "false", 2, [0]):
        with pytest.raises(ConfigError, match="'npus_forward' must be true/false or 0/1"):
            load_network(write(tmp_path, "l.yml", {**links, "npus_forward": value}))
    with pytest.raises(ConfigError, match="'roofline-enabled' must be true/false or 0/1"):
        load_system(write(tmp_path, "s.json", {**SYSTEM, "roofline-enabled": "yes"}))


def test_a_boolean_is_not_a_bandwidth(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'bandwidth' must be a number \(got True\)"):
        load_network(write(tmp_path, "n.yml", {**RING, "bandwidth": [True]}))


@pytest.mark.parametrize("fabric", [[1, 2], {"kind": "torus"}, "mesh", 7])
def test_the_fabric_kind_is_a_name(tmp_path: Path, fabric: Any) -> None:
    with pytest.raises(ConfigError, match="'fabric' must be one of fat-tree, torus, dragonfly, rail-optimized, links"):
        load_network(write(tmp_path, "n.yml", {**FAT_TREE, "fabric": fabric}))


@pytest.mark.parametrize("data", [
    {"fabric": "fat-tree", "k": 10_000, "bandwidth": 50},
    {"fabric": "torus", "dims": [100_000, 100_000], "bandwidth": 50},
    {"fabric": "dragonfly", "routers_per_group": 1000, "npus_per_router": 1000, "global_links_per_router": 1000,
     "bandwidth": 50},
    {"fabric": "links", "npus": 10**9, "links": [[0, 1, 50, 1]]},
    {"topology": ["Ring", "Ring"], "npus_count": [100_000, 100_000], "bandwidth": [50, 50], "latency": [1, 1]},
])
def test_networks_too_large_to_build_are_refused_before_building(tmp_path: Path, data: dict[str, Any]) -> None:
    with pytest.raises(LimitError, match=r"would have [\d,]+ NPUs.* ASTRASIM_PY_MAX_RANKS"):
        load_network(write(tmp_path, "n.yml", data))


def test_per_node_memory_must_cover_the_network(tmp_path: Path) -> None:
    memory = load_memory(write(tmp_path, "m.json", MEMORY))
    check_memory_fits(memory, 8)
    with pytest.raises(ConfigError, match=r"2 x 4 = 8, but the network has 16 NPUs"):
        check_memory_fits(memory, 16)


@pytest.mark.parametrize("groups", [{"x": [0, 1]}, {"1": [0, 99]}, {"1": [0, 0]}, {"1": []}, {"1": [0.5]},
                                    {"1": [True, 1]}, {"0": [0, 1]}, {"1" * 40: [0, 1]}])
def test_bad_communicator_groups(tmp_path: Path, groups: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="group"):
        load_comm_groups(write(tmp_path, "g.json", groups), 8)


def test_shipped_configs_load_without_warnings() -> None:
    repo = Path(__file__).resolve().parents[2]
    warnings: list[str] = []
    for path in sorted((repo / "configs" / "network").glob("*.yml")):
        load_network(path, warnings.append)
    for path in sorted((repo / "configs" / "system").glob("*.json")):
        load_system(path, warnings.append)
    for path in sorted((repo / "configs" / "memory").glob("*.json")):
        load_memory(path, warnings.append)
    load_packet_config(repo / "configs" / "packet" / "default.yml")
    load_comm_groups(repo / "configs" / "comm_groups" / "two_halves_of_8.json", 8)
    assert not warnings
