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


def renumbered_llm_traces(model: Any, plan: Any, group_order: Sequence[int], id_offsets: Sequence[int],
                          options: Any = None) -> list[list[Any]]:
    """Per-rank node lists of a generated LLM layout written as trace files would be: the communicator groups
    renumbered (one numbering for all ranks, as traces must agree on it), each rank's node ids shifted by its own
    offset and its names made per rank."""
    import numpy as np

    from workload.llm.build import build_programs
    from workload.llm.emit import TraceEmitter
    from workload.llm.options import TrainingOptions
    from workload.llm.plan import Group, RankMap
    from workload.protoscan import PADDING
    from workload.reader import decode_trace
    from workload.writer import graph_messages

    options = options or TrainingOptions()
    ranks = RankMap(plan, model, tail=options.iteration_tail)
    gids = sorted({g.gid for by_rank in ranks.groups.values() for g in by_rank.values() if g.gid})
    renumber = {gid: group_order[k % len(group_order)] * 1000 + k + 1 for k, gid in enumerate(gids)}
    ranks.groups = {kind: {r: Group(renumber.get(g.gid, 0), g.ranks) for r, g in by_rank.items()}
                    for kind, by_rank in ranks.groups.items()}
    emitter = TraceEmitter(build_programs(model, plan, options), ranks)
    traces = []
    for r in range(plan.world_size):
        data = np.frombuffer(emitter.rank_bytes(r) + bytes(PADDING), dtype=np.uint8)
        nodes = list(graph_messages(decode_trace(data, f"rank {r}")))
        shift = id_offsets[r % len(id_offsets)] * 100_000
        for node in nodes:
            node.id += shift
            node.data_deps[:] = [d + shift for d in node.data_deps]
            node.ctrl_deps[:] = [d + shift for d in node.ctrl_deps]
            node.name = f"{node.name}/r{r}"
        traces.append(nodes)
    return traces
