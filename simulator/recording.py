"""What a rank did, recorded for breakdowns and timelines."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    """One collective (or broadcast) node as it ran on one rank."""

    node: int  # node index in the rank's trace
    kind: str  # all_reduce, all_gather, reduce_scatter, all_to_all, broadcast
    size_bytes: int  # comm_size as written in the trace
    participants: int  # ranks taking part (its communicator group, or all NPUs)
    group: int  # communicator group id, 0 for all NPUs
    start_ns: int
    end_ns: int
    # --collective-model nccl: the library's choice ("" / 0 under the astra-sim model)
    algorithm: str = ""
    protocol: str = ""
    channels: int = 0


@dataclass(slots=True)
class Intervals:
    """Busy intervals of one rank by category (ASTRA-sim's operator statistics)."""

    gpu: list[tuple[int, int]] = field(default_factory=list)
    cpu: list[tuple[int, int]] = field(default_factory=list)
    comm: list[tuple[int, int]] = field(default_factory=list)
    memory: list[tuple[int, int]] = field(default_factory=list)
    other: list[tuple[int, int]] = field(default_factory=list)


@dataclass(slots=True)
class TimelineLog:
    """The per-node detail a timeline needs (kept only when a timeline is asked for)."""

    spans: list[tuple[int, int, int]] = field(default_factory=list)  # (node, start, end)
    sends: list[tuple[int, int, int, int]] = field(default_factory=list)  # (node, dst, tag, size) in issue order
    recvs: list[tuple[int, int, int, int]] = field(default_factory=list)  # (node, src, tag, size) in issue order
