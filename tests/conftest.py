"""Shared test helpers: writing small traces and running the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from workload.wire import frame_payloads
from workload.writer import make_metadata, serialize

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
REFERENCE = SHARED / "reference" / "astra-sim-2x"


def trace_bytes(nodes: Sequence[Any], version: str = "1.0.0") -> bytes:
    """A whole ET stream: GlobalMetadata then the nodes."""
    return frame_payloads([serialize(make_metadata(version))] + [serialize(n) for n in nodes])


def write_trace_file(path: Path, nodes: Sequence[Any]) -> Path:
    path.write_bytes(trace_bytes(nodes))
    return path


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``python -m simulator ARGS`` in a subprocess (the same code as the console script)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "simulator", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


@pytest.fixture
def reference() -> Path:
    if not REFERENCE.is_dir():
        pytest.skip("needs ../shared/reference (ASTRA-sim's reference cases) beside this checkout, as CI has it")
    return REFERENCE


def simulate(tmp_path: Path, traces: Sequence[Sequence[Any]], network: dict[str, Any] | None = None,
             system: dict[str, Any] | None = None, memory: dict[str, Any] | None = None,
             groups: dict[int, tuple[int, ...]] | None = None, warn: Any = None, **options: Any) -> Any:
    """Write per-rank traces and run them through the Python API; returns the SimulationResult."""
    return simulation(tmp_path, traces, network, system, memory, groups, warn, **options)[1]


def simulation(tmp_path: Path, traces: Sequence[Sequence[Any]], network: dict[str, Any] | None = None,
               system: dict[str, Any] | None = None, memory: dict[str, Any] | None = None,
               groups: dict[int, tuple[int, ...]] | None = None, warn: Any = None, **options: Any) -> Any:
    """Like ``simulate``, returning (the Simulation after its run, the SimulationResult)."""
    from network.config import network_from_dict
    from simulator.config import DEFAULT_SYSTEM, memory_from_dict, system_from_dict
    from simulator.simulation import RunOptions, Simulation
    from workload.traceset import resolve_workload

    folder = tmp_path / f"w{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    for rank, nodes in enumerate(traces):
        write_trace_file(folder / f"trace.{rank}.et", list(nodes))
    net = network_from_dict(network or {"topology": ["Ring"], "npus_count": [len(traces)], "bandwidth": [50.0],
                                        "latency": [500.0]})
    sys_cfg = system_from_dict({**DEFAULT_SYSTEM, **(system or {})})
    mem = memory_from_dict(memory or {"memory-type": "NO_MEMORY_EXPANSION"})
    sim = Simulation(resolve_workload(str(folder / "trace")), net, sys_cfg, mem, groups or {},
                     RunOptions(progress=False, **options), warn=warn)
    return sim, sim.run()


def finish_times(result: Any) -> list[int]:
    return [r.finish_ns for r in result.ranks]
