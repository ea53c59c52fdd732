"""Would ASTRA-sim 2.x pair this collective over every rank? A check beside the run, not a change to it.

A collective's chunk-streams carry ids that pair them across ranks (they are its messages' tags). Both
simulators number a collective on a communicator group by the group's own count. For a collective over every
rank that names no group, we number by the rank's count of such collectives alone, so the ranks pair them in
issue order; ASTRA-sim 2.x numbers it by the rank's count of *every* chunk-stream it started before, group
collectives included. Where ranks ran different group collectives first (pipeline stages do), ASTRA-sim's ranks
give the same collective different ids: it waits forever, or pairs other collectives. The results here keep
the issue-order pairing ("does the sensible thing otherwise", docs/semantics.md); this module notices where
ASTRA-sim would differ and warns once per simulation, naming the collective on two ranks.

Each rank's system layer counts both ways (``RankSystem.stream_counter`` and ``all_streams``); the check costs
one dictionary look-up per collective over every rank. Folded runs compare their representatives: the ranks of
a class issue images of the same collectives, so they count alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class _Issuer(Protocol):
    rank: int

    def _where(self, i: int) -> str: ...


class StreamNumbers:
    """The first rank's ASTRA-sim stream id of every collective over every rank, keyed by our pairing id."""

    __slots__ = ("_first", "_warn", "warned")

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self.warned = False  # once per simulation, whatever runs it takes (folded, then every rank)
        self._first: dict[int, tuple[int, _Issuer, int]] = {}

    def new_run(self) -> None:
        self._first = {}

    def check(self, ours: int, theirs: int, issuer: _Issuer, node: int) -> None:
        """A collective over every rank whose first chunk-stream has id ``ours`` here and ``theirs`` in ASTRA-sim
        was issued by ``issuer`` as its node index ``node``."""
        seen = self._first.get(ours)
        if seen is None:
            self._first[ours] = (theirs, issuer, node)
            return
        if seen[0] == theirs or self.warned:
            return
        self.warned = True
        other, other_node = seen[1], seen[2]
        self._warn(f"ASTRA-sim 2.x would not pair the collective over every rank at {other._where(other_node)} on "
                   f"rank {other.rank} with {issuer._where(node)} on rank {issuer.rank}: it numbers such a "
                   "collective by every chunk-stream the rank started before, group collectives included "
                   f"({seen[0]:,} there, {theirs:,} here), so it would wait forever or pair other collectives; "
                   "they are paired in issue order here. To run the traces in ASTRA-sim, give such collectives a "
                   "communicator group of every rank (trace generate llm --groups-file does)")
