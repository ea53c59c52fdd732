"""One simulated training iteration of a generated LLM workload, with the NCCL-like collective model and the best
compute model available, optionally in a child process with a time and memory limit.

The limits exist because the cost of a run is hard to know before it starts: a layout that folds to a few
classes of equivalent ranks takes seconds, the same layout simulated rank by rank can take hours and tens of GB.
A run over its limit is reported as such ("over the CPU-time limit of N s", "over the memory limit of M GiB")
rather than replaced by anything smaller. The time limit is CPU time, so that it means the same on a busy machine.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from network.config import NetworkConfig
from simulator.config import MemoryConfig, default_system
from simulator.node_table import COMMUNICATOR_STREAMS
from simulator.simulation import RunOptions, Simulation
from simulator.sweep.executors import die_with_parent
from simulator.tools.step_breakdown import NodeKinds, slowest_rank_breakdown
from workload.errors import InputError
from workload.generated import llm_plan, llm_programs, llm_workload


def best_compute_model() -> str:
    """"kernels" where the simulator has the kernel compute model, else "roofline"."""
    return "kernels" if "compute_model" in RunOptions.__dataclass_fields__ else "roofline"


@dataclass(slots=True)
class Iteration:
    """A simulated iteration: the step (slowest rank's finish), how it was run, and where the time went."""

    step_time_ns: int
    engine: str
    simulated_ranks: int
    engine_reason: str
    compute_model: str
    cpu_time_s: float
    breakdown: dict[str, Any]
    flops_total: int = 0  # every FLOP of the generated trace (recompute included), all ranks
    collectives: list[dict[str, Any]] = field(default_factory=list)
    trace_nodes: int = 0  # nodes of the iteration over all ranks (what simulating every rank has to hold)
    peak_rss_MB: int = 0  # the peak resident memory of the process that simulated it
    warnings: list[str] = field(default_factory=list)  # what the simulator warned about (without a ``warn``)


def peak_rss_MB() -> int:
    """This process's peak resident memory so far (MB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak / 2**20 if sys.platform == "darwin" else peak / 2**10)  # bytes on macOS, KiB elsewhere


def simulate_iteration(spec: dict[str, Any], network: NetworkConfig, profile: str, device: str,
                       warn: Callable[[str], None] | None = None, label: str = "training step",
                       progress: bool = False,
                       inspect: Callable[[Simulation, Any, list[Any]], None] | None = None) -> Iteration:
    """Simulate the ``generate: llm`` mapping ``spec`` once on ``network`` with hardware profile ``profile``;
    ``inspect(sim, result, programs)`` may look at the finished run (its per-node spans) before it is dropped."""
    from workload.llm.summary import stage_flops

    started = time.process_time()
    traces, plan, programs = llm_workload(spec, network.num_npus, label)
    compute_model = best_compute_model()
    extra = {"compute_model": compute_model} if compute_model != "roofline" else {}
    options = RunOptions(collective_model="nccl", hw_profile=profile, device=device, progress=progress,
                         comm_streams=COMMUNICATOR_STREAMS, sm_sharing=compute_model == "kernels",
                         timeline=True, **extra)
    warnings: list[str] = []  # kept with the result where no one is listing them as they come (a child process)
    sim = Simulation(traces, network, default_system(network.num_dims), MemoryConfig(), options=options,
                     warn=warn if warn is not None else warnings.append)
    result = sim.run()
    if inspect is not None:
        inspect(sim, result, programs)
    per_stage = plan.world_size // plan.pp
    flops = sum(sum(stage_flops(p).values()) for p in programs) * per_stage
    collectives = [{"kind": c.kind, "count_per_rank": c.count_per_rank, "time_ns_per_rank": c.time_ns_per_rank,
                    "busbw_GBps": round(c.busbw_GBps, 3), "choices": list(c.choices)} for c in result.collectives]
    nodes = sum(len(p.ops) for p in programs) * per_stage
    return Iteration(result.finish_ns, result.engine, result.simulated_ranks, result.engine_reason, compute_model,
                     time.process_time() - started,
                     slowest_rank_breakdown(sim, result, NodeKinds.of_programs(programs)), flops, collectives, nodes,
                     peak_rss_MB(), warnings)


def iteration_nodes(spec: dict[str, Any], label: str = "generate: llm") -> tuple[int, int]:
    """Trace nodes of one iteration (over all ranks: what a run that simulates every rank has to hold; of one
    rank per pipeline stage: what the folded run holds at least)."""
    _, plan, programs = llm_programs(spec, label)
    per_stage = sum(len(p.ops) for p in programs)
    return per_stage * (plan.world_size // plan.pp), per_stage


def check_layout(spec: dict[str, Any], label: str = "generate: llm") -> None:
    """Raise the generator's InputError if it refuses the ``generate: llm`` mapping (cheap: nothing is built)."""
    llm_plan(spec, label)


class CpuTimeExceeded(Exception):
    """The child's CPU-time limit ran out (SIGXCPU)."""


def _over_cpu_time(signum: int, frame: Any) -> None:
    raise CpuTimeExceeded


def _child(conn: Any, memory_bytes: int, cpu_s: float, args: tuple[Any, ...]) -> None:
    """Runs in the child: limit its address space and CPU time, simulate, send back an Iteration or the reason it
    stopped."""
    die_with_parent()  # a run nobody waits for any more (its driver killed) stops too
    try:
        if memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if cpu_s:
            signal.signal(signal.SIGXCPU, _over_cpu_time)
            used = resource.getrusage(resource.RUSAGE_SELF)
            soft = math.ceil(used.ru_utime + used.ru_stime + cpu_s)
            resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 10))
        spec, network, profile, device, label = args
        conn.send(simulate_iteration(spec, network, profile, device, label=label))
    except (MemoryError, SystemError) as e:  # an allocation refused inside C code surfaces as a SystemError
        if not memory_bytes and isinstance(e, SystemError):
            conn.send(f"failed: SystemError: {e}")
        else:
            conn.send(f"over the memory limit of {memory_bytes / 2**30:.3g} GiB")
    except CpuTimeExceeded:
        conn.send(f"over the CPU-time limit of {cpu_s:g} s")
    except InputError as e:
        conn.send(f"error: {e}")
    except Exception as e:  # a bug: say so in the row instead of losing the other rows
        conn.send(f"failed: {type(e).__name__}: {e}")
    finally:
        conn.close()


