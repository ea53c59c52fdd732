"""The Python API: run a simulation from file paths (or already loaded configs)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from network.config import NetworkConfig, load_network
from simulator.config import (
    MemoryConfig,
    SystemConfig,
    default_system,
    load_memory,
    load_system,
)
from simulator.results import SimulationResult
from simulator.simulation import RunOptions, Simulation
from workload.generated import workload_traces
from workload.groups import load_comm_groups

PathLike = str | os.PathLike[str]


def simulate(workload: PathLike, network: PathLike | NetworkConfig, system: PathLike | SystemConfig | None = None,
             memory: PathLike | MemoryConfig | None = None, comm_groups: PathLike | dict[int, tuple[int, ...]] | None
             = None, warn: Callable[[str], None] | None = None, **options: Any) -> SimulationResult:
    """Simulate ``workload`` (an ASTRA-sim prefix, folder or file, or a generator YAML file) on ``network``.

    Options are RunOptions fields (``backend``, ``queues_per_dim``, ``injection_scale``, ``rendezvous``,
    ``semantics``, ``engine``, ``device`` (a device name or device file), ``compute_model`` ("roofline" or
    "kernels": each compute node by operator and shape on ``device``), ``collective_model`` ("astra-sim" or
    "nccl"), ``hw_profile`` (the nccl model's hardware profile: a shipped name or a .yml file), ``nccl_algorithm``
    (forced where it can run, as NCCL_ALGO), ...). Returns the SimulationResult the CLI prints and writes.
    """
    net = network if isinstance(network, NetworkConfig) else load_network(network, warn)
    if system is None:
        sys_cfg = default_system(net.num_dims)
    else:
        sys_cfg = system if isinstance(system, SystemConfig) else load_system(system, warn)
    mem = memory if isinstance(memory, MemoryConfig) else (load_memory(memory, warn) if memory else MemoryConfig())
    groups = comm_groups if isinstance(comm_groups, dict) else (
        load_comm_groups(comm_groups, net.num_npus) if comm_groups else {})
    options.setdefault("progress", False)
    traces = workload_traces(os.fspath(workload), net.num_npus)
    return Simulation(traces, net, sys_cfg, mem, groups, RunOptions(**options), warn).run()
