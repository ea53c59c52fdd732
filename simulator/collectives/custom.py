"""Custom collective algorithms given as Chakra ETs (ASTRA-sim's ``*-implementation-custom``).

A collective type with a custom implementation runs, on every member, the ET ``<prefix>.<position>.et`` of its
position in the communicator (its rank for collectives on all NPUs), as one chunk-stream with one phase that
covers every dimension. The ET's sends and receives go through the rank's native send/receive path (sizes, peers
and tags as the ET gives them; peers are positions in the communicator), its compute nodes are the reductions
(their duration, or 1 ns), and the phase ends when every node of the ET has finished. As in ASTRA-sim, the
collective's own size is not used: the ET's message sizes are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simulator.collectives.algorithms import Algorithm
from simulator.node_table import node_table
from workload.errors import InputError, TraceError
from workload.graph import TraceGraph
from workload.schema import NodeType
from workload.traceset import TraceLoader
from workload.validate import validate


class CustomAlgorithms:
    """The ETs of custom algorithms, each decoded once per run (shared by the ranks that run it)."""

    def __init__(self) -> None:
        self._loader = TraceLoader()
        self._graphs: dict[str, TraceGraph] = {}

    def graph(self, prefix: str, position: int) -> TraceGraph:
        path = f"{prefix}.{position}.et"
        found = self._graphs.get(path)
        if found is None:
            try:
                found = self._graphs[path] = self._loader.load(path, position)
            except TraceError as e:
                raise InputError(f"custom collective algorithm: {e}") from None
        return found


class CustomAlgorithm(Algorithm):
    """One member's run of a custom algorithm's ET."""

    def __init__(self, kind: str, rank: int, graph: TraceGraph, members: Sequence[int] | None, data_size: int
                 ) -> None:
        self.kind = kind
        self.rank = rank
        self.graph = graph
        self.members = members  # position -> rank (None: all NPUs, position = rank)
        self.data_size = data_size
        self.final_data_size = data_size
        self.table = node_table(graph)
        deps = validate(graph)
        self.child_ptr = deps.child_ptr.tolist()
        self.child_list = deps.children.tolist()
        self.waiting = deps.num_parents.tolist()
        self.left = graph.num_nodes

    def _real(self, position: int) -> int:
        if self.members is None:
            return position
        if not 0 <= position < len(self.members):
            raise InputError(f"custom collective algorithm {self.graph.path}: peer position {position} is outside "
                             f"its communicator of {len(self.members)}")
        return self.members[position]

    def start(self) -> None:
        if not self.left:
            self.port.exit()
            return
        for i in [i for i, w in enumerate(self.waiting) if w == 0]:
            self._issue(i)

    def _issue(self, i: int) -> None:
        from simulator.system import POINT_TO_POINT, wire_tag

        t = self.table
        ntype = t.types[i]
        system = self.port.system  # type: ignore[attr-defined]
        tag = wire_tag(max(t.comm_tag[i], 0), POINT_TO_POINT)
        if ntype == NodeType.COMM_SEND_NODE:
            system.send(self._real(t.comm_dst[i]), t.comm_size[i], tag, self._done, i)
        elif ntype == NodeType.COMM_RECV_NODE:
            system.recv(self._real(t.comm_src[i]), t.comm_size[i], tag, self._done, i)
        else:  # a reduction: its recorded time, or 1 ns (compute and other nodes alike)
            system.register(t.replay_ns[i] if t.types[i] == NodeType.COMP_NODE else 1, self._done, i)

    def _done(self, i: Any) -> None:
        self.left -= 1
        for child in self.child_list[self.child_ptr[i]:self.child_ptr[i + 1]]:
            self.waiting[child] -= 1
            if self.waiting[child] == 0:
                self._issue(child)
        if not self.left:
            self.port.exit()

    def on_general(self) -> None:  # pragma: no cover - the ET's nodes report to _done
        raise AssertionError("a custom algorithm is driven by its ET's nodes")

    def on_received(self) -> None:  # pragma: no cover
        raise AssertionError("a custom algorithm is driven by its ET's nodes")
