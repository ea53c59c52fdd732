"""Simulation results: per-rank times in ns, aggregates, and the text / ASTRA-sim / JSON renderings."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from simulator.breakdown import CollectiveSummary, intersection_ns, union_ns
from simulator.units import UNITS, with_current_keys

if TYPE_CHECKING:
    from simulator.rank import RankWorkload


@dataclass(frozen=True, slots=True)
class RankStats:
    """One rank's times in ns.

    As ASTRA-sim reports them: ``finish_ns``; ``compute_ns``, the summed GPU compute time it charges; and
    ``exposed_comm_ns`` = finish - compute_ns (idle time counts as exposed), printed as an unsigned 64-bit
    number, so it wraps around when GPU work overlaps itself (replay-only mode replays communication nodes as
    GPU work).

    Where the time went, as a partition of [0, finish]: ``compute_busy_ns`` (some compute running, GPU or
    CPU) + ``comm_only_ns`` (communication and no compute) + ``memory_only_ns`` (remote memory only)
    + ``idle_ns`` = ``finish_ns``; ``overlap_ns`` is the communication hidden under compute. The busy times
    of each kind on their own: ``gpu_time_ns``, ``cpu_ns``, ``comm_ns``, ``memory_ns`` (unions of intervals).
    """

    rank: int
    finish_ns: int
    exposed_comm_ns: int
    compute_ns: int
    compute_busy_ns: int
    comm_only_ns: int
    overlap_ns: int
    memory_only_ns: int
    idle_ns: int
    gpu_time_ns: int
    cpu_ns: int
    comm_ns: int
    memory_ns: int
    collective_time_ns: int  # sum of collective execution times (ASTRA-sim's tics_gpu_comms)

    @property
    def exposed_signed_ns(self) -> int:
        """finish - GPU compute time, without ASTRA-sim's unsigned wrap-around."""
        return self.finish_ns - self.compute_ns


def rank_stats(w: RankWorkload) -> RankStats:
    iv = w.intervals
    finish = w.finish_ns if w.finish_ns is not None else 0
    compute = iv.gpu + iv.cpu
    compute_busy = union_ns(compute)
    with_comm = union_ns(compute + iv.comm)
    busy = union_ns(compute + iv.comm + iv.memory)
    return RankStats(
        rank=w.rank, finish_ns=finish, exposed_comm_ns=(finish - w.gpu_compute_ns) % (1 << 64),
        compute_ns=w.gpu_compute_ns, compute_busy_ns=compute_busy, comm_only_ns=with_comm - compute_busy,
        overlap_ns=intersection_ns(compute, iv.comm), memory_only_ns=busy - with_comm, idle_ns=finish - busy,
        gpu_time_ns=union_ns(iv.gpu), cpu_ns=union_ns(iv.cpu), comm_ns=union_ns(iv.comm),
        memory_ns=union_ns(iv.memory), collective_time_ns=w.comm_busy_ns)


@dataclass(slots=True)
class SimulationResult:
    finish_ns: int
    ranks: list[RankStats]
    backend: str
    config: dict[str, Any]
    version: str
    wall_time_s: float = 0.0
    engine: str = "message"
    events: int = 0
    messages: int = 0
    notes: list[str] = field(default_factory=list)
    collectives: list[CollectiveSummary] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)  # busiest first; empty for link-less backends
    activity: dict[str, Any] = field(default_factory=dict)  # busy fractions over time, for reports
    network: dict[str, Any] = field(default_factory=dict)  # backend statistics (packet: message latencies)
    complete: bool = True  # False: stopped part-way (--max-wall-time)
    simulated_ranks: int = 0  # ranks the engine ran (1: one representative for all)
    engine_reason: str = ""  # why that many and not fewer
    representative: list[int] = field(default_factory=list)  # folded runs: rank -> the rank simulated for it

    def to_json(self) -> dict[str, Any]:
        return {"finish_ns": self.finish_ns, "ranks": [asdict(r) for r in self.ranks], "backend": self.backend,
                "collectives": [_collective_json(c) for c in self.collectives], "links": self.links,
                "activity": self.activity, "network": self.network, "complete": self.complete,
                "config": self.config, "version": self.version, "units": UNITS,
                "run": {"wall_time_s": round(self.wall_time_s, 3), "engine": self.engine, "events": self.events,
                        "messages": self.messages, "notes": self.notes, "simulated_ranks": self.simulated_ranks,
                        "engine_reason": self.engine_reason}}

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")


