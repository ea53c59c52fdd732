"""The per-NPU system layer (ASTRA-sim's ``Sys``): collectives become chunk-streams of per-dimension
phases that wait in per-dimension queues; messages go through the endpoint and the network.

A collective of ``size`` bytes is cut into chunks (``preferred-dataset-splits``); each chunk is a stream
whose phases run one algorithm on one dimension each. A stream's phase waits on its queue until fewer
than ``active-chunks-per-dimension`` streams run there; waiting streams are ordered by priority (LIFO:
newer first, FIFO: older first, EXPLICIT: the node's ``comm_priority``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from network.messaging import Messaging
from simulator.chunk_order import ChunkOrders
from simulator.collectives.algorithms import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, Algorithm
from simulator.collectives.custom import CustomAlgorithm, CustomAlgorithms
from simulator.collectives.registry import make_algorithm, parse_algorithm
from simulator.collectives.topology import CollectiveTopology, LogicalRing, build_topology
from simulator.config import SystemConfig
from simulator.engine import Engine, RankEvents
from simulator.stream_numbers import StreamNumbers
from workload.errors import InputError, LimitError

# Message tags live in separate namespaces, so no trace tag can alias a collective's or a handshake's:
# wire tag = 4 x tag + kind (Python integers: exact for every 64-bit tag).
POINT_TO_POINT, COLLECTIVE, HANDSHAKE = 0, 1, 2  # a handshake tag is the tag it prepares + HANDSHAKE


def wire_tag(tag: int, kind: int) -> int:
    return 4 * tag + kind


def tag_kind(wire: int) -> tuple[int, int]:
    """(tag, kind) of a wire tag; a handshake's kind is HANDSHAKE plus the kind it prepares."""
    return wire >> 2, wire & 3
RENDEZVOUS_BYTES = 8192
MAX_STREAMS_PER_COLLECTIVE = 1 << 20  # each chunk-stream holds a few objects: a million is about a GB
LOCAL_INJECTION_NS = 10  # a communicator-group ring's per-message delay, whatever the endpoint delay


@dataclass(frozen=True, slots=True)
class SystemSetup:
    """What every rank's system layer shares."""

    engine: Engine
    messaging: Messaging
    config: SystemConfig
    npus_per_dim: tuple[int, ...]
    queues_per_dim: int = 1
    injection_scale: float = 1.0
    rendezvous: bool = False
    chunk_orders: ChunkOrders | None = None  # None: one simulated rank, which cannot disagree with itself
    custom: CustomAlgorithms = field(default_factory=CustomAlgorithms)  # custom collectives' ETs, read once
    stream_numbers: StreamNumbers | None = None  # where ASTRA-sim would number collectives differently
    group_rings: set[str] = field(default_factory=set)  # kinds whose configured algorithms a group ran as a ring

    @property
    def total_npus(self) -> int:
        return math.prod(self.npus_per_dim)


class DataSet:
    """A collective's streams; reports the collective done when the last stream finishes."""

    __slots__ = ("created_ns", "finished", "label", "on_done", "phases_done", "phases_total", "total")

    def __init__(self, total: int, created_ns: int) -> None:
        self.total = total
        self.finished = 0
        self.phases_total = 0  # phases of all its streams, and those finished (progress estimates)
        self.phases_done = 0
        self.created_ns = created_ns
        self.on_done: Callable[[int], None] | None = None
        self.label = -1  # the workload node it belongs to (for timelines)

    def stream_finished(self, now: int) -> None:
        self.finished += 1
        if self.finished == self.total and self.on_done is not None:
            self.on_done(now - self.created_ns)


class Phase:
    __slots__ = ("algorithm", "dim", "name", "queue")

    def __init__(self, queue: int, algorithm: Algorithm, dim: int, name: str) -> None:
        self.queue = queue
        self.algorithm = algorithm
        self.dim = dim
        self.name = name  # the algorithm's configured name


