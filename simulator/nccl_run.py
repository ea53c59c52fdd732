"""Collectives and sends/receives timed by the NCCL/RCCL-like model inside the event-driven run
(``--collective-model nccl``).

One ``NcclRun`` per simulation, shared by every rank:

- **Rendezvous.** An NCCL collective synchronises its communicator: it starts when every member has issued
  it. Calls match by (communicator id, the rank's sequence number of collectives on that communicator);
  members that disagree on the kind, size or members of a call are an InputError naming both ranks and nodes.
- **Timing.** A started collective takes the chosen candidate's ``latency_us`` (a fixed delay, unaffected
  by other traffic), then a transfer job of ``transfer_us`` at full rate (simulator/collectives/nccl.py).
- **Sharing.** Transfer jobs share resources in a fluid processor-sharing scheduler (simulator/nccl_flows.py):
  each member GPU's scale-up port ``("up", rank)`` when the communicator has 2+ members on that node, and every
  NIC it crosses ``("nic", node, nic)`` when it spans nodes. Two concurrent all-reduces on the same GPUs each
  take about twice as long; groups on disjoint GPUs do not slow each other. Transfers that end at the same time
  complete before other events of that time, member by member in rank order, each rank's in its issue order.
- **Sends/receives** are timed as ``send_recv`` plans on the same scheduler (resources: both GPUs' scale-up
  ports on one node, else their NICs). ``NcclRun`` is the network backend of the run's Messaging, so sends
  and receives still match there (network/messaging.py); a delivery completes as two halves, the send's among
  the sender's completions and the receive's among the receiver's (``transmit_halves``).

With one representative rank (the symmetric engine), a collective starts when the *simulated* members have
issued it: every rank does the same at the same time, so concurrent collectives still share resources as
they would with every rank simulated. With one rank per class (``classes``: simulator/nccl_classes.py), calls,
jobs and resources go by class.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from simulator.collectives.algorithms import ALL_GATHER
from simulator.collectives.hardware import HardwareProfile
from simulator.collectives.nccl import SEND_RECV, Candidate, CollectiveModel, Communicator, Plan
from simulator.nccl_classes import NcclClasses
from simulator.nccl_flows import Completion, FlowScheduler
from workload.errors import InputError

Callback = Callable[[Any], None]
Done = Callable[[Any, Candidate], None]  # fn(arg, the chosen candidate) when a collective completes


class _Comm:
    """A communicator as the model sees it: members, layout, shared resources (and their weights in a run by
    classes), plans by (kind, size)."""

    __slots__ = ("communicator", "expected", "members", "resources", "timings", "weights")

    def __init__(self, members: tuple[int, ...], communicator: Communicator, resources: tuple[int, ...],
                 expected: int, weights: tuple[int, ...] | None = None) -> None:
        self.members = members
        self.communicator = communicator
        self.resources = resources
        self.weights = weights
        self.expected = expected  # arrivals that start a call: the members simulated
        self.timings: dict[tuple[str, int], tuple[Plan, int, int]] = {}


class _Call:
    """A collective call waiting for its members."""

    __slots__ = ("arrived", "comm", "first", "kind", "members", "ranks", "seq", "size")

    def __init__(self, kind: str, size: int, comm: _Comm, members: tuple[int, ...], seq: int,
                 first: tuple[int, Callable[[], str]]) -> None:
        self.kind = kind
        self.size = size
        self.comm = comm
        self.members = members
        self.seq = seq
        self.first = first  # (rank, where) of the first member to issue it, for errors
        self.arrived: list[tuple[int, int, Done, Any]] = []  # (rank, its issue counter, fn, arg)
        self.ranks: list[int] = []


class NcclRun:
    """The run's NCCL-like collective layer and point-to-point network (see the module docstring)."""

    name = "nccl"  # as a network backend

    def __init__(self, engine: Any, profile: HardwareProfile, npus: int, simulated: Collection[int],
                 algorithm: str | None = None, warn: Callable[[str], None] | None = None,
                 classes: NcclClasses | None = None) -> None:
        self.engine = engine
        self.profile = profile
        self.model = CollectiveModel(profile)
        self.algorithm = algorithm  # forced (NCCL_ALGO) wherever it can run; the library picks elsewhere
        self.warn = warn or (lambda message: None)
        self._unforced: set[tuple[str, int, int]] = set()
        self.gpus_per_node = profile.gpus_per_node
        self.nics_per_node = profile.nics_per_node
        self.npus = npus
        self.simulated = simulated
        self.world = tuple(range(npus))
        self.classes = classes
        self.scheduler = FlowScheduler(engine, self._start_part if classes is not None else None)
        self._issued: dict[int, int] = {}  # rank -> collectives, sends and receives it has issued (orders completions)
        self._later: dict[str, Any] = {"offset": ()} if classes is not None else {}  # latencies touch no rank
        self._resource_ids: dict[tuple[Any, ...], int] = {}
        self._comms: dict[int, _Comm] = {}
        self._pending: dict[tuple[int, int], _Call] = {}
        self._seq: dict[tuple[int, int], int] = {}  # (rank, communicator id) -> calls issued so far
        self._pairs: dict[tuple[int, int], _Comm] = {}
        self._blocks: dict[tuple[int, int, str, int], int] = {}
        self.collectives = 0
        self.messages = 0

    # --- resources -----------------------------------------------------------------------------------
    def _resource(self, key: tuple[Any, ...]) -> int:
        rid = self._resource_ids.get(key)
        if rid is None:
            rid = self._resource_ids[key] = len(self._resource_ids)
        return rid

    def resources(self, members: Sequence[int]) -> tuple[int, ...]:
        """Scale-up ports of members sharing a node with another member; NICs crossed when it spans nodes."""
        return tuple(self._resource(k) for k in self._resource_keys(members))

    def _resource_keys(self, members: Sequence[int]) -> list[tuple[Any, ...]]:
        gpn, nics = self.gpus_per_node, self.nics_per_node
        by_node: dict[int, list[int]] = {}
        for r in members:
            by_node.setdefault(r // gpn, []).append(r)
        keys: list[tuple[Any, ...]] = []
        for ranks in by_node.values():
            if len(ranks) > 1:
                keys.extend(("up", r) for r in ranks)
        if len(by_node) > 1:
            keys.extend(dict.fromkeys(("nic", *divmod(self.profile.nic_of(r), nics)) for r in members))
        return keys

    def _new_comm(self, members: tuple[int, ...], expected: int, orbit: int = 1) -> _Comm:
        """A communicator over ``members``; in a run by classes its resources are classes, each weighing the
        resources it holds of the communicator's times ``orbit`` (the images of one job)."""
        distinct = tuple(dict.fromkeys(members))
        communicator = Communicator.of(distinct, self.gpus_per_node)
        classes = self.classes
        if classes is None:
            return _Comm(members, communicator, self.resources(distinct), expected)
        counts: dict[tuple[Any, ...], int] = {}
        for key in self._resource_keys(distinct):
            found, size = classes.resource(key)
            counts[found] = counts.get(found, 0) + 1
            self.scheduler.orbits[self._resource(found)] = size
        return _Comm(members, communicator, tuple(self._resource(k) for k in counts), expected,
                     tuple(n * orbit for n in counts.values()))

    def _comm(self, comm_id: int, members: tuple[int, ...]) -> _Comm:
        comm = self._comms.get(comm_id)
        if comm is not None and (comm.members is members or comm.members == members):
            return comm
        comm = self._new_comm(members, sum(1 for m in dict.fromkeys(members) if m in self.simulated))
        if comm_id not in self._comms:
            self._comms[comm_id] = comm
        return comm

    def _timing(self, comm: _Comm, kind: str, size: int, exchange: str = "") -> tuple[Plan, int, int]:
        """(plan, latency ns, transfer ns at full rate); alone, the two add up to plan.time_ns. ``exchange``: the
        expert-parallel exchange library running the call instead of NCCL (simulator/collectives/exchange.py)."""
        key = (kind, size, exchange)
        found = comm.timings.get(key)
        if found is None:
            forced = self.algorithm
            if forced is not None and not self.model.runs(forced, kind, size, comm.communicator):
                c = comm.communicator
                if (kind, c.ranks, c.nodes) not in self._unforced:
                    self._unforced.add((kind, c.ranks, c.nodes))
                    self.warn(f"NCCL algorithm {forced} cannot run {kind} on {c.ranks} GPU(s) over {c.nodes} "
                              f"node(s) with profile {self.profile.name} (at {size} bytes); the library's choice ran")
                forced = None
            plan = self.model.plan(kind, size, comm.communicator, forced, exchange)
            latency = round(plan.chosen.latency_us * 1e3)
            found = (plan, latency, max(0, plan.time_ns - latency))
            if len(comm.timings) < 100_000:
                comm.timings[key] = found
        return found

    # --- collectives -------------------------------------------------------------------------------------
    def issue(self, rank: int, comm_id: int, members: tuple[int, ...], kind: str, size_bytes: int, fn: Done,
              arg: Any, where: Callable[[], str], exchange: str = "") -> None:
        """``rank`` issues a collective of ``size_bytes`` (nccl-tests size) on communicator ``comm_id``;
        ``fn(arg, chosen candidate)`` runs when it completes on every member. ``exchange``: the exchange library
        that runs it instead of NCCL (its trace node's comm_library)."""
        key = (rank, comm_id)
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        classes = self.classes
        found = classes.comm(rank, comm_id, members) if classes is not None else None
        call_key = (comm_id, seq) if found is None else (found.key, seq)
        call = self._pending.get(call_key)
        if call is None:
            if found is None:
                comm = self._comm(comm_id, members)
            else:  # the class's canonical communicator, its calls made of every pair's
                comm = self._comms.get(-1 - found.key)  # type: ignore[assignment]
                if comm is None:
                    comm = self._comms[-1 - found.key] = self._new_comm(found.members, found.pairs, found.orbit)
            call = self._pending[call_key] = _Call(kind, size_bytes, comm, members, seq, (rank, where))
        elif call.kind != kind or call.size != size_bytes or not (found is not None or call.members is members
                                                                  or call.members == members):
            raise InputError(self._mismatch(call, rank, comm_id, members, kind, size_bytes))
        counter = self._issued.get(rank, 0)
        self._issued[rank] = counter + 1
        call.arrived.append((rank, counter, fn, arg))
        call.ranks.append(rank)
        if len(call.arrived) >= call.comm.expected:
            del self._pending[call_key]
            self.collectives += 1
            plan, latency, transfer = self._timing(call.comm, kind, size_bytes, exchange)
            done: list[Completion] = [(r, c, f, (a, plan.chosen), None) for r, c, f, a in call.arrived]
            self.engine.call_later(latency, self._begin, (transfer, call.comm, done), **self._later)

    def blocks(self, comm_id: int, members: tuple[int, ...], kind: str, size_bytes: int) -> int:
        """Thread blocks (one SM each: the chosen candidate's channels) of the collective ``issue`` would run."""
        key = (comm_id, len(members), kind, size_bytes)
        found = self._blocks.get(key)
        if found is None:
            communicator = Communicator.of(tuple(dict.fromkeys(members)), self.gpus_per_node)
            forced = self.algorithm
            if forced is not None and not self.model.runs(forced, kind, size_bytes, communicator):
                forced = None
            found = self._blocks[key] = self.model.plan(kind, size_bytes, communicator, forced).chosen.channels
        return found

    def _mismatch(self, call: _Call, rank: int, comm_id: int, members: tuple[int, ...], kind: str, size: int
                  ) -> str:
        other_rank, other_where = call.first
        comm = f"communicator group {comm_id}" if comm_id else "the world communicator (all ranks)"

        def what(k: str, s: int, m: tuple[int, ...]) -> str:
            text = f"{k} of {s} B" + (" (gathered output)" if k == ALL_GATHER else "")
            return text if m == call.members or m is call.members else text + f" over ranks {_short(m)}"

        return (f"{what(kind, size, members)} is rank {rank}'s collective #{call.seq} on {comm}, but rank "
                f"{other_rank} ({other_where()}) issued {what(call.kind, call.size, call.members)} as its #{call.seq}: "
                "NCCL collectives synchronise their communicator, so every member must issue the same collectives "
                "(kind and size) in the same order")

    def _begin(self, arg: tuple[int, _Comm, list[Completion]]) -> None:
        work, comm, done = arg
        self.scheduler.start(work, comm.resources, done, comm.weights)

    def waiting_for(self, rank: int) -> list[str]:
        """The collectives ``rank`` has issued that still wait for other members (deadlock reports)."""
        out = []
        for (comm_id, _), call in self._pending.items():
            if rank in call.ranks:
                missing = [m for m in call.comm.members if m not in call.ranks and m in self.simulated]
                out.append(f"{call.kind} #{call.seq} on communicator {comm_id}, which rank(s) {_short(missing)} "
                           "have not issued")
        return out

    # --- sends and receives (the NetworkBackend protocol) --------------------------------------------------
    def _pair(self, src: int, dst: int, size_bytes: int) -> tuple[_Comm, int, int]:
        """The two-member communicator of a send, its latency and transfer (ns)."""
        pair = (src, dst)
        comm = self._pairs.get(pair)
        if comm is None:
            orbit = self.classes.quotient.orbit_size if self.classes is not None else 1
            comm = self._pairs[pair] = self._new_comm(pair, 2, orbit)
        self.messages += 1
        _, latency, transfer = self._timing(comm, SEND_RECV, size_bytes)
        return comm, latency, transfer

    def _count(self, rank: int) -> int:
        counter = self._issued.get(rank, 0)
        self._issued[rank] = counter + 1
        return counter

    def transmit(self, src: int, dst: int, size_bytes: int, on_delivered: Callback, arg: Any) -> None:
        comm, latency, transfer = self._pair(src, dst, size_bytes)
        counter = self._count(src)
        # the delivery, in its own frame in a run by classes (simulator/quotient_run.py)
        context = (self.engine.insert_offset, src) if self.classes is not None else None
        self.engine.call_later(latency, self._begin, (transfer, comm, [(src, counter, on_delivered, (arg,), context)]),
                               **self._later)

    def post_order(self, rank: int) -> int:
        """A receive posted by ``rank``: its place in the rank's issue order (Messaging.recv)."""
        return self._count(rank)

    def transmit_halves(self, src: int, dst: int, size_bytes: int, messaging: Any, entry: Any,
                        contexts: tuple[Any, Any] | None = None, receiver: int | None = None) -> None:
        """A send, completed as two halves that each run among their own rank's same-time completions in that
        rank's issue order: the sender's (its send's place) and the receiver's (its receive's place, known when
        the data arrives: Match.receive_order). So a rank sees its own sends and receives that end at one
        instant in the order it issued them, whatever the rank numbers of its peers: in a ring of sends every
        rank does alike, as real ranks of one class must (simulator/quotient_run.py). ``contexts``: in a run by
        classes, each half's (offset, root); ``receiver``: the rank whose completions the receiving half joins
        (the receiver's representative there)."""
        comm, latency, transfer = self._pair(src, dst, size_bytes)
        counter = self._count(src)
        sender_context, receiver_context = contexts if contexts is not None else (None, None)
        halves: list[Completion] = []
        if entry.on_sent is not None:
            halves.append((src, counter, messaging.sent_half, (entry,), sender_context))
        halves.append((dst if receiver is None else receiver, entry.receive_order, messaging.received_half, (entry,),
                       receiver_context))
        self.engine.call_later(latency, self._begin, (transfer, comm, halves), **self._later)

    def _start_part(self, rank: int, context: tuple[Any, int] | None, tag: Any) -> None:
        """A completion's part of a shared event starts its events afresh (a run by classes): on behalf of its
        rank's own offset, or of the context's offset with the context's root."""
        if context is None:
            self.engine.start_context(rank, None, tag)
        else:
            self.engine.start_context(context[1], context[0], tag)

    def summary(self) -> dict[str, Any]:
        p = self.profile
        return {"name": p.name, "gpu": p.gpu, "gpus_per_node": p.gpus_per_node, "library": p.library,
                "library_version": p.library_version, "arch": p.arch, "path": p.path}


def _short(members: Sequence[int], limit: int = 8) -> str:
    """Ranks in a line: "0, 1, 2" or "0, 1, ..., 7, ... (1024 ranks)"."""
    text = ", ".join(map(str, members[:limit]))
    return text if len(members) <= limit else f"{text}, ... ({len(members)} ranks)"
