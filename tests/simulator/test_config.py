"""ASTRA-sim's config files load unchanged; bad values are ConfigErrors naming file and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from network.config import load_network, network_from_dict
from simulator.config import (
    DEFAULT_SYSTEM,
    load_system,
    memory_from_dict,
    system_from_dict,
)
from tests.conftest import REPO
from workload.errors import ConfigError
from workload.groups import comm_groups_from_dict


def test_reference_system_files_load(reference: Path) -> None:
    for path in sorted((reference / "cases").glob("*/system.json")):
        warnings: list[str] = []
        cfg = load_system(path, warnings.append)
        assert cfg.scheduling_policy in ("LIFO", "FIFO", "EXPLICIT") and cfg.implementation("all_reduce")


def test_keys_astra_sim_ignores_are_accepted_with_a_warning() -> None:
    warnings: list[str] = []
    cfg = system_from_dict({**DEFAULT_SYSTEM, "boost-mode": 0, "intra-dimension-scheduling": "FIFO",
                            "track-local-mem": 1, "my-key": 3}, "s.json", warnings.append)
    assert cfg.preferred_dataset_splits == 4
    assert any("'boost-mode' is not read by ASTRA-sim" in w for w in warnings)
    assert any("'intra-dimension-scheduling'" in w for w in warnings)
    assert any("unknown key(s) my-key" in w for w in warnings)


def test_missing_keys_get_documented_defaults() -> None:
    cfg = system_from_dict({"all-reduce-implementation": ["ring"]})
    assert (cfg.scheduling_policy, cfg.collective_optimization, cfg.preferred_dataset_splits) == \
        ("LIFO", "localBWAware", 1)
    assert cfg.endpoint_delay(2.0) == 10  # ASTRA-sim's built-in value is not scaled
    assert system_from_dict({"endpoint-delay": 10}).endpoint_delay(2.5) == 25
    assert set(cfg.defaults_used) == {"scheduling-policy=LIFO", "collective-optimization=localBWAware",
                                      "preferred-dataset-splits=1"}


@pytest.mark.parametrize("data,match", [
    ({"scheduling-policy": "RANDOM"}, r"'scheduling-policy' must be one of LIFO, FIFO, EXPLICIT \(got 'RANDOM'\)"),
    ({"all-reduce-implementation": ["rign"]}, "unknown collective algorithm 'rign'; valid: ring"),
    ({"all-reduce-implementation": ["direct0"]}, "unknown collective algorithm"),
    ({"preferred-dataset-splits": 0}, "'preferred-dataset-splits' must be a whole number from 1"),
    ({"local-mem-bw": "fast"}, "'local-mem-bw' must be a number"),
    ({"all-reduce-implementation-custom": ["a", "b"]}, "a list of one Chakra ET path prefix"),
    ({"active-chunks-per-dimension": 1.5}, "whole number"),
])
def test_bad_system_values(data: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        system_from_dict(data, "sys.json")
    assert str(info.value).startswith("sys.json")


def test_default_system_file_is_the_built_in_default() -> None:
    assert json.loads((REPO / "configs" / "system" / "default.json").read_text()) == DEFAULT_SYSTEM


@pytest.mark.parametrize("data,match", [
    ({"topology": ["Ring"], "npus_count": [8], "bandwidth": [50, 50], "latency": [1]}, "'bandwidth' has 2 entries"),
    ({"topology": ["Torus"], "npus_count": [8], "bandwidth": [50], "latency": [1]},
     r"'topology' must be one of Ring, FullyConnected, Switch \(got 'Torus'\)"),
    ({"topology": ["Ring"], "npus_count": [1], "bandwidth": [50], "latency": [1]},
     "'npus_count' must be a whole number from 2"),
    ({"topology": ["Ring"], "npus_count": [4], "bandwidth": [0], "latency": [1]}, "'bandwidth' must be above 0"),
    ({"topology": ["Ring"], "npus_count": [4], "bandwidth": [5]}, "missing key 'latency'"),
])
def test_bad_network_values(data: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        network_from_dict(data, "net.yml")


def test_network_files(tmp_path: Path) -> None:
    for path in sorted((REPO / "configs" / "network").glob("*.yml")):
        net = load_network(path)
        assert net.num_npus == len({net.coordinates(i) for i in range(net.num_npus)})
    bad = tmp_path / "bad.yml"
    bad.write_text("topology: [Ring\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_network(bad)


def test_memory_and_groups() -> None:
    mem = memory_from_dict({"memory-type": "MEMORY_POOL", "remote-mem-latency": 5, "remote-mem-bw": 2})
    assert mem.access_time_ns(9) == 5 + 4
    with pytest.raises(ConfigError, match="remote-mem-bw"):
        memory_from_dict({"memory-type": "MEMORY_POOL"}, "m.json")
    assert comm_groups_from_dict({"2": [3, 1]}, 4) == {2: (3, 1)}  # listed order is kept
    for bad, match in (({"0": [1]}, "must be positive"), ({"1": [9]}, "outside the 4 NPUs"),
                       ({"1": [1, 1]}, "more than once")):
        with pytest.raises(ConfigError, match=match):
            comm_groups_from_dict(bad, 4, "g.json")