class Stream:
    """One chunk of a collective, moving through its phases; the algorithms' port to the system.

    The port is every message's path, so it goes straight to the messaging layer (unless the rendezvous
    protocol adds its handshake) and hands the event lists the current phase's algorithm with its unbound
    handler, so a completion calls the algorithm without a wrapper in between."""

    __slots__ = ("algorithm", "communicator", "dataset", "general", "id", "initialized", "members", "messaging",
                 "phase", "phases", "priority", "queue", "rank", "received", "started_ns", "step", "system", "tag")

    def __init__(self, system: RankSystem, stream_id: int, dataset: DataSet, phases: list[Phase], priority: int,
                 communicator: int = -1, members: int = 0) -> None:
        self.system = system
        self.rank = system.rank
        self.messaging = None if system.rendezvous else system.messaging
        self.id = stream_id
        self.tag = wire_tag(stream_id, COLLECTIVE)  # its messages' tag
        self.communicator = communicator  # the communicator group's id, -1 for all NPUs
        self.members = members  # ranks that run this stream together
        self.dataset = dataset
        self.phases = deque(phases)
        self.phase: Phase | None = None
        self.algorithm: Algorithm | None = None  # the current phase's, with its handlers (unbound)
        self.general: Callable[[Any], None] = _no_phase
        self.received: Callable[[Any], None] = _no_phase
        self.queue = -1
        self.priority = priority
        self.initialized = False
        self.started_ns = 0
        self.step = -1
        for p in phases:
            p.algorithm.port = self

    # the algorithm's port
    def send(self, dst: int, size: int) -> None:
        messaging = self.messaging
        if messaging is None:
            self.system.send(dst, size, self.tag, None, None)
        else:
            messaging.send(self.rank, dst, size, self.tag, None, None)

    def recv(self, src: int, size: int) -> None:
        messaging = self.messaging
        if messaging is None:
            self.system.recv(src, size, self.tag, self.received, self.algorithm)
        else:
            messaging.recv(self.rank, src, size, self.tag, self.received, self.algorithm)

    def bundle(self, processed: bool, size: int, local: bool) -> None:
        """A packet through the endpoint (and a reduction when ``processed``), then back to the algorithm."""
        system = self.system
        delay = LOCAL_INJECTION_NS if local else system.endpoint_delay
        if processed:
            system.events.register(delay, system.bundle_injected, (self, size))
        else:
            system.events.register(delay, self.general, self.algorithm)

    def exit(self) -> None:
        self.system.proceed(self)


def _no_phase(_: Any) -> None:  # pragma: no cover - a stream's handlers are set when its first phase begins
    raise RuntimeError("a chunk-stream got an event before its first phase")


class _QueueLevel:
    """The queues of one dimension and ASTRA-sim's round-robin allocators over them."""

    __slots__ = ("first_allocator", "last_allocator", "next_allocator", "queues")

    def __init__(self, queues: list[int]) -> None:
        self.queues = queues
        self.next_allocator = 0
        self.first_allocator = 0
        self.last_allocator = len(queues) // 2

    def next(self) -> tuple[int, bool]:
        half = len(self.queues) // 2
        clockwise = not (len(self.queues) > 1 and self.next_allocator >= half)
        q = self.queues[self.next_allocator]
        self.next_allocator = (self.next_allocator + 1) % len(self.queues)
        return q, clockwise

    def first(self) -> tuple[int, bool]:
        q = self.queues[self.first_allocator]
        self.first_allocator += 1
        if self.first_allocator >= len(self.queues) // 2:
            self.first_allocator = 0
        return q, True

    def last(self) -> tuple[int, bool]:
        q = self.queues[self.last_allocator]
        self.last_allocator += 1
        if self.last_allocator >= len(self.queues):
            self.last_allocator = len(self.queues) // 2
        return q, False


@dataclass(slots=True)
class CommGroup:
    """A communicator group as one rank sees it, with its stream-id counter."""

    gid: int
    members: tuple[int, ...]
    next_stream: int = 0

    def __post_init__(self) -> None:
        self.next_stream = self.gid * 1_000_000


