"""One order of chunk phases per queue, shared by the ranks that run them together.

A queue runs at most ``active-chunks-per-dimension`` chunk-streams at once and starts waiting ones in
scheduling-policy order as they arrive. When every rank of a ring sees the same timing (ASTRA-sim's
analytical networks, identical traces) they all start the same chunk at the same moment. When timing
differs between ranks (a fabric whose paths differ in length, the packet backend, per-rank compute), one
rank may start chunk 1's all-gather while its neighbour starts chunk 3's reduce-scatter; each then waits
for a message the other will only send after its own chunk is done, and the run deadlocks although every
rank issued the same collectives. Real collective libraries avoid this by running chunks in one agreed
order on every rank, and so do we: the first rank of a ring to start a phase on a queue decides which
chunk takes that place in the order; the others start the same chunk at that place, waiting for it if it
has not reached them yet. Where all ranks agree anyway (every symmetric run), nothing changes.

ASTRA-sim 2.x does not agree on an order: its ranks diverge and deadlock. To keep its numbers wherever it
prints any, runs on its own networks only *observe* the order (``enforce=False``: every start is allowed,
a disagreement is noted in ``diverged``); the simulation enforces the order only if such a run deadlocks
after ranks disagreed. Fabrics, the packet backend and corrected semantics enforce it from the start.
"""

from __future__ import annotations


class ChunkOrders:
    """The agreed start order of every (communicator, queue) of a run, with each rank's place in it.

    Positions are decided by the first rank to reach them and forgotten once every member has passed,
    so memory holds only the spread between the fastest and the slowest member.
    """

    __slots__ = ("_passed", "_sequences", "diverged", "enforce")

    def __init__(self, enforce: bool = True) -> None:
        self.enforce = enforce
        self.diverged = False  # some rank started a chunk phase other than the one due at its place
        self._sequences: dict[tuple[int, int], dict[int, tuple[int, int]]] = {}  # key -> place -> chunk phase
        self._passed: dict[tuple[int, int, int], int] = {}  # (key, place) -> members that started it

    def admit(self, places: dict[tuple[int, int], int], key: tuple[int, int], members: int, chunk: tuple[int, int]
              ) -> bool:
        """May a rank at ``places[key]`` in the order of ``key`` start ``chunk`` (stream id, phase) now?
        True takes that place (deciding it if no rank has); False: another chunk is due there first (when
        only observing: True, and the disagreement is noted)."""
        place = places.get(key, 0)
        sequence = self._sequences.get(key)
        if sequence is None:
            sequence = self._sequences[key] = {}
        due = sequence.get(place)
        if due is None:
            if members > 1:
                sequence[place] = chunk
                self._passed[(*key, place)] = 1
        elif due != chunk:
            if self.enforce:
                return False
            self.diverged = True
            return True
        else:
            passed = self._passed[(*key, place)] + 1
            if passed >= members:
                del sequence[place], self._passed[(*key, place)]
            else:
                self._passed[(*key, place)] = passed
        places[key] = place + 1
        return True

    def due(self, places: dict[tuple[int, int], int], key: tuple[int, int]) -> tuple[int, int] | None:
        """The chunk phase a rank at ``places[key]`` must start next, if another rank has decided it."""
        sequence = self._sequences.get(key)
        return None if sequence is None else sequence.get(places.get(key, 0))