def units_note(nccl: bool) -> str:
    """The line under a table of algbw/busbw saying what a GB is, there and in the inputs."""
    inputs = "as the hardware profile's" if nccl else "the network file's GB = 2^30 B, as ASTRA-sim's"
    return f"algbw, busbw: GB/s with GB = 10^9 B, as nccl-tests; {inputs}"


def _collective_json(summary: CollectiveSummary) -> dict[str, Any]:
    """A collective type's summary; the library's choices only where a model made them (--collective-model nccl)."""
    data = with_current_keys(asdict(summary))  # algbw_GBps, busbw_GBps
    if not summary.choices:
        del data["choices"]
    else:
        data["choices"] = list(data["choices"])
    return data


def above_links(what: str, busbw_GBps: float, backend: str, bandwidths_GiBps: list[float]) -> str:
    """The note saying why the congestion-unaware model reports a busbw above every link's bandwidth ("" when it
    does not): ``bandwidths_GiBps`` are the network file's, GB = 2^30 B, compared in busbw's 10^9 B."""
    if backend != "analytical-unaware" or not bandwidths_GiBps:
        return ""
    fastest = max(bandwidths_GiBps) * 2**30 / 1e9
    if busbw_GBps <= fastest * 1.0001:
        return ""
    return (f"note: {what} busbw {busbw_GBps:.1f} GB/s exceeds the fastest link's {fastest:.1f} GB/s: the "
            "congestion-unaware model lets concurrent messages each use a link's whole bandwidth (ASTRA-sim's "
            "model); --backend analytical-aware shares links")


def _above_links(result: SimulationResult) -> str:
    top = max(result.collectives, key=lambda c: c.busbw_GBps)
    note = above_links(top.kind, top.busbw_GBps, result.backend,
                       result.config.get("network", {}).get("bandwidth_GiBps") or [])
    return f"{'':>15}  {note}" if note else ""


def format_ns(ns: float) -> str:
    """A duration in the unit people read: s, ms, µs or ns."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns:.0f} ns"


def format_astra_sim(result: SimulationResult) -> str:
    """ASTRA-sim 2.x's per-rank lines."""
    lines = []
    for r in result.ranks:
        lines.append(f"sys[{r.rank}] finished, {r.finish_ns} cycles, exposed communication {r.exposed_comm_ns} cycles.")
        overlap = max(0, r.gpu_time_ns + r.comm_ns - r.finish_ns) if r.gpu_time_ns and r.comm_ns else 0
        lines.append(f"sys[{r.rank}], Wall time: {r.finish_ns} | GPU time: {r.gpu_time_ns} | "
                     f"Comm time: {r.comm_ns} | Total compute-communication overlap: {overlap}")
    return "\n".join(lines)


_SUMMARY_FIELDS = (("compute", "compute_busy_ns"), ("comm only", "comm_only_ns"),
                   ("overlapped", "overlap_ns"), ("memory", "memory_only_ns"), ("idle", "idle_ns"))


