"""The event engine: simpy's event heap driven with plain callbacks, integer nanoseconds.

Events at the same time run in the order they were scheduled, and an event scheduled for the current
time runs after those already due, exactly like ASTRA-sim's network event queue. Each rank also keeps
ASTRA-sim's per-system event lists (``RankEvents``): all events a rank registers for one tick run
together, at the place in the global order where the first of them was registered. Reproducing that
two-level order is what makes same-time ties resolve as they do in ASTRA-sim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import simpy

Callback = Callable[[Any], None]


def _dispatch(event: simpy.Event) -> None:
    fn, arg = event._value
    fn(arg)


class Engine:
    """Global clock and event heap (a simpy Environment with one callback per event, no processes)."""

    __slots__ = ("_timeout", "env", "events_processed")

    def __init__(self) -> None:
        self.env = simpy.Environment()
        self._timeout = self.env.timeout
        self.events_processed = 0

    @property
    def now(self) -> int:
        return self.env.now  # type: ignore[no-any-return]

    def call_later(self, delay: int, fn: Callback, arg: Any = None) -> None:
        """Run ``fn(arg)`` ``delay`` ns from now (after every event already due at that time)."""
        self._timeout(delay, (fn, arg)).callbacks.append(_dispatch)

    def run(self, until: int | None = None) -> None:
        self.env.run(until=until)

    def pending(self) -> bool:
        return self.env.peek() != float("inf")


class RankEvents:
    """ASTRA-sim's per-system event lists: events a rank registers for the same tick run as one batch."""

    __slots__ = ("_lists", "engine")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lists: dict[int, list[tuple[Callback, Any]]] = {}

    def register(self, delay: int, fn: Callback, arg: Any = None) -> None:
        tick = self.engine.now + delay
        batch = self._lists.get(tick)
        if batch is None:
            self._lists[tick] = [(fn, arg)]
            self.engine.call_later(delay, self._run_tick, tick)
        else:
            batch.append((fn, arg))

    def _run_tick(self, tick: int) -> None:
        batch = self._lists[tick]
        i = 0
        while i < len(batch):  # events registered for this tick while it runs join the batch
            fn, arg = batch[i]
            fn(arg)
            i += 1
        del self._lists[tick]
