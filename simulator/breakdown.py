"""Where the time went: per-rank time partitions, per-collective-type bandwidths, per-link usage."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import reduce
from itertools import chain
from operator import add
from typing import Any

from simulator.recording import CollectiveRecord


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of [start, end) intervals."""
    total = 0
    start_so_far = end_so_far = -1
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


# nccl-tests' bus-bandwidth factors: busbw = algbw * factor(n)
BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def algorithm_bytes(record: CollectiveRecord) -> int:
    """The data size nccl-tests divides by the time: the whole buffer (all-gather: the gathered output)."""
    return record.size_bytes * record.participants if record.kind == "all_gather" else record.size_bytes


@dataclass(frozen=True, slots=True)
class CollectiveSummary:
    """One collective type over all ranks: per-rank means, and bandwidths in GB/s (1e9 bytes/s)."""

    kind: str
    count_per_rank: float
    bytes_per_rank: int  # as written in the traces (comm_size), mean over ranks rounded to a byte
    time_ns_per_rank: int  # summed durations, mean over ranks rounded to a ns
    algbw_GBps: float  # algorithm bandwidth: data size / time (nccl-tests)
    busbw_GBps: float  # bus bandwidth: algbw x the collective's factor (nccl-tests)
    # --collective-model nccl: what the library chose, most frequent first: {algorithm, protocol, channels,
    # count_per_rank}; empty under the astra-sim model (and then left out of the results JSON)
    choices: tuple[dict[str, Any], ...] = ()


class _LogTotals:
    """One rank's collective records summed per type: counts and sizes, and each record's bandwidth terms in order."""

    __slots__ = ("alg", "bus", "chosen", "count", "size", "time")

    def __init__(self, log: list[CollectiveRecord]) -> None:
        self.count: dict[str, int] = defaultdict(int)
        self.size: dict[str, int] = defaultdict(int)
        self.time: dict[str, int] = defaultdict(int)
        self.alg: dict[str, list[int]] = defaultdict(list)
        self.bus: dict[str, list[float]] = defaultdict(list)
        self.chosen: dict[str, dict[tuple[str, str, int], int]] = defaultdict(lambda: defaultdict(int))
        for r in log:
            if r.algorithm:
                self.chosen[r.kind][(r.algorithm, r.protocol, r.channels)] += 1
            self.count[r.kind] += 1
            self.size[r.kind] += r.size_bytes
            self.time[r.kind] += r.end_ns - r.start_ns
            data = algorithm_bytes(r)
            self.alg[r.kind].append(data)
            self.bus[r.kind].append(data * BUS_FACTORS[r.kind](r.participants) if r.participants > 1 else 0.0)


def summarize_collectives(logs: list[list[CollectiveRecord]]) -> list[CollectiveSummary]:
    """Per collective type, the per-rank means over ``logs`` (one per rank, in rank order; ranks of a folded run
    share their representative's list, read once). Bandwidths add every record's term in rank and record order,
    as one loop over all records does, so a folded run's figures equal an unfolded one's to the last bit."""
    count: dict[str, int] = defaultdict(int)
    size: dict[str, int] = defaultdict(int)
    time: dict[str, int] = defaultdict(int)
    chosen: dict[str, dict[tuple[str, str, int], int]] = defaultdict(lambda: defaultdict(int))
    read: dict[int, _LogTotals] = {}
    ordered: list[_LogTotals] = []  # each rank's totals, in rank order
    for log in logs:
        totals = read.get(id(log))
        if totals is None:
            totals = read[id(log)] = _LogTotals(log)
        ordered.append(totals)
        for kind, n in totals.count.items():
            count[kind] += n
            size[kind] += totals.size[kind]
            time[kind] += totals.time[kind]
        for kind, choices in totals.chosen.items():
            for choice, n in choices.items():
                chosen[kind][choice] += n
    ranks = max(len(logs), 1)
    out = []
    for kind in sorted(count):
        # every record's term in rank and record order, added one by one as += would (never gathered in a list)
        alg_sum = reduce(add, chain.from_iterable(t.alg.get(kind, ()) for t in ordered), 0.0)
        bus_sum = reduce(add, chain.from_iterable(t.bus.get(kind, ()) for t in ordered), 0.0)
        out.append(CollectiveSummary(kind, count[kind] / ranks, round(size[kind] / ranks), round(time[kind] / ranks),
                                     alg_sum / time[kind] if time[kind] else 0.0,
                                     bus_sum / time[kind] if time[kind] else 0.0,
                                     _choices(chosen[kind], ranks) if kind in chosen else ()))
    return out


