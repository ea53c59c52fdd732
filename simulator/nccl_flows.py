"""Fluid processor sharing of GPU ports and NICs by the NCCL model's transfers (simulator/nccl_run.py).

A job's rate is 1 / (the largest number of active jobs on any of its resources); only jobs sharing a resource
with a job that starts or finishes change rate, so only they are recomputed, and event times are whole
nanoseconds. A job's finish time depends only on when jobs start and finish, never on the order of jobs that
start or finish at the same time.

**Completions.** Jobs due at the same time finish together in one event that runs before every other event of
that time (priority 0), and their callbacks run in the order of (rank, that rank's issue counter): the rank a
completion belongs to (every member of a collective; the sender of a send for its sending half, the receiver for
its receiving half) and where the operation it completes stands in that rank's issue order (collectives, sends
and posted receives). A rank thus sees its own completions of one instant in the order it issued them, whatever
its peers' rank numbers, as a GPU finishes the work of its streams in the order it was enqueued: every rank
that does the same thing sees the same order (in a ring of sends the lowest rank is not the odd one out), and a
run with one rank per class of equivalent ranks (simulator/quotient_run.py) sees the order of the full run's
ranks. Each callback starts its rank's events afresh (``contexts``).

**Classes.** In such a run a job stands for its images under the shifts, and a resource for its class: a job
weighs ``how many resources of the class it uses x the size of its orbit``, and a class is used by
``its summed weights / the size of its orbit`` jobs on each of its resources (1 and 1 in a full run).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Sequence
from typing import Any

# a job's completion: (rank, that rank's issue counter or what tells it when the job completes, fn, its arguments,
# the context its events run in)
Completion = tuple[int, int | Callable[[], int], Callable[..., None], tuple[Any, ...], Any]


class _Job:
    __slots__ = ("callbacks", "finish", "id", "k", "remaining", "resources", "updated", "weights", "work")

    def __init__(self, job_id: int, work: int, resources: tuple[int, ...], weights: tuple[int, ...],
                 callbacks: list[Completion], now: int) -> None:
        self.id = job_id
        self.work = work
        self.remaining = float(work)  # ns of transfer left at full rate
        self.resources = resources
        self.weights = weights
        self.callbacks = callbacks
        self.k = 0  # the job runs at rate 1 / k (k: most active jobs on any of its resources)
        self.updated = now
        self.finish = -1


class FlowScheduler:
    """Transfer jobs sharing resources (see the module docstring)."""

    __slots__ = ("_heap", "_last", "_next_id", "_serial", "_wakes", "active", "completed_work", "contexts",
                 "engine", "load", "orbits", "started_work", "users")

    def __init__(self, engine: Any, contexts: Callable[[int, Any, Any], None] | None = None) -> None:
        self.engine = engine
        self.contexts = contexts  # contexts(rank, context, tag): a callback's events start afresh (quotient runs)
        self.users: dict[int, dict[int, _Job]] = {}  # resource -> active jobs using it, by id
        self.load: dict[int, int] = {}  # resource -> the summed weights of its jobs
        self.orbits: dict[int, int] = {}  # resource -> the size of its class (absent: 1)
        self.active: dict[int, _Job] = {}
        self._heap: list[tuple[int, int]] = []  # (finish ns, job id); stale entries are skipped
        self._wakes: set[int] = set()  # times a completion event is already due for
        self._next_id = 0
        self._last = -1  # the time of the last completion event, and how many ran before it at that time
        self._serial = 0
        self.started_work = 0  # ns of full-rate transfer started and completed (conservation checks)
        self.completed_work = 0

    def start(self, work_ns: int, resources: tuple[int, ...], callbacks: list[Completion],
              weights: Sequence[int] | None = None) -> None:
        """Run a transfer of ``work_ns`` (at full rate) over ``resources``; its ``callbacks`` when it is done."""
        now = self.engine.now
        job = _Job(self._next_id, work_ns, resources, tuple(weights) if weights else (1,) * len(resources),
                   callbacks, now)
        self._next_id += 1
        self.active[job.id] = job
        if work_ns <= 0 or not resources:  # nothing to share: done after the transfer alone
            job.resources, job.weights = (), ()  # holds no resource, so its completion releases none
            self._due(job, now + max(0, work_ns), now)
            return
        self.started_work += work_ns
        affected: dict[int, _Job] = {}
        users, load = self.users, self.load
        for r, w in zip(resources, job.weights, strict=True):
            on = users.get(r)
            if on is None:
                on = users[r] = {}
            elif on:
                affected.update(on)
            on[job.id] = job
            load[r] = load.get(r, 0) + w
        if affected:
            self._rerate(affected.values(), now)
        self._rerate((job,), now)

    def _count(self, r: int) -> int:
        orbit = self.orbits.get(r, 1)
        count, rest = divmod(self.load[r], orbit)
        if rest:
            raise AssertionError(f"resource {r}: weights {self.load[r]} do not fill its {orbit} instances")
        return count

    def _due(self, job: _Job, finish: int, now: int) -> None:
        job.finish = finish
        heapq.heappush(self._heap, (finish, job.id))
        if finish not in self._wakes:
            self._wakes.add(finish)
            self.engine.call_first(finish - now, self._wake, finish)

    def _rerate(self, jobs: Collection[_Job], now: int) -> None:
        for j in jobs:
            k = max(self._count(r) for r in j.resources)
            if k == j.k:
                continue
            if j.k:
                j.remaining -= (now - j.updated) / j.k
            j.updated = now
            j.k = k
            self._due(j, now + max(0, round(j.remaining * k)), now)

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
        users, load = self.users, self.load
        affected: dict[int, _Job] = {}
        for j in due:
            self.completed_work += max(0, j.work) if j.resources else 0
            for r, w in zip(j.resources, j.weights, strict=True):
                on = users[r]
                del on[j.id]
                load[r] -= w
                if on:
                    affected.update(on)
                else:
                    del users[r]
                    del load[r]
        for j in due:
            affected.pop(j.id, None)
        if affected:
            self._rerate(affected.values(), t)
        done = sorted((c for j in due for c in j.callbacks), key=_order)
        contexts = self.contexts
        if contexts is not None:
            # a second completion event at one time (a job whose rate change left it due now) runs after the
            # first in every image: its parts' chain says so (simulator/quotient_run.py)
            self._serial = self._serial + 1 if t == self._last else 0
            self._last = t
            tag = t if not self._serial else (t, self._serial)
        for rank, _, fn, args, context in done:
            if contexts is not None:
                contexts(rank, context, tag)
            fn(*args)


def _order(c: Completion) -> tuple[int, int]:
    """(rank, its issue counter): a receiving half's counter is known only when the data arrives."""
    counter = c[1]
    return c[0], counter if counter.__class__ is int else counter()  # type: ignore[operator]
