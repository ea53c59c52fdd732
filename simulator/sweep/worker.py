"""Run one sweep point (in a worker process or a Ray task) and reduce its result to a row of metrics."""

from __future__ import annotations

import json
import multiprocessing.util
import os
import socket
import time
import traceback
from typing import Any

from compute.devices import device as device_preset
from network.config import network_from_dict
from simulator.config import MemoryConfig, memory_from_dict, system_from_dict
from simulator.results import SimulationResult
from simulator.simulation import RunOptions, Simulation, WallTimeExceeded
from simulator.sweep import scratch
from workload.errors import InputError
from workload.files import contained_path
from workload.generated import generated_traces, llm_peak_memory, workload_traces
from workload.groups import comm_groups_from_dict
from workload.tools import generate
from workload.traceset import TraceSet, resolve_workload
from workload.writer import write_trace

# The metric columns of a point, in order, with their SQLite types. All are deterministic.
METRICS: dict[str, str] = {
    "npus": "INTEGER",
    "finish_ns": "INTEGER",  # end to end: the last rank's finish
    "finish_ns_mean": "REAL",
    "finish_ns_min": "INTEGER",
    "compute_ns_mean": "REAL",  # GPU compute time per rank (ASTRA-sim's)
    "exposed_comm_ns_mean": "REAL",  # finish - GPU compute (ASTRA-sim's exposed communication, signed)
    "exposed_comm_ns_max": "INTEGER",
    "comm_only_ns_mean": "REAL",  # communication not hidden under compute (the time partition)
    "overlap_ns_mean": "REAL",
    "idle_ns_mean": "REAL",
    "comm_ns_mean": "REAL",  # communication busy time
    "collective_time_ns_mean": "REAL",  # summed collective durations
    "collectives_per_rank": "REAL",
    "algbw_GBps": "REAL",  # nccl-tests algorithm bandwidth over all collectives, GB/s with GB = 10^9 B
    "busbw_GBps": "REAL",  # nccl-tests bus bandwidth over all collectives, GB/s with GB = 10^9 B
    "engine": "TEXT",
    "events": "INTEGER",
    "messages": "INTEGER",
    "collectives": "TEXT",  # JSON: per collective type, as in the results JSON
    # a generated LLM iteration's device memory per rank at its peak (workload/llm/memory.py's estimate); else NULL
    "device_memory_bytes": "INTEGER",
}

_scratch_parent: str | None = None  # in a pool worker: the driver's scratch folder (the driver removes it)
_generated_dir: str | None = None
_generated: dict[str, TraceSet] = {}
_memory_limit_bytes: int | None = None  # this process's address-space limit, for the out-of-memory message


