"""One simulated training iteration of a generated LLM workload, with the NCCL-like collective model and the best
compute model available, optionally in a child process with a time and memory limit.

The limits exist because the cost of a run is hard to know before it starts: a layout that folds to a few
classes of equivalent ranks takes seconds, the same layout simulated rank by rank can take hours and tens of GB.
A run over its limit is reported as such ("beyond what one run simulates in N s / M GB here") rather than
replaced by anything smaller.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from network.config import NetworkConfig
from simulator.config import MemoryConfig, default_system
from simulator.simulation import RunOptions, Simulation, WallTimeExceeded
from simulator.tools.step_breakdown import NodeKinds, slowest_rank_breakdown
from workload.errors import InputError
from workload.generated import generated_traces, llm_model_plan


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


def simulate_iteration(spec: dict[str, Any], network: NetworkConfig, profile: str, device: str,
                       warn: Callable[[str], None] | None = None, label: str = "training step",
                       max_wall_time_s: float | None = None) -> Iteration:
    """Simulate the ``generate: llm`` mapping ``spec`` once on ``network`` with hardware profile ``profile``
    (``max_wall_time_s``: stop with WallTimeExceeded after that long)."""
    from workload.llm.build import build_programs
    from workload.llm.summary import stage_flops

    started = time.process_time()
    model, plan = llm_model_plan(spec, label)
    programs = build_programs(model, plan)
    traces = generated_traces(spec, network.num_npus, label)
    compute_model = best_compute_model()
    extra = {"compute_model": compute_model} if compute_model != "roofline" else {}
    options = RunOptions(collective_model="nccl", hw_profile=profile, device=device, progress=False, timeline=True,
                         max_wall_time_s=max_wall_time_s, **extra)
    sim = Simulation(traces, network, default_system(network.num_dims), MemoryConfig(), options=options,
                     warn=warn)
    result = sim.run()
    per_stage = plan.world_size // plan.pp
    flops = sum(sum(stage_flops(p).values()) for p in programs) * per_stage
    collectives = [{"kind": c.kind, "count_per_rank": c.count_per_rank, "time_ns_per_rank": c.time_ns_per_rank,
                    "busbw_GBps": round(c.busbw_gbps, 3), "choices": list(c.choices)} for c in result.collectives]
    return Iteration(result.finish_ns, result.engine, result.simulated_ranks, result.engine_reason, compute_model,
                     time.process_time() - started,
                     slowest_rank_breakdown(sim, result, NodeKinds.of_programs(programs)), flops, collectives)


def _child(conn: Any, memory_bytes: int, time_s: float, args: tuple[Any, ...]) -> None:
    """Runs in the child: limit its address space, simulate, send back an Iteration or the reason it stopped."""
    try:
        if memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        spec, network, profile, device, label = args
        conn.send(simulate_iteration(spec, network, profile, device, label=label, max_wall_time_s=time_s or None))
    except MemoryError:
        conn.send(f"over the memory limit of {memory_bytes / 2**30:.1f} GiB")
    except WallTimeExceeded:
        conn.send(f"over the time limit of {time_s:g} s")
    except InputError as e:
        conn.send(f"error: {e}")
    except Exception as e:  # a bug: say so in the row instead of losing the other rows
        conn.send(f"failed: {type(e).__name__}: {e}")
    finally:
        conn.close()


def run_limited(spec: dict[str, Any], network: NetworkConfig, profile: str, device: str, label: str,
                time_s: float, memory_bytes: int) -> Iteration | str:
    """``simulate_iteration`` in a child process limited to ``time_s`` seconds of wall time and ``memory_bytes``
    of address space (0: no limit); a text saying why when it did not finish."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(child, memory_bytes, time_s, (spec, network, profile, device, label)))
    process.start()
    child.close()
    grace = time_s * 1.5 + 30 if time_s else None
    try:
        if parent.poll(grace):
            return parent.recv()  # type: ignore[no-any-return]
        return f"over the time limit of {time_s:g} s (stopped)"
    except EOFError:
        process.join()
        return f"the simulation process ended without a result (exit code {process.exitcode}; out of memory?)"
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        parent.close()
