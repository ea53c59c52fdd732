"""One rank's workload execution (ASTRA-sim's ``Workload`` and ``HardwareResource``).

Issuing follows ASTRA-sim: whenever a node finishes, the rank walks the then-issuable nodes in ascending
id and issues each whose hardware slot is free. Nodes that finish at once while that walk runs (INVALID,
METADATA, a roofline node with no tensor) release their children only for the *next* walk, as in
ASTRA-sim; with ``corrected`` semantics a zero-time node releases its children immediately.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from compute.kernels import KernelModel
from compute.roofline import Roofline
from compute.trace_timing import REPLAY, is_gpu_compute, node_times
from simulator.collectives.algorithms import ALL_GATHER
from simulator.memory import RemoteMemory
from simulator.node_table import (
    COLLECTIVE_KINDS,
    NO_VALUE,
    NUM_LANES,
    RECV_LANE,
    SINGLE_STREAM,
    communicator_lanes,
    node_table,
)
from simulator.recording import CollectiveRecord, Intervals, TimelineLog
from simulator.sm_sharing import SmSharing
from simulator.system import POINT_TO_POINT, CommGroup, DataSet, RankSystem, wire_tag
from workload.errors import InputError, TraceError, shown
from workload.feeder import Feeder
from workload.graph import TraceGraph
from workload.groups import metadata_groups, missing_groups_hint
from workload.schema import COMM_LIBRARY, CollectiveType, NodeType
from workload.validate import Dependencies

if TYPE_CHECKING:
    from simulator.collectives.nccl import Candidate
    from simulator.nccl_run import NcclRun
    from simulator.results import RankStats

COMM_TYPES = (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)


class RankWorkload:
    """Issues one rank's trace onto its system layer and records what ran when."""

    def __init__(self, rank: int, path: str, graph: TraceGraph, deps: Dependencies, system: RankSystem,
                 *, memory: RemoteMemory, roofline: Roofline | None, replay_only: bool, corrected: bool,
                 kernels: KernelModel | None = None,
                 comm_groups: dict[int, tuple[int, ...]], warn: Callable[[str], None],
                 timeline: bool = False, nccl: NcclRun | None = None, comm_streams: str = SINGLE_STREAM,
                 sm_sharing: bool = False) -> None:
        self.rank = rank
        self.path = path
        self.graph = graph
        self.system = system
        self.engine = system.engine
        self.memory = memory
        self.roofline = roofline
        self.replay_only = replay_only
        self.corrected = corrected
        self.warn = warn
        self.table = node_table(graph)
        self.kernel_ns: list[int] | None = None  # --compute-model kernels: per node, its time or REPLAY
        if kernels is not None:
            t = self.table
            self.kernel_ns = node_times(graph, kernels, is_gpu_compute(np.asarray(t.types), np.asarray(t.is_cpu)),
                                        t.num_ops, t.tensor_size,
                                        np.asarray(t.has_num_ops) | np.asarray(t.has_tensor_size)).ns
        self.lanes, num_lanes = (self.table.lanes, NUM_LANES) if comm_streams == SINGLE_STREAM else \
            communicator_lanes(self.table)
        self.feeder = Feeder(graph, deps, lanes=self.lanes, num_lanes=num_lanes)
        self.slot_busy = [False] * num_lanes  # the receive lane never gets busy
        self.groups: dict[int, CommGroup] = {gid: CommGroup(gid, members) for gid, members in comm_groups.items()}
        self.start_ns: dict[int, int] = {}
        self.intervals = Intervals()
        self.gpu_compute_ns = 0  # ASTRA-sim's tics_gpu_ops: what "exposed communication" subtracts
        self.cpu_compute_ns = 0
        self.comm_busy_ns = 0  # sum of collective execution times (tics_gpu_comms)
        self.finish_ns: int | None = None
        self.stalled = False
        self.collectives: dict[int, DataSet] = {}
        self.waiting_recv: dict[int, tuple[int, int, int]] = {}  # node -> (src, size, tag) while pending
        self.collective_log: list[CollectiveRecord] = []
        self._collective_info: dict[int, tuple[str, int, int]] = {}  # node -> (kind, participants, group)
        self.timeline = TimelineLog() if timeline else None
        self.nccl = nccl  # --collective-model nccl: collectives go to the run's NCCL-like model
        # --sm-sharing: the SMs this rank's running collectives hold slow its compute-bound kernels
        self.sms = SmSharing(graph, kernels.units) if sm_sharing and kernels is not None and nccl is not None \
            else None

    # --- the issue loop ------------------------------------------------------------------------------
    def wake(self, _: Any = None) -> None:
        """ASTRA-sim's Workload::fire: issue what can be issued, then check for the end."""
        self._issue_ready()
        self._check_finished()

    def _issue_ready(self) -> None:
        feeder, busy = self.feeder, self.slot_busy
        closed = list(busy)  # the receive lane is never busy
        deferred = False
        while True:
            best = best_lane = -1
            for lane, head in enumerate(feeder.lane_heads()):
                if head is not None and not closed[lane] and (best < 0 or head < best):
                    best, best_lane = head, lane
            if best < 0:
                break
            feeder.take(best_lane)
            if self._issue(best):
                deferred = True
            if busy[best_lane]:
                closed[best_lane] = True
        if deferred:
            feeder.release_deferred()
            if self.corrected:
                self.system.register(0, self.wake)

    def _issue(self, i: int) -> bool:
        """Issue node i; True when it finished at once (its children then wait for the next walk)."""
        t = self.table
        lane = self.lanes[i]
        if lane != RECV_LANE:
            self.slot_busy[lane] = True
        self.start_ns[i] = self.engine.now
        ntype = t.types[i]
        if self.replay_only:
            self._replay(i)
        elif ntype == NodeType.MEM_LOAD_NODE or ntype == NodeType.MEM_STORE_NODE:
            self.memory.access(self.rank, self.system.events, t.tensor_size[i], self._node_done, i)
        elif ntype == NodeType.COMP_NODE:
            if self.kernel_ns is not None and self.kernel_ns[i] != REPLAY:
                runtime = self.kernel_ns[i]
                if runtime <= 0:
                    return self._finish_at_once(i)
                if self.sms is not None:
                    runtime = self.sms.scaled(i, runtime)
                self.gpu_compute_ns += runtime
                self.system.register(runtime, self._node_done, i)
            elif self.roofline is None or t.is_cpu[i] or self.kernel_ns is not None:
                self._replay(i)
            else:
                if t.tensor_size[i] <= 0:
                    return self._finish_at_once(i)
                runtime = self.roofline.time_ns(t.num_ops[i], t.tensor_size[i])
                self.gpu_compute_ns += runtime
                self.system.register(runtime, self._node_done, i)
        elif ntype in COMM_TYPES:
            if t.is_cpu[i]:
                self._replay(i)  # a host-side record of a collective (ASTRA-sim stops with an error)
            elif ntype == NodeType.COMM_COLL_NODE:
                self._issue_collective(i)
            elif ntype == NodeType.COMM_SEND_NODE:
                self._issue_send(i)
            else:
                self._issue_recv(i)
        else:
            if ntype == NodeType.METADATA_NODE:
                self._read_process_groups(i)
            return self._finish_at_once(i)
        return False

    def _replay(self, i: int) -> None:
        runtime = self.table.replay_ns[i]
        if self.table.is_cpu[i]:
            self.cpu_compute_ns += runtime
        else:
            self.gpu_compute_ns += runtime
        self.system.register(runtime, self._node_done, i)

    def _finish_at_once(self, i: int) -> bool:
        self.feeder.finish(i, defer=True)
        self._release(i)
        return True

    # --- node kinds ----------------------------------------------------------------------------------
    def _issue_collective(self, i: int) -> None:
        t = self.table
        ctype = t.comm_type[i]
        group = self._group(i)
        participants = len(group.members) if group else self.system.total_npus
        if ctype == CollectiveType.BROADCAST:  # ASTRA-sim replays broadcasts by their recorded duration
            self._collective_info[i] = ("broadcast", participants, group.gid if group else 0)
            dataset = DataSet(1, self.engine.now)
            dataset.on_done = lambda ns, i=i: self._collective_done(i, ns)
            self.system.register(t.replay_ns[i], lambda _: dataset.stream_finished(self.engine.now))
            return
        kind = COLLECTIVE_KINDS.get(CollectiveType(ctype))
        if kind is None:
            raise self._error(i, f"collective {CollectiveType(ctype).name} is not supported by ASTRA-sim 2.x "
                                 "(all-reduce, all-gather, reduce-scatter, all-to-all and broadcast are)")
        if self.nccl is not None:
            self._issue_nccl(i, kind, group, participants)
            return
        involved = t.involved_dim.get(i)
        dims = len(self.system.setup.npus_per_dim)
        if involved is None:
            involved = [True] * max(4, dims)
        elif len(involved) < dims:  # ASTRA-sim reads past the list: missing dimensions are not involved
            involved = involved + [False] * (dims - len(involved))
        self._collective_info[i] = (kind, participants, group.gid if group else 0)
        system = self.system
        ours, theirs = system.stream_counter, system.all_streams  # the ids of its first stream, both ways
        try:
            dataset = system.generate_collective(kind, t.comm_size[i], involved, group, t.comm_priority[i])
        except InputError as e:
            raise self._error(i, str(e)) from None
        numbers = system.setup.stream_numbers
        if numbers is not None and system.stream_counter != ours:  # a collective over every rank, with streams
            numbers.check(ours, theirs, self, i)
        dataset.on_done = lambda ns, i=i: self._collective_done(i, ns)
        dataset.label = i
        self.collectives[i] = dataset
        if dataset.total == 0:  # nothing to communicate (ASTRA-sim would never finish it)
            self.system.register(0, lambda _, i=i: self._collective_done(i, 0))

    def _issue_nccl(self, i: int, kind: str, group: CommGroup | None, participants: int) -> None:
        """Hand the collective to the NCCL-like model: it starts when every member has issued it."""
        assert self.nccl is not None
        size = self.table.comm_size[i]
        if kind == ALL_GATHER:  # the trace carries what each rank contributes; the model takes the gathered output
            size *= participants
        gid = group.gid if group else 0
        self._collective_info[i] = (kind, participants, gid)
        dataset = DataSet(1, self.engine.now)  # a placeholder for progress lines and deadlock reports
        dataset.label = i
        self.collectives[i] = dataset
        members = group.members if group else self.nccl.world
        try:
            self.nccl.issue(self.rank, gid, members, kind, size, self._nccl_done, i, lambda: self._where(i),
                            comm_libraries(self.graph).get(i, ""))
        except InputError as e:
            raise self._error(i, str(e)) from None
        if self.sms is not None:
            self.sms.hold(i, self.nccl.blocks(gid, members, kind, size))

    def _nccl_done(self, i: int, chosen: Candidate) -> None:
        if self.sms is not None:
            self.sms.release(i)
        self._collective_done(i, self.engine.now - self.start_ns[i], chosen)

    def _group(self, i: int) -> CommGroup | None:
        name = self.table.pg_name.get(i, "")
        if name in ("", "0"):
            return None
        try:
            gid = int(name)
        except ValueError:
            raise self._error(i, f"pg_name {name!r} is not a communicator group number") from None
        group = self.groups.get(gid)
        if group is None:
            raise self._error(i, f"communicator group {gid} is not defined", missing_groups_hint(self.path))
        if self.rank not in group.members:
            raise self._error(i, f"rank {self.rank} issues a collective on communicator group {gid}, "
                                 f"which does not include it (members {list(group.members)})")
        return group

    def _read_process_groups(self, i: int) -> None:
        try:
            groups = metadata_groups(self.graph, i)
        except TraceError as e:
            raise e.located(path=self.path, rank=self.rank) from None
        if groups is None:
            return
        total = self.system.total_npus
        for name, ranks in groups:
            try:
                pg = int(name)
            except ValueError:
                continue
            outside = [r for r in ranks if r >= total]
            if outside:
                raise self._error(i, f"process group {shown(name)} names rank(s) {shown(outside)} outside the "
                                     f"{total}-NPU network")
            members = tuple(ranks) if ranks else tuple(range(total))
            self.groups[pg] = CommGroup(pg + 1, members)  # ASTRA-sim numbers them pg_name + 1

    def _issue_send(self, i: int) -> None:
        dst, tag = self._point_to_point(i, "send", "comm_src", "comm_dst")
        if self.timeline is not None:
            self.timeline.sends.append((i, dst, tag, self.table.comm_size[i]))
        self.system.send(dst, self.table.comm_size[i], tag, self._node_done, i)

    def _issue_recv(self, i: int) -> None:
        src, tag = self._point_to_point(i, "receive", "comm_dst", "comm_src")
        if self.timeline is not None:
            self.timeline.recvs.append((i, src, tag, self.table.comm_size[i]))
        self.waiting_recv[i] = (src, self.table.comm_size[i], self.table.comm_tag[i])
        self.system.recv(src, self.table.comm_size[i], tag, self._node_done, i)

    def _point_to_point(self, i: int, what: str, own_attr: str, peer_attr: str) -> tuple[int, int]:
        """(peer rank, wire tag) of a send or receive; ``own_attr`` may be absent but must name this rank."""
        own = getattr(self.table, own_attr)[i]
        if own not in (NO_VALUE, self.rank):
            raise self._error(i, f"a {what} with {own_attr} {own} is in rank {self.rank}'s trace",
                              f"a rank may only {what} its own data")
        peer = getattr(self.table, peer_attr)[i]
        self._check_peer(i, peer, peer_attr)
        return peer, wire_tag(self.table.comm_tag[i], POINT_TO_POINT)

    def _check_peer(self, i: int, peer: int, attr: str) -> None:
        if not 0 <= peer < self.system.total_npus:
            raise self._error(i, f"{attr} {peer} is not a rank of the {self.system.total_npus}-NPU network")
        if peer == self.rank:
            raise self._error(i, f"{attr} {peer} is the rank itself", "a rank cannot send to itself")

    # --- completion ----------------------------------------------------------------------------------
    def _release(self, i: int) -> None:
        lane = self.lanes[i]
        if lane != RECV_LANE:
            self.slot_busy[lane] = False
        self._record(i)

    def _record(self, i: int) -> None:
        ntype = self.table.types[i]
        iv = self.intervals
        span = (self.start_ns.pop(i), self.engine.now)
        if self.timeline is not None:
            self.timeline.spans.append((i, *span))
        if ntype == NodeType.COMP_NODE:
            (iv.cpu if self.table.is_cpu[i] else iv.gpu).append(span)
        elif ntype in COMM_TYPES:
            iv.comm.append(span)
        elif ntype in (NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE):
            iv.memory.append(span)
        else:
            iv.other.append(span)

    def _node_done(self, i: int) -> None:
        if self.finish_ns is not None:
            return
        self.waiting_recv.pop(i, None)
        self._release(i)
        self.feeder.finish(i)
        self.wake()

    def _collective_done(self, i: int, execution_ns: int, chosen: Candidate | None = None) -> None:
        if self.finish_ns is not None:
            return
        self.comm_busy_ns += execution_ns
        self.collectives.pop(i, None)
        kind, participants, group = self._collective_info.pop(i)
        if chosen is None:
            record = CollectiveRecord(i, kind, self.table.comm_size[i], participants, group, self.start_ns[i],
                                      self.engine.now)
        else:
            record = CollectiveRecord(i, kind, self.table.comm_size[i], participants, group, self.start_ns[i],
                                      self.engine.now, chosen.algorithm, chosen.protocol, chosen.channels)
        self.collective_log.append(record)
        self._node_done(i)

    def _check_finished(self) -> None:
        self.stalled = False
        f = self.feeder
        if f.taken != f.finished:
            return  # a node is running: it wakes the rank again when it finishes
        if f.issuable_count == 0 and not any(self.slot_busy):
            if f.finished < f.num_nodes:
                return  # nodes still wait for parents that can never finish (reported as a deadlock)
            self.finish_ns = self.engine.now
        elif f.issuable_count:
            self.stalled = True  # only zero-time nodes ran: nothing will wake this rank again

    # --- errors and reports --------------------------------------------------------------------------
    def _where(self, i: int) -> str:
        return f"{self.path} node {self.graph.node_id(i)} ({self.graph.name(i)!r})"

    def _error(self, i: int, problem: str, hint: str | None = None) -> InputError:
        text = f"{self.path}: rank {self.rank}: node {self.graph.node_id(i)} ({self.graph.name(i)!r}): {problem}"
        return InputError(text + (f" ({hint})" if hint else ""))

    def stats(self) -> RankStats:
        from simulator.results import rank_stats

        return rank_stats(self)


def comm_libraries(graph: TraceGraph) -> dict[int, str]:
    """Per collective node naming the library that runs it instead of NCCL (comm_library): the name; cached."""
    cached = graph.cache.get(COMM_LIBRARY)
    if cached is None:
        cached = graph.cache[COMM_LIBRARY] = graph.attrs.strings(COMM_LIBRARY) if graph.attrs.has(COMM_LIBRARY) else {}
    return cached  # type: ignore[no-any-return]
