"""Sweep files: expansion into points, resolution of each point's run, and the errors for bad sweeps."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.sweep.spec import load_sweep
from simulator.sweep.worker import run_point
from tests.conftest import REPO
from workload.errors import ConfigError

NETWORK = {"topology": ["Ring", "Switch"], "npus_count": [4, 2], "bandwidth": [100.0, 50.0], "latency": [500.0, 900.0]}
WORKLOAD = {"generate": "collective", "type": "all_reduce", "size": "1MiB"}


def write_sweep(tmp_path: Path, axes: dict[str, Any], zip_: list[list[str]] | None = None,
                base: dict[str, Any] | None = None) -> str:
    data: dict[str, Any] = {"base": base or {"workload": WORKLOAD, "network": NETWORK}, "axes": axes}
    if zip_ is not None:
        data["zip"] = zip_
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_cartesian_product_in_file_order_with_the_last_axis_fastest(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, {"network.bandwidth": [10, 20, 30], "workload.size": ["1MiB", "2MiB"]}))
    assert [p.settings for p in sweep.points] == [
        {"network.bandwidth": b, "workload.size": s} for b, s in itertools.product([10, 20, 30], ["1MiB", "2MiB"])]
    assert [p.index for p in sweep.points] == list(range(6))
    assert len({p.key for p in sweep.points}) == 6


def test_zipped_axes_move_together(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, {
        "network.topology": [["Ring"], ["Ring", "Ring"]], "network.npus_count": [[8], [4, 2]],
        "network.latency": [100, 200, 300]}, zip_=[["network.topology", "network.npus_count"]]))
    assert len(sweep.points) == 6
    first, last = sweep.points[0].run, sweep.points[-1].run
    assert first is not None and last is not None
    assert first["network"]["npus_count"] == [8] and first["network"]["latency"] == [100]
    # a scalar fills every dimension of the point's own network, after zipped shapes are applied
    assert last["network"]["npus_count"] == [4, 2] and last["network"]["latency"] == [300, 300]
    # the built-in system gets one algorithm per dimension of that network
    assert first["system"]["all-reduce-implementation"] == ["ring"]
    assert last["system"]["all-reduce-implementation"] == ["ring", "ring"]


def test_index_and_list_values_and_options(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, {
        "network.bandwidth[1]": [7], "system.all-reduce-implementation": [["ring", "direct"], "halvingDoubling"],
        "backend": ["analytical-aware"], "options.queues_per_dim": [2]}))
    runs = [p.run for p in sweep.points]
    assert runs[0]["network"]["bandwidth"] == [100.0, 7]
    assert runs[0]["system"]["all-reduce-implementation"] == ["ring", "direct"]
    assert runs[1]["system"]["all-reduce-implementation"] == ["halvingDoubling", "halvingDoubling"]
    assert runs[0]["options"] == {"backend": "analytical-aware", "queues_per_dim": 2}


def test_files_are_relative_to_the_sweep_and_read_into_the_run(tmp_path: Path) -> None:
    sweep = load_sweep(str(REPO / "configs" / "sweeps" / "workload_backends.yaml"))
    assert len(sweep.points) == 24
    run = sweep.points[0].run
    assert run is not None
    assert run["network"] == yaml.safe_load((REPO / "configs" / "network" / "ring_8.yml").read_text())
    assert run["system"]["preferred-dataset-splits"] == 1
    assert run["workload"] == "../workloads/all_reduce/8npus_1MiB/all_reduce"
    assert sweep.points[0].sources["network"] == "../network/ring_8.yml"


def test_keys_depend_on_the_run_not_on_the_order_of_points(tmp_path: Path) -> None:
    a = load_sweep(write_sweep(tmp_path, {"network.bandwidth": [10, 20], "network.latency": [1, 2]}))
    (tmp_path / "b").mkdir()
    b = load_sweep(write_sweep(tmp_path / "b", {"network.latency": [2, 1], "network.bandwidth": [20, 10]}))
    assert {p.key for p in a.points} == {p.key for p in b.points}
    again = load_sweep(a.path)
    assert [p.key for p in again.points] == [p.key for p in a.points]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(1, 10_000), min_size=1, max_size=4, unique=True), min_size=1, max_size=3))
def test_point_count_is_the_product_of_axis_lengths(tmp_path_factory: Any, values: list[list[int]]) -> None:
    names = ["network.bandwidth[0]", "network.latency", "workload.repeat"][:len(values)]
    sweep = load_sweep(write_sweep(tmp_path_factory.mktemp("s"), dict(zip(names, values, strict=False))))
    expected = 1
    for v in values:
        expected *= len(v)
    assert len(sweep.points) == expected
    assert len({p.key for p in sweep.points}) == expected  # distinct runs, distinct keys


@pytest.mark.parametrize(("axes", "zip_", "base", "message"), [
    ({"network.bandwith": [1]}, None, None, "'bandwith' is not a network key; valid: topology, npus_count"),
    ({"netwrk.bandwidth": [1]}, None, None, "SECTION one of workload, network, packet, system"),
    ({"system.all-reduce-implementaton": ["ring"]}, None, None, "is not a system key"),
    ({"options.queue_per_dim": [1]}, None, None, "is not a options key"),
    ({"network.bandwidth": []}, None, None, "must be a non-empty list"),
    ({"network.bandwidth": 5}, None, None, "must be a non-empty list"),
    ({"network.bandwidth": [1, 2], "network.latency": [1]}, [["network.bandwidth", "network.latency"]], None,
     "zipped axes must have equal lengths"),
    ({"network.bandwidth": [1]}, [["network.latency"]], None, "zip names 'network.latency', which is not an axis"),
    ({"network.bandwidth": [1]}, None, {"workload": WORKLOAD}, "base needs a 'network'"),
    ({"network.bandwidth": [1]}, None, {"workload": WORKLOAD, "network": "missing.yml"},
     "missing.yml: network configuration file not found"),
    ({"network.bandwidth": [1]}, None, {"workload": WORKLOAD, "network": NETWORK, "sytem": {}},
     "base: unknown key(s) sytem"),
])
def test_structural_mistakes_stop_the_sweep_with_one_line(tmp_path: Path, axes: dict[str, Any], zip_: Any,
                                                          base: Any, message: str) -> None:
    path = write_sweep(tmp_path, axes, zip_, base)
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    assert message in str(e.value)
    assert str(e.value).startswith(path)
    assert "\n" not in str(e.value)


def test_a_point_that_cannot_be_resolved_fails_alone(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, {"network.bandwidth": [[100], [100, 50]], "network.bandwidth[1]": [5]}))
    bad, good = sweep.points
    assert bad.run is None
    assert bad.error == "axis network.bandwidth[1]: bandwidth has 1 entry, so there is no [1]"
    assert good.run is not None and good.run["network"]["bandwidth"] == [100.0, 5]
    outcome = run_point(bad.run, bad.root, bad.sources, bad.error)
    assert outcome["status"] == "failed" and outcome["error"] == bad.error


def test_points_run_with_the_values_they_name(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, {"network.bandwidth": [50, 100], "workload.size": ["1MiB", "4MiB"]}))
    finish = {}
    for p in sweep.points:
        outcome = run_point(p.run, p.root, p.sources)
        assert outcome["status"] == "ok", outcome["error"]
        finish[(p.settings["network.bandwidth"], p.settings["workload.size"])] = outcome["metrics"]["finish_ns"]
        assert json.loads(outcome["metrics"]["collectives"])[0]["kind"] == "all_reduce"
    assert finish[(100, "1MiB")] < finish[(50, "1MiB")] < finish[(50, "4MiB")]
    assert finish[(100, "1MiB")] < finish[(100, "4MiB")]
