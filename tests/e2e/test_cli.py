"""The astrasim-py command end to end, in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import REPO, run_cli

WORKLOAD = str(REPO / "configs" / "workloads" / "all_reduce" / "8npus_1MiB" / "all_reduce")
RING = str(REPO / "configs" / "network" / "ring_8.yml")


def test_shipped_example_runs_with_the_default_system(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = run_cli("--workload", WORKLOAD, "--network", RING, "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "end-to-end time: 64.440 µs (64440 ns) over 8 ranks" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["finish_ns"] == 64440 and doc["version"] and doc["backend"] == "analytical-unaware"
    rank = doc["ranks"][0]
    assert {"rank", "finish_ns", "exposed_comm_ns", "compute_ns", "comm_ns", "overlap_ns", "idle_ns"} <= set(rank)


def test_astra_sim_format_and_module_entry(tmp_path: Path) -> None:
    result = run_cli("--workload", WORKLOAD, "--network", RING, "--format", "astra-sim")
    lines = result.stdout.splitlines()
    assert lines[0] == "sys[0] finished, 64440 cycles, exposed communication 64440 cycles."
    assert lines[1] == "sys[0], Wall time: 64440 | GPU time: 0 | Comm time: 64440 | " \
                       "Total compute-communication overlap: 0"
    assert len(lines) == 16


def test_every_shipped_network_runs(tmp_path: Path) -> None:
    for name, system in (("hgx_h100_8", "hgx_h100"), ("torus_4x8", "torus_2d"), ("pod_3d", "pod_3d")):
        network = REPO / "configs" / "network" / f"{name}.yml"
        npus = {"hgx_h100_8": 8, "torus_4x8": 32, "pod_3d": 512}[name]
        gen = run_cli("trace", "generate", "collective", "--type", "all_reduce", "--size", "4MiB", "--npus",
                      str(npus), "-o", str(tmp_path))
        prefix = gen.stdout.split()[0]
        result = run_cli("--workload", prefix, "--network", str(network), "--system",
                         str(REPO / "configs" / "system" / f"{system}.json"))
        assert result.returncode == 0, result.stderr
        assert "end-to-end time:" in result.stdout


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    result = run_cli("--workload", WORKLOAD, "--network", str(REPO / "configs" / "network" / "torus_4x8.yml"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "8 per-rank traces but the network has 32 NPUs" in result.stderr.strip().splitlines()[-1]
    missing = run_cli("--workload", WORKLOAD, "--network", str(tmp_path / "nope.yml"))
    assert missing.returncode == 1 and "network configuration file not found" in missing.stderr


def test_python_api_returns_what_the_cli_writes(tmp_path: Path) -> None:
    from simulator.api import simulate

    result = simulate(WORKLOAD, RING)
    out = tmp_path / "r.json"
    run_cli("--workload", WORKLOAD, "--network", RING, "--json", str(out))
    doc = json.loads(out.read_text())
    assert result.to_json()["ranks"] == doc["ranks"] and result.finish_ns == doc["finish_ns"]


def test_device_turns_the_roofline_model_on(tmp_path: Path) -> None:
    """--device times GPU compute nodes by the device's roofline even when the system file leaves it off."""
    from compute.devices import device

    out = tmp_path / "c"
    assert run_cli("trace", "generate", "compute", "--npus", "2", "--count", "3", "--num-ops", "1000000000000",
                   "--tensor-size", "1GiB", "-o", str(out)).returncode == 0
    net = tmp_path / "ring2.yml"
    net.write_text("topology: [Ring]\nnpus_count: [2]\nbandwidth: [50]\nlatency: [500]\n")
    runs = {}
    for args in ([], ["--device", "H100"]):
        r = run_cli("--workload", str(out / "compute"), "--network", str(net), "--json", str(tmp_path / "r.json"),
                    *args)
        assert r.returncode == 0, r.stderr
        runs[bool(args)] = json.loads((tmp_path / "r.json").read_text())["ranks"][0]["compute_ns"]
    h100 = device("H100")
    perf = min(h100.memory_bw_GBps * 1e9 * 1e12 / (1 << 30), h100.peak_tflops * 1e12)
    assert runs[False] == 3  # recorded durations of 0 us: 1 ns each
    assert runs[True] == 3 * int(1e12 / perf * 1e9)


def test_version_and_a_help_that_lists_every_subcommand() -> None:
    from simulator.cli import SUBCOMMANDS
    from simulator.simulation import VERSION

    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"astrasim-py {VERSION}"
    help_text = run_cli("--help").stdout
    for name in (*SUBCOMMANDS, "trace generate", "trace convert", "trace rescale", "trace synthesize",
                 "sweep export"):
        assert f"astrasim-py {name}" in help_text, name