def default_memory_gib() -> float:
    """Three quarters of this machine's physical memory (GiB, one decimal), what one row's simulation may use by
    default; 4 where the platform does not say."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 4.0
    return max(1.0, round(0.75 * total / 2**30, 1))


class LimitedRun:
    """A simulation running in a child process under limits (``start_limited``); ``result`` waits for it."""

    __slots__ = ("connection", "process")

    def __init__(self, process: Any, connection: Any) -> None:
        self.process = process
        self.connection = connection  # readable when the child has answered or ended (multiprocessing's wait)

    def result(self) -> Iteration | str:
        """The Iteration, or a text saying why the run did not finish; the child is gone afterwards."""
        try:
            return self.connection.recv()  # type: ignore[no-any-return]
        except EOFError:
            self.process.join()
            return f"the simulation process ended without a result (exit code {self.process.exitcode}; out of memory?)"
        finally:
            if self.process.is_alive():
                self.process.kill()
            self.process.join()
            self.connection.close()


def start_limited(spec: dict[str, Any], network: NetworkConfig, profile: str, device: str, label: str,
                  cpu_s: float, memory_bytes: int) -> LimitedRun:
    """Start ``simulate_iteration`` in a child process limited to ``cpu_s`` seconds of CPU time (a limit that means
    the same on a busy machine) and ``memory_bytes`` of address space (0: no limit)."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(child, memory_bytes, cpu_s, (spec, network, profile, device, label)),
                          daemon=True)  # ends with this process
    process.start()
    child.close()
    return LimitedRun(process, parent)


def run_limited(spec: dict[str, Any], network: NetworkConfig, profile: str, device: str, label: str,
                cpu_s: float, memory_bytes: int) -> Iteration | str:
    """``start_limited`` and wait: the Iteration, or a text saying why it did not finish."""
    return start_limited(spec, network, profile, device, label, cpu_s, memory_bytes).result()
