"""The event engine: simpy's event heap driven with plain callbacks, integer nanoseconds.

Events at the same time run in the order they were scheduled, and an event scheduled for the current
time runs after those already due, exactly like ASTRA-sim's network event queue. Each rank also keeps
ASTRA-sim's per-system event lists (``RankEvents``): all events a rank registers for one tick run
together, at the place in the global order where the first of them was registered. Reproducing that
two-level order is what makes same-time ties resolve as they do in ASTRA-sim.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

import simpy

Callback = Callable[[Any], None]


class Engine:
    """Global clock and event heap: a simpy Environment's clock and heap, ordered as simpy orders events (time,
    priority, insertion), each entry ``(time, priority, id, callback, argument)``, run by ``run_batch`` (no simpy
    event objects or processes: the hot path is one flat tuple, one heap push and one pop per event)."""

    __slots__ = ("_eid", "_queue", "current_id", "env", "events_processed")

    def __init__(self) -> None:
        self.env = simpy.Environment()
        self._queue = self.env._queue
        self._eid = self.env._eid
        self.events_processed = 0
        self.current_id = -1  # the id of the event running (-1: before the first)

    @property
    def now(self) -> int:
        return self.env._now  # type: ignore[no-any-return]

    def call_later(self, delay: int, fn: Callback, arg: Any = None) -> None:
        """Run ``fn(arg)`` ``delay`` ns from now (after every event already due at that time)."""
        # 1: simpy's NORMAL priority, as a Timeout's; the unique id decides ties, so callbacks are never compared
        heappush(self._queue, (self.env._now + delay, 1, next(self._eid), fn, arg))

    def call_first(self, delay: int, fn: Callback, arg: Any = None) -> None:
        """Run ``fn(arg)`` ``delay`` ns from now, before every event of that time scheduled with call_later
        (priority 0, as simpy's URGENT)."""
        heappush(self._queue, (self.env._now + delay, 0, next(self._eid), fn, arg))

    def scheduler(self) -> tuple[list[Any], Any]:
        """The heap and the id counter, for a hot path that pushes ``(now + delay, 1, next(ids), fn, arg)`` itself
        (what ``call_later`` does, without the call); an id drawn early and pushed later keeps the event's place
        among same-time events as if it had been pushed when drawn (``current_id`` tells whether it has passed)."""
        return self._queue, self._eid

    def run(self, until: int | None = None) -> None:
        """Run events until none is left (or the next is due at ``until`` or later)."""
        queue = self._queue
        while queue and (until is None or queue[0][0] < until):
            self.run_batch(1)
        if until is not None:
            self.env._now = max(self.env._now, until)

    def run_batch(self, limit: int) -> int:
        """Run up to ``limit`` events in time order; returns how many ran (fewer than ``limit``: none is left)."""
        queue, env = self._queue, self.env
        done = 0
        pop = heappop
        while queue and done < limit:
            env._now, _, self.current_id, fn, arg = pop(queue)
            fn(arg)
            done += 1
        return done

    def pending(self) -> bool:
        return bool(self._queue)


class RankEvents:
    """ASTRA-sim's per-system event lists: events a rank registers for the same tick run as one batch."""

    __slots__ = ("_call_as", "_eid", "_env", "_lists", "_own", "_push", "_queue", "_run", "engine")

    def __init__(self, engine: Engine, rank: int = 0) -> None:
        self.engine = engine
        self._env = engine.env
        self._queue = engine._queue
        self._eid = engine._eid
        self._push = heappush
        self._run = self._run_tick
        self._lists: dict[int, list[tuple[Callback, Any]]] = {}
        # a folded run's engine: the rank's own events (their offset), scheduled with call_as
        checked = isinstance(engine, CheckedEngine)
        self._own = engine.own(rank) if checked else None
        self._call_as = engine.call_as if checked else None  # type: ignore[attr-defined]

    def register(self, delay: int, fn: Callback, arg: Any = None) -> None:
        tick = self._env._now + delay
        batch = self._lists.get(tick)
        if batch is not None:
            batch.append((fn, arg))
        elif self._call_as is not None:
            self._lists[tick] = [(fn, arg)]
            self._call_as(delay, self._run, tick, self._own)
        else:  # Engine.call_later, inlined: this is once per event of most runs
            self._lists[tick] = [(fn, arg)]
            self._push(self._queue, (tick, 1, next(self._eid), self._run, tick))

    def _run_tick(self, tick: int) -> None:
        batch = self._lists[tick]
        for fn, arg in batch:  # events registered for this tick while it runs join the batch (and run in it)
            fn(arg)
        del self._lists[tick]


class CheckedEngine(Engine):
    """An Engine for representative-rank runs that notices when same-time ordering becomes ambiguous.

    A representative rank stands for every rank at once, and the messages it receives stand for other
    ranks' sends ("mirrored", tagged with the sender's offset). Two events due at the same time are ordered
    the same way on every real rank when they were scheduled at different times, or by the same event for
    the same rank. Otherwise their order depends on how the real ranks interleave, which may differ from
    rank to rank; the engine then sets ``ambiguous`` and the caller falls back to simulating every rank.
    """

    __slots__ = ("_current", "_dispatch", "_next_id", "_seen", "_seen_tick", "ambiguous", "insert_offset")

    def __init__(self) -> None:
        super().__init__()
        self.ambiguous = False
        self.insert_offset: Any = 0  # whose behalf new events are scheduled on (0: the representative's own)
        self._current = 0
        self._next_id = 0
        self._seen: dict[int, tuple[int, Any]] = {}
        self._seen_tick = -1
        self._dispatch = self._checked_dispatch  # bound once: every event goes through it

    def own(self, rank: int) -> Any:
        """The offset of a rank's own events (the representative's: 0)."""
        return 0

    def call_as(self, delay: int, fn: Callback, arg: Any, offset: Any) -> None:
        """call_later on behalf of ``offset`` (a rank's own events: RankEvents)."""
        self.call_later(delay, fn, arg, offset)

    def call_later(self, delay: int, fn: Callback, arg: Any = None, offset: Any = None) -> None:
        self._next_id += 1
        off = self.insert_offset if offset is None else offset
        now = self.env._now
        payload = (fn, arg, now, self._current, off, self._next_id)
        heappush(self._queue, (now + delay, 1, next(self._eid), self._dispatch, payload))

    def call_first(self, delay: int, fn: Callback, arg: Any = None) -> None:
        self._next_id += 1
        now = self.env._now
        payload = (fn, arg, now, self._current, self.insert_offset, self._next_id)
        heappush(self._queue, (now + delay, 0, next(self._eid), self._checked_dispatch, payload))

    def _checked_dispatch(self, payload: tuple[Any, ...]) -> None:
        fn, arg, inserted, parent, offset, eid = payload
        now = self.env._now
        if now != self._seen_tick:
            self._seen_tick = now
            self._seen = {}
        origin = (parent, offset)
        previous = self._seen.setdefault(inserted, origin)
        if previous != origin:
            self.ambiguous = True
        self._current = eid
        self.insert_offset = offset  # what this event schedules is on the same behalf, unless said otherwise
        fn(arg)