def run_point(run: dict[str, Any] | None, root: str, sources: dict[str, str], error: str | None = None
              ) -> dict[str, Any]:
    """Simulate one resolved run. Never raises: bad input and bugs become a failed outcome with the message."""
    started = time.perf_counter()
    notes: list[str] = []
    outcome: dict[str, Any] = {"status": "failed", "error": error, "metrics": {}, "compute": None}
    if run is not None:
        try:
            result = _simulate(run, root, sources, notes.append)
            found = metrics(result) | _memory(run, root, sources, notes.append)
            outcome = {"status": "ok", "error": None, "metrics": found, "compute": result.config.get("compute")}
        except InputError as e:
            outcome["error"] = str(e)
        except WallTimeExceeded as e:
            outcome["error"] = str(e)
        except MemoryError:
            outcome["error"] = "out of memory" + (f" ({_limit_note()})" if _memory_limit_bytes else "")
        except Exception as e:  # a bug in astrasim-py: keep the sweep going, and keep the evidence
            frame = traceback.extract_tb(e.__traceback__)[-1]
            outcome["error"] = (f"internal error: {type(e).__name__}: {e} (at {os.path.basename(frame.filename)}:"
                                f"{frame.lineno}); " + (
                                    # C extensions (protobuf) fail in their own ways when an allocation is refused
                                    f"{_limit_note()}, most likely the cause" if _memory_limit_bytes
                                    else "please report it"))
    outcome["warnings"] = "\n".join(dict.fromkeys(notes)) or None
    outcome["wall_time_s"] = time.perf_counter() - started
    outcome["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    return outcome


def _limit_note() -> str:
    return f"a worker may use {(_memory_limit_bytes or 0) / 2**30:.3g} GiB of memory (--worker-memory)"


def _simulate(run: dict[str, Any], root: str, sources: dict[str, str], warn: Any) -> SimulationResult:
    def label(section: str) -> str:
        return sources.get(section, f"<sweep {section}>")

    network = network_from_dict(run["network"], label("network"), warn)
    system = system_from_dict(run["system"], label("system"), warn)
    memory = memory_from_dict(run["memory"], label("memory"), warn) if run["memory"] else MemoryConfig()
    groups = comm_groups_from_dict(run["comm_groups"], network.num_npus, label("comm_groups")) \
        if run["comm_groups"] else {}
    workload = run["workload"]
    if isinstance(workload, dict) and workload.get("generate") == "llm":
        traces = generated_traces(workload, network.num_npus, label("workload"))
    elif isinstance(workload, dict):
        traces = generated_workload(workload, network.num_npus)
        # a generated workload is one file every rank runs, by construction: not worth a warning
        warn = _without(warn, "one trace file for all")
    else:
        traces = workload_traces(os.path.normpath(os.path.join(root, workload)), network.num_npus)
    profile = run["options"].get("hw_profile")
    if isinstance(profile, str) and profile.endswith((".yml", ".yaml")):  # a profile file, beside the sweep file
        run = {**run, "options": {**run["options"], "hw_profile": os.path.normpath(os.path.join(root, profile))}}
    options = RunOptions(**run["options"], progress=False)
    return Simulation(traces, network, system, memory, groups, options, warn).run()


def _memory(run: dict[str, Any], root: str, sources: dict[str, str], warn: Any) -> dict[str, int]:
    """The device memory a generated LLM iteration needs per rank (none for other workloads), with a warning when
    it is more than the run's --device has."""
    workload = run["workload"]
    if not (isinstance(workload, dict) and workload.get("generate") == "llm"):
        return {}
    need = llm_peak_memory(workload, sources.get("workload", "<sweep workload>")).total_bytes
    name = run["options"].get("device")
    if isinstance(name, str):  # a device file beside the sweep file, or a shipped device's name
        short = device_preset(os.path.join(root, name) if name.endswith((".yml", ".yaml")) else name
                              ).memory_shortfall(need)
        if short:
            warn(f"the generated workload {short}")
    return {"device_memory_bytes": need}


def _without(warn: Any, prefix: str) -> Any:
    return lambda message: None if message.startswith(prefix) else warn(message)


def use_scratch(parent: str | None, memory_limit_bytes: int | None = None) -> None:
    """In a pool worker: write generated traces inside the driver's scratch folder ``parent``."""
    global _scratch_parent, _memory_limit_bytes
    _scratch_parent, _memory_limit_bytes = parent, memory_limit_bytes


def discard_generated() -> None:
    """Remove this process's generated traces now (a Ray task's, when it ends)."""
    global _generated_dir
    scratch.remove(_generated_dir)
    _generated_dir = None
    _generated.clear()


def generated_workload(spec: dict[str, Any], npus: int) -> TraceSet:
    """The traces of a generator mapping for ``npus`` ranks, written once per process to a private folder."""
    global _generated_dir
    cache_key = json.dumps([spec, npus], sort_keys=True, default=str)
    if cache_key in _generated:
        return _generated[cache_key]
    traces = generate.from_spec(spec, npus)
    if _generated_dir is None:
        _generated_dir = scratch.make_folder(_scratch_parent)
        # at exit of this process, whichever it is (the driver also removes its workers' parent folder)
        multiprocessing.util.Finalize(None, scratch.remove, args=(_generated_dir,), exitpriority=10)
    prefix = contained_path(_generated_dir, f"{len(_generated)}-{generate.spec_label(spec)}-{npus}",
                            "generated workload name")
    if all(t == traces[0] for t in traces[1:]):
        path = prefix + ".et"
        write_trace(path, traces[0], version=generate.GENERATED_VERSION)
        _generated[cache_key] = TraceSet(path, (path,), shared=True)
    else:
        generate.write_rank_traces(prefix + "/trace", traces)
        _generated[cache_key] = resolve_workload(prefix + "/trace")
    return _generated[cache_key]


def metrics(result: SimulationResult) -> dict[str, Any]:
    """The row of a finished point (see METRICS)."""
    ranks = result.ranks
    n = len(ranks)
    exposed = [r.exposed_signed_ns for r in ranks]
    kinds = result.collectives
    time_ns = sum(c.time_ns_per_rank for c in kinds)
    if len(kinds) == 1:
        algbw, busbw = kinds[0].algbw_GBps, kinds[0].busbw_GBps
    else:  # over all collective types: their bandwidths weighted by their time
        algbw = sum(c.algbw_GBps * c.time_ns_per_rank for c in kinds) / time_ns if time_ns else None
        busbw = sum(c.busbw_GBps * c.time_ns_per_rank for c in kinds) / time_ns if time_ns else None
    return {
        "npus": n,
        "finish_ns": result.finish_ns,
        "finish_ns_mean": sum(r.finish_ns for r in ranks) / n,
        "finish_ns_min": min(r.finish_ns for r in ranks),
        "compute_ns_mean": sum(r.compute_ns for r in ranks) / n,
        "exposed_comm_ns_mean": sum(exposed) / n,
        "exposed_comm_ns_max": max(exposed),
        "comm_only_ns_mean": sum(r.comm_only_ns for r in ranks) / n,
        "overlap_ns_mean": sum(r.overlap_ns for r in ranks) / n,
        "idle_ns_mean": sum(r.idle_ns for r in ranks) / n,
        "comm_ns_mean": sum(r.comm_ns for r in ranks) / n,
        "collective_time_ns_mean": sum(r.collective_time_ns for r in ranks) / n,
        "collectives_per_rank": sum(c.count_per_rank for c in kinds),
        "algbw_GBps": algbw if time_ns else None,
        "busbw_GBps": busbw if time_ns else None,
        "engine": result.engine,
        "events": result.events,
        "messages": result.messages,
        "collectives": json.dumps(result.to_json()["collectives"], sort_keys=True),
    }