def _choices(counts: dict[tuple[str, str, int], int], ranks: int) -> tuple[dict[str, Any], ...]:
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return tuple({"algorithm": a, "protocol": p, "channels": c, "count_per_rank": n / ranks}
                 for (a, p, c), n in ordered)


def link_table(links: dict[Any, Any], finish_ns: int, symmetric: bool) -> list[dict[str, Any]]:
    """Per-link usage, busiest first. In a representative-rank run each entry is a class of equal links."""
    rows = []
    for key, link in links.items():
        name = f"class {key}" if symmetric else link.name
        row = {"link": name, "bytes": link.bytes, "messages": link.messages, "busy_ns": link.busy_ns,
               "utilization": link.busy_ns / finish_ns if finish_ns else 0.0, "max_queue": link.max_queue}
        if hasattr(link, "pause_ns"):  # packet links: packets sent, queue in bytes, time stalled by flow control
            row.update(packets=link.packets, max_queue_bytes=link.max_queue_bytes, pause_ns=link.pause_ns)
        rows.append(row)
    rows.sort(key=lambda r: (-r["busy_ns"], r["link"]))
    return rows


def busy_fractions(intervals: list[tuple[int, int]], finish_ns: int, bins: int) -> list[float]:
    """The fraction of each of ``bins`` equal time slices of [0, finish] covered by the intervals."""
    if finish_ns <= 0:
        return [0.0] * bins
    width = finish_ns / bins
    covered = [0.0] * bins
    for start, end in _merged(intervals):
        b = int(start / width)
        while b < bins and b * width < end:
            lo, hi = max(start, b * width), min(end, (b + 1) * width)
            covered[b] += max(0.0, hi - lo)
            b += 1
    return [round(c / width, 4) for c in covered]


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def activity(workloads: list[Any], finish_ns: int, bins: int = 200, per_rank_limit: int = 64) -> dict[str, Any]:
    """Busy fractions over time per category: the mean over ranks, and each rank's for up to 64 ranks.

    ``workloads`` holds one entry per rank in rank order; in a folded run an entry is the rank's representative
    (the same object for every rank of its class, computed once)."""
    categories = ("compute", "comm", "memory")
    per_rank = []
    done: dict[int, dict[str, Any]] = {}
    for rank, w in enumerate(workloads):
        fractions = done.get(id(w))
        if fractions is None:
            iv = w.intervals
            fractions = done[id(w)] = {"compute": busy_fractions(iv.gpu + iv.cpu, finish_ns, bins),
                                       "comm": busy_fractions(iv.comm, finish_ns, bins),
                                       "memory": busy_fractions(iv.memory, finish_ns, bins)}
        per_rank.append({"rank": rank, **fractions})
    # each bin's sum over ranks in rank order (zip: the bins of every rank side by side, without a loop per value)
    mean = {c: [round(sum(column) / max(len(per_rank), 1), 4) for column in zip(*(r[c] for r in per_rank), strict=True)]
            if per_rank else [0.0] * bins for c in categories}
    return {"bins": bins, "bin_ns": finish_ns / bins, "mean": mean,
            "ranks": per_rank if len(per_rank) <= per_rank_limit else []}
