"""Compute that cannot be timed is never silent, and results record the compute model actually used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, simulate, write_trace_file
from workload.errors import InputError
from workload.schema import NodeType
from workload.writer import make_node

RING2 = {"topology": ["Ring"], "npus_count": [2], "bandwidth": [50.0], "latency": [500.0]}


def gemm(node_id: int, micros: int = 0, flops: int | None = 10**12, tensor: int = 10**8) -> object:
    attrs = {} if flops is None else {"num_ops": flops, "tensor_size": tensor}
    return make_node(node_id, f"gemm{node_id}", NodeType.COMP_NODE, duration_micros=micros, attrs=attrs)


def run(tmp_path: Path, nodes: list[object], **options: object) -> tuple[object, list[str]]:
    warnings: list[str] = []
    result = simulate(tmp_path, [nodes, nodes], RING2, warn=warnings.append, **options)
    return result, warnings


def test_flops_without_durations_or_device_warn_naming_the_device_option(tmp_path: Path) -> None:
    result, warnings = run(tmp_path, [gemm(0), gemm(1)])
    assert result.ranks[0].compute_ns == 2  # ASTRA-sim's 1 ns each: what the warning is about
    (message,) = [w for w in warnings if "no recorded duration" in w]
    assert "2 GPU compute node(s)" in message and "--device" in message and "gemm0" in message


def test_nodes_with_neither_durations_nor_flops_say_no_model_can_time_them(tmp_path: Path) -> None:
    _, warnings = run(tmp_path, [gemm(0, flops=None)])
    (message,) = [w for w in warnings if "no recorded duration" in w]
    assert "--device" not in message and "carry no FLOPs" in message


def test_strict_refuses_untimed_compute(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="refused under --strict"):
        run(tmp_path, [gemm(0)], strict=True)


def test_recorded_durations_or_a_device_need_no_warning(tmp_path: Path) -> None:
    assert not run(tmp_path, [gemm(0, micros=5)])[1]
    result, warnings = run(tmp_path, [gemm(0)], device="H100")
    assert not warnings
    assert result.ranks[0].compute_ns == int(10**12 / 989.4e12 * 1e9)


def test_roofline_nodes_without_bytes_warn(tmp_path: Path) -> None:
    _, warnings = run(tmp_path, [gemm(0, tensor=0)], device="A100")
    assert any("tensor_size 0" in w for w in warnings)


def test_results_record_the_effective_compute_model(tmp_path: Path) -> None:
    trace = tmp_path / "w"
    trace.mkdir()
    for rank in range(2):
        write_trace_file(trace / f"t.{rank}.et", [gemm(0)])
    network = tmp_path / "ring.yml"
    network.write_text(json.dumps(RING2))
    out = tmp_path / "r.json"
    done = run_cli("--workload", str(trace / "t"), "--network", str(network), "--device", "h100", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "roofline model (H100" in done.stdout
    config = json.loads(out.read_text())["config"]
    assert config["compute"] == {"model": "roofline", "device": "H100", "peak_tflops": 989.4, "memory_bw_GBps": 3350.0}
    assert config["system"]["roofline_enabled"] is True and config["system"]["device"] == "H100"
    done = run_cli("--workload", str(trace / "t"), "--network", str(network), "--strict")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "--device" in done.stderr
