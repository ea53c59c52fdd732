"""Simulation results: per-rank times in ns, aggregates, and the text / ASTRA-sim / JSON renderings."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.rank import RankWorkload


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of [start, end) intervals."""
    total = 0
    end_so_far = -1
    start_so_far = 0
    for start, end in sorted(intervals):
        if start <= end_so_far:
            end_so_far = max(end_so_far, end)
        else:
            if end_so_far >= 0:
                total += end_so_far - start_so_far
            start_so_far, end_so_far = start, end
    if end_so_far >= 0:
        total += end_so_far - start_so_far
    return total


def intersection_ns(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of (union of a) intersected with (union of b)."""
    return union_ns(a) + union_ns(b) - union_ns(a + b)


@dataclass(frozen=True, slots=True)
class RankStats:
    """One rank's times in ns.

    ``exposed_comm_ns`` is ASTRA-sim's: finish - GPU compute time (idle time counts as exposed), as the
    unsigned 64-bit number it prints: when GPU work overlaps itself (replay-only mode replays communication
    nodes as GPU work) the difference is negative and wraps around, exactly as in ASTRA-sim's output.
    ``compute_ns`` is the summed GPU compute time ASTRA-sim charges; ``gpu_time_ns``, ``comm_ns``,
    ``cpu_ns``, ``memory_ns`` are unions of busy intervals; ``overlap_ns`` is the time compute and
    communication were both busy; ``idle_ns`` the time nothing was.
    """

    rank: int
    finish_ns: int
    exposed_comm_ns: int
    compute_ns: int
    gpu_time_ns: int
    comm_ns: int
    overlap_ns: int
    cpu_ns: int
    memory_ns: int
    idle_ns: int
    collective_time_ns: int  # sum of collective execution times (ASTRA-sim's tics_gpu_comms)

    @property
    def exposed_signed_ns(self) -> int:
        """finish - GPU compute time, without ASTRA-sim's unsigned wrap-around."""
        return self.finish_ns - self.compute_ns


def rank_stats(w: RankWorkload) -> RankStats:
    iv = w.intervals
    finish = w.finish_ns if w.finish_ns is not None else 0
    busy = iv.gpu + iv.cpu + iv.comm + iv.memory
    return RankStats(
        rank=w.rank, finish_ns=finish, exposed_comm_ns=(finish - w.gpu_compute_ns) % (1 << 64),
        compute_ns=w.gpu_compute_ns,
        gpu_time_ns=union_ns(iv.gpu), comm_ns=union_ns(iv.comm), overlap_ns=intersection_ns(iv.gpu, iv.comm),
        cpu_ns=union_ns(iv.cpu), memory_ns=union_ns(iv.memory), idle_ns=finish - union_ns(busy),
        collective_time_ns=w.comm_busy_ns)


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

    def to_json(self) -> dict[str, Any]:
        return {"finish_ns": self.finish_ns, "ranks": [asdict(r) for r in self.ranks], "backend": self.backend,
                "config": self.config, "version": self.version,
                "run": {"wall_time_s": round(self.wall_time_s, 3), "engine": self.engine, "events": self.events,
                        "messages": self.messages, "notes": self.notes}}

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")


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


_SUMMARY_FIELDS = (("compute", "compute_ns"), ("exposed comm", "exposed_signed_ns"), ("comm busy", "comm_ns"),
                   ("overlap", "overlap_ns"), ("idle", "idle_ns"))


def format_text(result: SimulationResult, max_rows: int = 16) -> str:
    """A short human summary; per-rank rows when there are few ranks, min/mean/max otherwise."""
    ranks = result.ranks
    lines = [f"end-to-end time: {format_ns(result.finish_ns)} ({result.finish_ns} ns) over {len(ranks)} ranks, "
             f"{result.backend} network"]
    if len(ranks) <= max_rows:
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
    return "\n".join(lines)
