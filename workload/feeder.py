"""The dependency-tracking feeder (Chakra's ETFeeder role) for one rank.

A node becomes issuable once every parent (data or control dependency) has finished. Issuable nodes
wait in one min-heap per *lane* (the caller's resource classes, e.g. CPU / GPU compute / GPU comm), so
the lowest id goes first within a lane. Finishing a node touches each of its child edges once.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

from workload.graph import TraceGraph
from workload.validate import Dependencies


class _Structure:
    """Plain-list copies of a graph's dependency structure, shared by every feeder of that graph."""

    __slots__ = ("child_ptr", "children", "num_parents", "roots")

    def __init__(self, deps: Dependencies) -> None:
        self.child_ptr: list[int] = deps.child_ptr.tolist()
        self.children: list[int] = deps.children.tolist()
        self.num_parents: list[int] = deps.num_parents.tolist()
        self.roots: list[int] = [i for i, k in enumerate(self.num_parents) if k == 0]


def _structure(graph: TraceGraph, deps: Dependencies) -> _Structure:
    key = f"feeder:{id(deps)}"
    s = graph.cache.get(key)
    if s is None:
        s = graph.cache[key] = _Structure(deps)
    return s


class Feeder:
    """Issuable-node tracking over node indices (ascending id order) of one trace.

    ``lanes[i]`` puts node i in a lane (0 when no lanes are given). ``take`` removes a node from the
    issuable set, ``finish`` reports it done and makes its children issuable when they have no other
    unfinished parent. With ``defer=True`` those children are held back until ``release_deferred``, which
    lets a caller issue from a snapshot of the issuable set.
    """

    __slots__ = (
        "_child_ptr",
        "_children",
        "_deferred",
        "_heaps",
        "_lane",
        "_remaining",
        "finished",
        "num_nodes",
        "taken",
    )

    def __init__(self, graph: TraceGraph, deps: Dependencies, lanes: Sequence[int] | None = None,
                 num_lanes: int = 1) -> None:
        s = _structure(graph, deps)
        self._child_ptr = s.child_ptr
        self._children = s.children
        self._remaining = list(s.num_parents)
        self._lane: Sequence[int] | None = lanes
        self._heaps: list[list[int]] = [[] for _ in range(num_lanes)]
        self._deferred: list[int] = []
        self.num_nodes = graph.num_nodes
        self.finished = 0
        self.taken = 0
        for i in s.roots:  # ascending, so each heap list is already a valid heap
            self._heaps[lanes[i] if lanes is not None else 0].append(i)

    def lane_heads(self) -> list[int | None]:
        """The lowest issuable node of each lane (None for an empty lane)."""
        return [h[0] if h else None for h in self._heaps]

    def peek(self, lane: int = 0) -> int | None:
        heap = self._heaps[lane]
        return heap[0] if heap else None

    def take(self, lane: int = 0) -> int:
        """Remove and return the lowest issuable node of a lane (IndexError when empty)."""
        self.taken += 1
        return heapq.heappop(self._heaps[lane])

    def take_lowest(self) -> int | None:
        """Remove and return the lowest issuable node over all lanes, or None."""
        best = -1
        best_lane = -1
        for lane, heap in enumerate(self._heaps):
            if heap and (best < 0 or heap[0] < best):
                best, best_lane = heap[0], lane
        if best_lane < 0:
            return None
        return self.take(best_lane)

    def push_back(self, index: int) -> None:
        """Return a taken node to the issuable set."""
        self.taken -= 1
        heapq.heappush(self._heaps[self._lane[index] if self._lane is not None else 0], index)

    def finish(self, index: int, defer: bool = False) -> None:
        """Mark a taken node finished and release the children that were waiting only for it."""
        self.finished += 1
        remaining = self._remaining
        children = self._children
        lanes = self._lane
        for k in range(self._child_ptr[index], self._child_ptr[index + 1]):
            c = children[k]
            left = remaining[c] - 1
            remaining[c] = left
            if left == 0:
                if defer:
                    self._deferred.append(c)
                else:
                    heapq.heappush(self._heaps[lanes[c] if lanes is not None else 0], c)

    def release_deferred(self) -> None:
        heaps = self._heaps
        lanes = self._lane
        for c in self._deferred:
            heapq.heappush(heaps[lanes[c] if lanes is not None else 0], c)
        self._deferred.clear()

    @property
    def issuable_count(self) -> int:
        return sum(map(len, self._heaps)) + len(self._deferred)

    @property
    def done(self) -> bool:
        return self.finished == self.num_nodes

    def unfinished_waiting(self) -> list[int]:
        """Nodes never issued because some parent never finished (for deadlock reports)."""
        return [i for i, r in enumerate(self._remaining) if r > 0]


def walk(graph: TraceGraph, deps: Dependencies) -> Iterator[int]:
    """Yield node indices in issue order when every node finishes as soon as it is issued."""
    feeder = Feeder(graph, deps)
    while (i := feeder.take_lowest()) is not None:
        yield i
        feeder.finish(i)
