"""Collectives and sends/receives timed by the NCCL/RCCL-like model inside the event-driven run
(``--collective-model nccl``).

One ``NcclRun`` per simulation, shared by every rank:

- **Rendezvous.** An NCCL collective synchronises its communicator: it starts when every member has issued
  it. Calls match by (communicator id, the rank's sequence number of collectives on that communicator);
  members that disagree on the kind, size or members of a call are an InputError naming both ranks and nodes.
- **Timing.** A started collective takes the chosen candidate's ``latency_us`` (a fixed delay, unaffected
  by other traffic), then a transfer job of ``transfer_us`` at full rate (simulator/collectives/nccl.py).
- **Sharing.** Transfer jobs share resources in a fluid processor-sharing scheduler (``FlowScheduler``): each
  member GPU's scale-up port ``("up", rank)`` when the communicator has 2+ members on that node, and every
  NIC it crosses ``("nic", node, nic)`` when it spans nodes. A job progresses at 1 / (the largest number of
  active jobs on any of its resources); rates are recomputed at every start and finish, event times are
  whole nanoseconds. Two concurrent all-reduces on the same GPUs each take about twice as long; groups on
  disjoint GPUs do not slow each other.
- **Sends/receives** are timed as ``send_recv`` plans on the same scheduler (resources: both GPUs' scale-up
  ports on one node, else their NICs). ``NcclRun`` is the network backend of the run's Messaging, so sends
  and receives still match there (network/messaging.py).

With one representative rank (the symmetric engine), a collective starts when the *simulated* members have
issued it: every rank does the same at the same time, so concurrent collectives still share resources as
they would with every rank simulated.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Sequence
from typing import Any

from simulator.collectives.algorithms import ALL_GATHER
from simulator.collectives.hardware import HardwareProfile
from simulator.collectives.nccl import SEND_RECV, Candidate, CollectiveModel, Communicator, Plan
from workload.errors import InputError

Callback = Callable[[Any], None]
Done = Callable[[Any, Candidate], None]  # fn(arg, the chosen candidate) when a collective completes


class _Job:
    __slots__ = ("arg", "finish", "fn", "id", "k", "remaining", "resources", "updated", "work")

    def __init__(self, job_id: int, work: int, resources: tuple[int, ...], fn: Callback, arg: Any, now: int) -> None:
        self.id = job_id
        self.work = work
        self.remaining = float(work)  # ns of transfer left at full rate
        self.resources = resources
        self.fn = fn
        self.arg = arg
        self.k = 0  # the job runs at rate 1 / k (k: most active jobs on any of its resources)
        self.updated = now
        self.finish = -1


class FlowScheduler:
    """Fluid processor sharing of resources by transfer jobs, with integer-ns completion events.

    A job's rate is 1 / max over its resources of the number of active jobs using the resource. Only jobs
    sharing a resource with a job that starts or finishes change rate, so only they are recomputed. Jobs due
    at the same time finish together, in job-id order, before any callback runs.
    """

    __slots__ = ("_heap", "_next_id", "_wakes", "active", "call_later", "completed_work", "engine", "max_active",
                 "started_work", "users")

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.call_later = engine.call_later
        self.users: dict[int, dict[int, _Job]] = {}  # resource -> active jobs using it, by id
        self.active: dict[int, _Job] = {}
        self._heap: list[tuple[int, int]] = []  # (finish ns, job id); stale entries are skipped
        self._wakes: set[int] = set()  # times an engine event is already due for
        self._next_id = 0
        self.started_work = 0  # ns of full-rate transfer started and completed (conservation checks)
        self.completed_work = 0
        self.max_active = 0

    def start(self, work_ns: int, resources: tuple[int, ...], fn: Callback, arg: Any) -> None:
        """Run a transfer of ``work_ns`` (at full rate) over ``resources``; ``fn(arg)`` when it is done."""
        now = self.engine.now
        if work_ns <= 0 or not resources:  # nothing to share: done after the transfer alone
            self.call_later(max(0, work_ns), fn, arg)
            return
        job = _Job(self._next_id, work_ns, resources, fn, arg, now)
        self._next_id += 1
        self.started_work += work_ns
        affected: dict[int, _Job] = {}
        users = self.users
        for r in resources:
            on = users.get(r)
            if on is None:
                on = users[r] = {}
            elif on:
                affected.update(on)
            on[job.id] = job
        self.active[job.id] = job
        if len(self.active) > self.max_active:
            self.max_active = len(self.active)
        if affected:
            self._rerate(affected.values(), now)
        self._rerate((job,), now)

    def _rerate(self, jobs: Collection[_Job], now: int) -> None:
        users = self.users
        for j in jobs:
            k = max(len(users[r]) for r in j.resources)
            if k == j.k:
                continue
            if j.k:
                j.remaining -= (now - j.updated) / j.k
            j.updated = now
            j.k = k
            finish = now + max(0, round(j.remaining * k))
            j.finish = finish
            heapq.heappush(self._heap, (finish, j.id))
            if finish not in self._wakes:
                self._wakes.add(finish)
                self.call_later(finish - now, self._wake, finish)

    def _wake(self, t: int) -> None:
        self._wakes.discard(t)
        heap, active = self._heap, self.active
        due: list[_Job] = []
        while heap and heap[0][0] <= t:
            finish, jid = heapq.heappop(heap)
            j = active.get(jid)
            if j is not None and j.finish == finish:
                del active[jid]
                due.append(j)
        if not due:
            return
        users = self.users
        affected: dict[int, _Job] = {}
        for j in due:
            self.completed_work += j.work
            for r in j.resources:
                on = users[r]
                del on[j.id]
                if on:
                    affected.update(on)
                else:
                    del users[r]
        for j in due:
            affected.pop(j.id, None)
        if affected:
            self._rerate(affected.values(), t)
        for j in due:
            j.fn(j.arg)


class _Comm:
    """A communicator as the model sees it: members, layout, shared resources, plans by (kind, size)."""

    __slots__ = ("communicator", "expected", "members", "resources", "timings")

    def __init__(self, members: tuple[int, ...], communicator: Communicator, resources: tuple[int, ...],
                 expected: int) -> None:
        self.members = members
        self.communicator = communicator
        self.resources = resources
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
        self.arrived: list[tuple[Done, Any]] = []
        self.ranks: list[int] = []


class NcclRun:
    """The run's NCCL-like collective layer and point-to-point network (see the module docstring)."""

    name = "nccl"  # as a network backend

    def __init__(self, engine: Any, profile: HardwareProfile, npus: int, simulated: Collection[int],
                 algorithm: str | None = None, warn: Callable[[str], None] | None = None) -> None:
        self.engine = engine
        self.profile = profile
        self.model = CollectiveModel(profile)
        self.algorithm = algorithm  # forced (NCCL_ALGO) wherever it can run; the library picks elsewhere
        self.warn = warn or (lambda message: None)
        self._unforced: set[tuple[str, int, int]] = set()
        self.gpus_per_node = profile.gpus_per_node
        self.nics_per_node = profile.scale_out.nics_per_node if profile.scale_out is not None else 1
        self.npus = npus
        self.simulated = simulated
        self.world = tuple(range(npus))
        self.scheduler = FlowScheduler(engine)
        self._resource_ids: dict[tuple[Any, ...], int] = {}
        self._comms: dict[int, _Comm] = {}
        self._pending: dict[tuple[int, int], _Call] = {}
        self._seq: dict[tuple[int, int], int] = {}  # (rank, communicator id) -> calls issued so far
        self._pairs: dict[tuple[int, int], _Comm] = {}
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
        gpn, nics = self.gpus_per_node, self.nics_per_node
        by_node: dict[int, list[int]] = {}
        for r in members:
            by_node.setdefault(r // gpn, []).append(r)
        keys: list[tuple[Any, ...]] = []
        for ranks in by_node.values():
            if len(ranks) > 1:
                keys.extend(("up", r) for r in ranks)
        if len(by_node) > 1:
            keys.extend(dict.fromkeys(("nic", r // gpn, (r % gpn) * nics // gpn) for r in members))
        return tuple(self._resource(k) for k in dict.fromkeys(keys))

    def _comm(self, comm_id: int, members: tuple[int, ...]) -> _Comm:
        comm = self._comms.get(comm_id)
        if comm is not None and (comm.members is members or comm.members == members):
            return comm
        distinct = tuple(dict.fromkeys(members))
        expected = sum(1 for m in distinct if m in self.simulated)
        comm = _Comm(members, Communicator.of(distinct, self.gpus_per_node), self.resources(distinct), expected)
        if comm_id not in self._comms:
            self._comms[comm_id] = comm
        return comm

    def _timing(self, comm: _Comm, kind: str, size: int) -> tuple[Plan, int, int]:
        """(plan, latency ns, transfer ns at full rate); alone, the two add up to plan.time_ns."""
        key = (kind, size)
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
            plan = self.model.plan(kind, size, comm.communicator, forced)
            latency = round(plan.chosen.latency_us * 1e3)
            found = (plan, latency, max(0, plan.time_ns - latency))
            if len(comm.timings) < 100_000:
                comm.timings[key] = found
        return found

    # --- collectives -------------------------------------------------------------------------------------
    def issue(self, rank: int, comm_id: int, members: tuple[int, ...], kind: str, size_bytes: int, fn: Done,
              arg: Any, where: Callable[[], str]) -> None:
        """``rank`` issues a collective of ``size_bytes`` (nccl-tests size) on communicator ``comm_id``;
        ``fn(arg, chosen candidate)`` runs when it completes on every member."""
        key = (rank, comm_id)
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        call = self._pending.get((comm_id, seq))
        if call is None:
            comm = self._comm(comm_id, members)
            call = self._pending[(comm_id, seq)] = _Call(kind, size_bytes, comm, members, seq, (rank, where))
        elif call.kind != kind or call.size != size_bytes or not (call.members is members
                                                                  or call.members == members):
            raise InputError(self._mismatch(call, rank, comm_id, members, kind, size_bytes))
        call.arrived.append((fn, arg))
        call.ranks.append(rank)
        if len(call.arrived) >= call.comm.expected:
            del self._pending[(comm_id, seq)]
            self.collectives += 1
            plan, latency, transfer = self._timing(call.comm, kind, size_bytes)
            self.engine.call_later(latency, self._begin, (transfer, call.comm.resources, self._complete,
                                                           (call, plan.chosen)))

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

    @staticmethod
    def _complete(arg: tuple[_Call, Candidate]) -> None:
        call, chosen = arg
        for fn, a in call.arrived:
            fn(a, chosen)

    def _begin(self, arg: tuple[int, tuple[int, ...], Callback, Any]) -> None:
        work, resources, fn, fn_arg = arg
        self.scheduler.start(work, resources, fn, fn_arg)

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
    def transmit(self, src: int, dst: int, size_bytes: int, on_delivered: Callback, arg: Any) -> None:
        pair = (src, dst)
        comm = self._pairs.get(pair)
        if comm is None:
            members = (src, dst)
            comm = self._pairs[pair] = _Comm(members, Communicator.of(members, self.gpus_per_node),
                                             self.resources(members), 2)
        self.messages += 1
        _, latency, transfer = self._timing(comm, SEND_RECV, size_bytes)
        self.engine.call_later(latency, self._begin, (transfer, comm.resources, on_delivered, arg))

    def summary(self) -> dict[str, Any]:
        p = self.profile
        return {"name": p.name, "gpu": p.gpu, "gpus_per_node": p.gpus_per_node, "library": p.library,
                "library_version": p.library_version, "arch": p.arch, "path": p.path}


def _short(members: Sequence[int], limit: int = 8) -> str:
    """Ranks in a line: "0, 1, 2" or "0, 1, ..., 7, ... (1024 ranks)"."""
    text = ", ".join(map(str, members[:limit]))
    return text if len(members) <= limit else f"{text}, ... ({len(members)} ranks)"