def format_text(result: SimulationResult, max_rows: int = 16) -> str:
    """A short human summary; per-rank rows when there are few ranks, min/mean/max otherwise."""
    ranks = result.ranks
    if not result.complete:
        unfinished = sum(r.finish_ns == 0 for r in ranks)
        lines = [f"stopped part-way: {format_ns(result.finish_ns)} ({result.finish_ns} ns) simulated, "
                 f"{unfinished} of {len(ranks)} ranks unfinished, {result.backend} network"]
    else:
        network = "NCCL-like collective model" if result.backend == "nccl" else f"{result.backend} network"
        lines = [f"end-to-end time: {format_ns(result.finish_ns)} ({result.finish_ns} ns) over {len(ranks)} ranks, "
                 f"{network}"]
    compute = result.config.get("compute")
    if compute:
        if compute["model"] == "roofline":
            name = f"{compute['device']}, " if compute["device"] else ""
            lines.append(f"compute: roofline model ({name}{compute['peak_tflops']:g} TFLOP/s, "
                         f"{compute['memory_bw_GBps']:g} GB/s memory, GB = 10^9 B)")
        elif compute["model"] == "kernels":
            lines.append(f"compute: kernel model ({compute['device']}, {compute['peak_tflops']:g} TFLOP/s BF16, "
                         f"{compute['memory_bw_GBps']:g} GB/s memory, GB = 10^9 B; efficiencies "
                         f"{compute.get('calibration')})")
        else:
            lines.append("compute: durations recorded in the trace")
    hardware = result.config.get("hardware")
    if hardware:  # --collective-model nccl
        lines.append(f"communication: NCCL/RCCL-like model on hardware profile {hardware['name']} ({hardware['gpu']}, "
                     f"{hardware['gpus_per_node']} GPUs per node, {hardware['library']} {hardware['library_version']})"
                     "; the network file only sets the number of NPUs")
    if result.engine_reason:
        lines.append(f"engine: {result.simulated_ranks:,} of {len(ranks):,} rank(s) simulated ({result.engine_reason})")
    if not result.complete:
        pass
    elif len(ranks) <= max_rows:
        header = f"{'rank':>5}  {'finish':>12}" + "".join(f"  {label:>12}" for label, _ in _SUMMARY_FIELDS)
        lines.append(header)
        for r in ranks:
            lines.append(f"{r.rank:>5}  {format_ns(r.finish_ns):>12}" +
                         "".join(f"  {format_ns(getattr(r, f)):>12}" for _, f in _SUMMARY_FIELDS))
    else:
        lines.append(f"{'':>12}  {'min':>12}  {'mean':>12}  {'max':>12}")
        for label, f in (("finish", "finish_ns"), *_SUMMARY_FIELDS):
            values = [getattr(r, f) for r in ranks]
            lines.append(f"{label:>12}  {format_ns(min(values)):>12}  {format_ns(sum(values) / len(values)):>12}  "
                         f"{format_ns(max(values)):>12}")
        slow = max(ranks, key=lambda r: r.finish_ns)
        lines.append(f"slowest rank: {slow.rank}")
    if result.collectives:
        lines.append("")
        lines.append(f"{'collective':>15}  {'per rank':>8}  {'bytes/rank':>11}  {'time/rank':>11}  {'algbw':>11}  "
                     f"{'busbw':>11}")
        for c in result.collectives:
            lines.append(f"{c.kind:>15}  {c.count_per_rank:>8.4g}  {format_bytes(c.bytes_per_rank):>11}  "
                         f"{format_ns(c.time_ns_per_rank):>11}  {c.algbw_GBps:>7.2f} GB/s  {c.busbw_GBps:>7.2f} GB/s")
            if c.choices:  # --collective-model nccl: algorithm/protocol x channels (count per rank)
                lines.append(f"{'':>15}  chosen: " + ", ".join(
                    f"{ch['algorithm']}/{ch['protocol']} x{ch['channels']} ch ({ch['count_per_rank']:.4g})"
                    for ch in c.choices))
        lines.append(f"{'':>15}  ({units_note(result.backend == 'nccl')})")
        above = _above_links(result)
        if above:
            lines.append(above)
    if result.links:
        lines.append("")
        classes = " (each a class of equal links)" if result.engine == "symmetric" else ""
        lines.append(f"busiest links{classes}:")
        for row in result.links[:5]:
            extra = ""
            if "pause_ns" in row:
                extra = f" ({format_bytes(row['max_queue_bytes'])}), paused {format_ns(row['pause_ns'])}"
            lines.append(f"  {row['link']:<24} {100 * row['utilization']:5.1f}% busy  "
                         f"{format_bytes(row['bytes']):>11}  max queue {row['max_queue']}{extra}")
    net = result.network
    if net.get("messages"):
        lines.append(f"messages: {net['messages']}, latency mean {format_ns(net['latency_mean_ns'])}, p99 "
                     f"{format_ns(net['latency_p99_ns'])}, max {format_ns(net['latency_max_ns'])}; "
                     f"{net['packet_hops']:,} packet-hops")
    return "\n".join(lines)


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