class RankSystem:
    """The system layer of one NPU."""

    def __init__(self, rank: int, setup: SystemSetup) -> None:
        cfg = setup.config
        self.rank = rank
        self.setup = setup
        self.engine = setup.engine
        self.events = RankEvents(setup.engine, rank)
        self.messaging = setup.messaging
        self.endpoint_delay = cfg.endpoint_delay(setup.injection_scale)
        self.local_mem_Bps = cfg.local_mem_bw_GBps * 1e9 if cfg.local_mem_bw_GBps else 0.0
        self.splits = cfg.preferred_dataset_splits
        self.total_npus = setup.total_npus
        q = setup.queues_per_dim
        self.levels = [_QueueLevel(list(range(d * q, (d + 1) * q))) for d in range(len(setup.npus_per_dim))]
        self.active: list[list[Stream]] = [[] for _ in range(q * len(setup.npus_per_dim))]
        self.running = [0] * len(self.active)
        self.threshold = math.ceil(cfg.active_chunks_per_dimension / q)
        self.priority_counter = 0
        self.stream_counter = 0  # chunk-streams of collectives over every rank: their ids, paired in issue order
        self.all_streams = 0  # every chunk-stream started, group ones too: ASTRA-sim's ids for the former
        self._topologies: dict[str, CollectiveTopology] = {}
        self.groups: dict[int, CommGroup] = {}
        self.rendezvous = setup.rendezvous
        self.chunk_places: dict[tuple[int, int], int] = {}  # this rank's place in each agreed chunk order
        self.phase_log: list[tuple[int, int, int, str, str, int, int, int, int]] | None = None  # when recording

    # --- events and messages -----------------------------------------------------------------------
    def register(self, delay: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        self.events.register(delay, fn, arg)

    def send(self, dst: int, size: int, tag: int, on_sent: Callable[[Any], None] | None, arg: Any) -> None:
        if self.rendezvous:  # wait for the receiver's 8 KiB handshake first
            self.messaging.recv(self.rank, dst, RENDEZVOUS_BYTES, tag + HANDSHAKE, self._rendezvous_send,
                                (dst, size, tag, on_sent, arg))
        else:
            self.messaging.send(self.rank, dst, size, tag, on_sent, arg)

    def _rendezvous_send(self, request: tuple[int, int, int, Any, Any]) -> None:
        dst, size, tag, on_sent, arg = request
        self.messaging.send(self.rank, dst, size, tag, on_sent, arg)

    def recv(self, src: int, size: int, tag: int, on_received: Callable[[Any], None], arg: Any) -> None:
        if self.rendezvous:  # tell the sender we are ready, then post the receive
            self.messaging.send(self.rank, src, RENDEZVOUS_BYTES, tag + HANDSHAKE, self._rendezvous_recv,
                                (src, size, tag, on_received, arg))
        else:
            self.messaging.recv(self.rank, src, size, tag, on_received, arg)

    def _rendezvous_recv(self, request: tuple[int, int, int, Any, Any]) -> None:
        src, size, tag, on_received, arg = request
        self.messaging.recv(self.rank, src, size, tag, on_received, arg)

    def reduction_ns(self, size: int) -> int:
        """Three passes over the data at local-mem-bw (write, read, read), each truncated."""
        if not self.local_mem_Bps:
            raise InputError(f"{self.setup.config.path}: 'local-mem-bw' is needed to charge collective reductions")
        return 3 * int(size / self.local_mem_Bps * 1e9)

    def bundle_injected(self, arg: tuple[Stream, int]) -> None:
        """A reducing packet is through the endpoint: the reduction, then back to the algorithm."""
        stream, size = arg
        self.events.register(self.reduction_ns(size), stream.general, stream.algorithm)

    # --- collectives ---------------------------------------------------------------------------------
    def topology(self, kind: str) -> tuple[CollectiveTopology, tuple[str, ...]]:
        impls = self.setup.config.implementation(kind)
        if not impls:
            raise InputError(f"{self.setup.config.path}: no '{kind.replace('_', '-')}-implementation' is given, "
                             "but the workload has such collectives")
        topo = self._topologies.get(kind)
        if topo is None:
            topo = self._topologies[kind] = build_topology(self.rank, self.setup.npus_per_dim, impls)
        return topo, impls

    def group_plan(self, group: CommGroup, kind: str) -> tuple[CollectiveTopology, tuple[str, ...], Sequence[bool]]:
        """ASTRA-sim's plan for a communicator group: all NPUs -> the usual topology; fewer -> one ring over
        the members in listed order (running the configured algorithm if it has one dimension, else ring)."""
        if len(group.members) == self.total_npus:
            topo, impls = self.topology(kind)
            return topo, impls, [True] * 10
        impls = self.setup.config.implementation(kind)
        if not impls:
            self.topology(kind)  # raises the missing-implementation error
        if len(impls) > 1:
            if any(name != "ring" for name in impls):
                self.setup.group_rings.add(kind)
            impls = ("ring",)
        key = f"group{group.gid}:{kind}"
        topo = self._topologies.get(key)
        if topo is None:
            topo = self._topologies[key] = CollectiveTopology([LogicalRing(group.members, local=True)])
        return topo, impls, [True]

    def _custom_collective(self, kind: str, prefix: str, size: int, group: CommGroup | None,
                           explicit_priority: int) -> DataSet:
        """ASTRA-sim's custom collective: one stream, one phase (queue 0) running the ET of this rank's position
        in the communicator (simulator/collectives/custom.py)."""
        chunk = size // self.splits
        if kind != ALL_GATHER and self.total_npus > chunk:
            chunk = self.total_npus
            size = self.splits * chunk
        if math.ceil(float(size) / float(max(chunk, 1))) != 1:
            raise InputError(f"{self.setup.config.path}: a custom {kind.replace('_', '-')} algorithm runs one "
                             f"chunk-stream, but 'preferred-dataset-splits' {self.splits} makes ASTRA-sim wait for "
                             "more, so it never finishes: set it to 1")
        position = self.rank if group is None else group.members.index(self.rank)
        graph = self.setup.custom.graph(prefix, position)
        algorithm = CustomAlgorithm(kind, self.rank, graph, None if group is None else group.members, size)
        dataset = DataSet(1, self.engine.now)
        dataset.phases_total = 1
        if group is None:
            stream_id = self.stream_counter
            self.stream_counter += 1
        else:
            stream_id = group.next_stream
            group.next_stream += 1
        self.all_streams += 1
        stream = Stream(self, stream_id, dataset, [Phase(0, algorithm, 0, "custom")], self.priority(explicit_priority),
                        -1 if group is None else group.gid, self.total_npus if group is None else len(group.members))
        self.proceed(stream)
        return dataset

    def generate_collective(self, kind: str, size: int, involved: Sequence[bool], group: CommGroup | None,
                            explicit_priority: int) -> DataSet:
        """Chunk a collective into streams, each with its phases, and queue them."""
        custom = self.setup.config.custom(kind)
        if custom is not None:
            return self._custom_collective(kind, custom, size, group, explicit_priority)
        if group is None:
            topo, impls = self.topology(kind)
        else:
            topo, impls, involved = self.group_plan(group, kind)
        chunk = size // self.splits
        if kind != ALL_GATHER and self.total_npus > chunk:  # ASTRA-sim's minimum chunk: one byte per NPU
            chunk = self.total_npus
            size = self.splits * chunk
        chunk = max(chunk, 1)
        # ASTRA-sim waits for ceil(size / chunk) streams, computed in double precision, although its loop below
        # makes one more when huge sizes round that quotient down; the collective ends with the streams it waits for
        waited_for = math.ceil(float(size) / float(chunk))
        if waited_for > MAX_STREAMS_PER_COLLECTIVE:
            raise LimitError(f"'preferred-dataset-splits' {self.splits:,} cuts this collective into {waited_for:,} "
                             f"chunk-streams (at most {MAX_STREAMS_PER_COLLECTIVE:,} fit in memory): lower it")
        dataset = DataSet(waited_for, self.engine.now)
        priority = self.priority(explicit_priority)
        dims = list(range(topo.num_dims))
        if kind == ALL_GATHER:
            dims.reverse()
        active = [d for d in dims if topo.nodes_in_dim(d) > 1 and involved[d]]
        count = 0
        while size > 0:
            count += 1
            size = 0 if chunk > size else size - chunk
            remain = chunk
            phases: list[Phase] = []
            if kind != ALL_REDUCE or self.setup.config.collective_optimization == "baseline":
                for d in active:
                    queue, clockwise = self.levels[d].next()
                    phase = self.phase(kind, topo, d, impls[d], remain, queue, clockwise)
                    phases.append(phase)
                    remain = phase.algorithm.final_data_size
            elif active:
                *inner, last = active
                for d in inner:
                    queue, clockwise = self.levels[d].first()
                    phase = self.phase(REDUCE_SCATTER, topo, d, impls[d], remain, queue, clockwise)
                    phases.append(phase)
                    remain = phase.algorithm.final_data_size
                queue, clockwise = self.levels[last].first()
                phase = self.phase(ALL_REDUCE, topo, last, impls[last], remain, queue, clockwise)
                phases.append(phase)
                remain = phase.algorithm.final_data_size
                for d in reversed(inner):
                    queue, clockwise = self.levels[d].last()
                    phase = self.phase(ALL_GATHER, topo, d, impls[d], remain, queue, clockwise)
                    phases.append(phase)
                    remain = phase.algorithm.final_data_size
            if not phases:
                dataset.total = 0  # nothing to do on any dimension (see Simulation: completes at once)
                return dataset
            dataset.phases_total += len(phases)
            self.all_streams += 1
            if group is None:
                stream_id = self.stream_counter
                self.stream_counter += 1
                stream = Stream(self, stream_id, dataset, phases, priority, -1, self.total_npus)
            else:
                stream = Stream(self, group.next_stream, dataset, phases, priority, group.gid, len(group.members))
                group.next_stream += 1
            self.proceed(stream)  # the ready list runs at once
        dataset.total = min(count, waited_for)
        return dataset

    def phase(self, kind: str, topo: CollectiveTopology, dim: int, name: str, size: int, queue: int,
              clockwise: bool) -> Phase:
        algorithm = make_algorithm(parse_algorithm(name), kind, self.rank, topo.basic(dim), size, clockwise)
        return Phase(queue, algorithm, dim, name)

    def priority(self, explicit: int) -> int:
        policy = self.setup.config.scheduling_policy
        if policy == "EXPLICIT":
            return explicit
        value = self.priority_counter
        self.priority_counter += 1 if policy == "LIFO" else -1
        return value

    # --- stream scheduling ---------------------------------------------------------------------------
    def proceed(self, stream: Stream) -> None:
        """Move a stream to its next phase's queue, or retire it (ASTRA-sim's proceed_to_next_vnet)."""
        previous = stream.queue
        if stream.phase is not None:
            stream.dataset.phases_done += 1
        if self.phase_log is not None and stream.phase is not None:
            phase = stream.phase
            self.phase_log.append((stream.dataset.label, stream.id, stream.step, phase.algorithm.kind, phase.name,
                                   phase.dim, phase.queue, stream.started_ns, self.engine.now))
        if not stream.phases:
            stream.phase = stream.algorithm = None  # its algorithms refer to it: no cycle left for the collector
            stream.dataset.stream_finished(self.engine.now)  # may issue new collectives right now
            if previous >= 0:
                self.active[previous].remove(stream)
                self._queue_freed(previous)
            return
        if previous >= 0:
            self.active[previous].remove(stream)
        phase = stream.phases.popleft()
        stream.phase = phase
        algorithm = stream.algorithm = phase.algorithm
        kind = type(algorithm)
        stream.general = kind.on_general  # type: ignore[assignment]
        stream.received = kind.on_received  # type: ignore[assignment]
        stream.queue = phase.queue
        stream.step += 1
        stream.initialized = False
        waiting = self.active[phase.queue]
        i = 0
        while i < len(waiting) and (waiting[i].initialized or waiting[i].priority >= stream.priority):
            i += 1
        waiting.insert(i, stream)
        if previous >= 0:
            self._queue_freed(previous)
        self._start_waiting(phase.queue)

    def _queue_freed(self, queue: int) -> None:
        self.running[queue] -= 1
        self._start_waiting(queue)

    def _start_waiting(self, queue: int) -> None:
        streams = self.active[queue]
        running = self.running
        orders = self.setup.chunk_orders
        while running[queue] < len(streams) and running[queue] < self.threshold:
            first = running[queue]
            if orders is not None:  # the next stream whose turn it is in its ring's agreed order
                places = self.chunk_places
                i = first
                while i < len(streams):
                    s = streams[i]
                    if orders.admit(places, (s.communicator, queue), s.members, (s.id, s.step)):
                        break
                    i += 1
                else:
                    return
                if i != first:
                    streams.insert(first, streams.pop(i))
            stream = streams[first]
            running[queue] += 1
            stream.initialized = True
            stream.started_ns = self.engine.now
            stream.phase.algorithm.start()  # type: ignore[union-attr]

