"""The native collective algorithms, timed as ASTRA-sim 2.x times them.

Each algorithm runs one phase of one chunk-stream on one logical dimension and talks to its stream
through four things: ``send(dst, size)``, ``recv(src, size)`` (the stream calls ``on_received`` when the
data is in), ``bundle(processed, size)`` (the endpoint/injection delay, plus a reduction when
``processed``; the stream then calls ``on_general``) and ``exit()``.

Ring-family algorithms inject "packets": every received message becomes a packet that, once through
the endpoint (and a reduction on reducing steps), frees a slot to send the next message. Which messages
reduce, when the stream may leave, and the message sizes follow ASTRA-sim exactly (integer division,
truncation included). ``messages(...)`` in ``plans.py`` describes the same traffic as data, for tests.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

from simulator.collectives.topology import BinaryTree, LogicalRing
from workload.errors import InputError


class StreamPort(Protocol):
    """What an algorithm may do (implemented by the system layer's Stream)."""

    rank: int

    def send(self, dst: int, size: int) -> None: ...

    def recv(self, src: int, size: int) -> None: ...

    def bundle(self, processed: bool, size: int, local: bool) -> None: ...

    def exit(self) -> None: ...


ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL = "all_reduce", "all_gather", "reduce_scatter", "all_to_all"


class Algorithm:
    """Common fields: the collective, the input and output size of this phase."""

    __slots__ = ()  # subclasses on the hot path declare theirs

    kind: str
    data_size: int
    final_data_size: int
    port: StreamPort

    def start(self) -> None:
        raise NotImplementedError

    def on_general(self) -> None:
        raise NotImplementedError

    def on_received(self) -> None:
        raise NotImplementedError


class Ring(Algorithm):
    """ASTRA-sim's ring: every message goes to the next NPU and comes from the previous one.

    Its packets all go the same way, so the queue of packets waiting for a free slot is a count. This is the
    path of most simulated messages: ``on_general`` sends inline."""

    __slots__ = ("clockwise", "data_size", "final_data_size", "free", "kind", "msg_size", "nodes", "non_zero_latency",
                 "parallel", "port", "queued", "rank", "received", "receiver", "reducing", "ring", "sender",
                 "stream_count", "toggle", "zero_latency")

    def __init__(self, kind: str, rank: int, ring: LogicalRing, data_size: int, clockwise: bool) -> None:
        n = ring.size
        self.kind = kind
        self.rank = rank
        self.ring = ring
        self.data_size = data_size
        self.clockwise = clockwise
        self.nodes = n
        self.receiver, self.sender = ring.neighbours(rank, clockwise)
        self.parallel = 1
        if kind == ALL_REDUCE:
            self.stream_count = 2 * (n - 1)
        elif kind == ALL_TO_ALL:
            self.stream_count = (n - 1) * n // 2
        else:
            self.stream_count = n - 1
        if kind == ALL_GATHER:
            self.final_data_size, self.msg_size = data_size * n, data_size
        elif kind == REDUCE_SCATTER:
            self.final_data_size, self.msg_size = data_size // n, data_size // n
        else:
            self.final_data_size, self.msg_size = data_size, data_size // n
        self.reducing = 2 if kind == REDUCE_SCATTER else 1 if kind == ALL_REDUCE else 0  # 1: every other round
        self.free = 0
        self.received = 0
        self.zero_latency = 0
        self.non_zero_latency = 0
        self.toggle = False
        self.queued = 0  # packets waiting for a free slot

    def non_zero_latency_packets(self) -> int:
        return (self.nodes - 1) * self.parallel

    def start(self) -> None:
        for _ in range(self.parallel):
            self.insert_packet()

    def on_general(self) -> None:
        free = self.free + 1
        if self.queued and self.stream_count:  # ready(), inlined
            self.queued -= 1
            port, size = self.port, self.msg_size
            port.send(self.receiver, size)
            port.recv(self.sender, size)
            self.stream_count -= 1
            free -= 1
        self.free = free
        if self.stream_count == 0 and free == self.parallel:
            self.port.exit()

    def on_received(self) -> None:
        self.received += 1
        self.insert_packet()

    def insert_packet(self) -> None:
        """A packet joins the queue and goes through the endpoint (reduced on reducing steps)."""
        if self.zero_latency == 0 and self.non_zero_latency == 0:
            self.zero_latency = self.parallel
            self.non_zero_latency = self.non_zero_latency_packets()
            self.toggle = not self.toggle
        self.queued += 1
        if self.zero_latency > 0:
            self.zero_latency -= 1
            self.port.bundle(False, self.msg_size, self.ring.local)
        else:
            self.non_zero_latency -= 1
            self.port.bundle(self.reducing == 2 or (self.reducing == 1 and self.toggle), self.msg_size,
                             self.ring.local)

    def ready(self) -> bool:
        """Send the oldest queued packet if a slot is free (and messages are left)."""
        if not self.queued or self.stream_count == 0 or self.free == 0:
            return False
        self.queued -= 1
        self.port.send(self.receiver, self.msg_size)
        self.port.recv(self.sender, self.msg_size)
        self.stream_count -= 1
        self.free -= 1
        return True


class Direct(Ring):
    """ASTRA-sim's direct algorithm: messages to every other NPU in turn, up to ``window`` at once.

    Packets go to successive NPUs (skipping this one) in the order they were queued, so the one sent next is
    the next in that sequence: ``receiver`` and ``sender`` walk it as packets are sent."""

    __slots__ = ("middle_point",)

    def __init__(self, kind: str, rank: int, ring: LogicalRing, data_size: int, clockwise: bool,
                 window: int) -> None:
        super().__init__(kind, rank, ring, data_size, clockwise)
        self.middle_point = self.nodes - 1
        self.parallel = self.nodes - 1 if window < 0 else min(window, self.nodes - 1)
        if kind == ALL_TO_ALL:
            self.stream_count = self.nodes - 1

    def non_zero_latency_packets(self) -> int:
        return (self.nodes - 1) * self.parallel if self.ring.local else self.parallel

    def on_general(self) -> None:
        self.free += 1
        if self.kind == ALL_REDUCE and self.stream_count <= self.middle_point:
            if self.received < self.middle_point:
                return  # the all-gather half waits for the whole reduce-scatter half
            for _ in range(self.parallel):
                self.ready()
        else:
            self.ready()
        if self.stream_count == 0 and self.free == self.parallel:
            self.port.exit()

    def ready(self) -> bool:
        if not super().ready():
            return False
        ring, me = self.ring, self.rank
        self.receiver = ring.receiver(self.receiver, self.clockwise)
        if self.receiver == me:
            self.receiver = ring.receiver(self.receiver, self.clockwise)
        self.sender = ring.sender(self.sender, self.clockwise)
        if self.sender == me:
            self.sender = ring.sender(self.sender, self.clockwise)
        return True


class HalvingDoubling(Algorithm):
    """ASTRA-sim's recursive halving/doubling (all-reduce, reduce-scatter, all-gather)."""

    def __init__(self, kind: str, rank: int, ring: LogicalRing, data_size: int) -> None:
        n = ring.size
        if n & (n - 1):
            raise InputError(f"halvingDoubling needs a power-of-two number of NPUs, but its ring has {n}")
        self.kind = kind
        self.rank = rank
        self.ring = ring
        self.data_size = data_size
        self.nodes = n
        self.stream_count = int(2 * math.log2(n)) if kind == ALL_REDUCE else int(math.log2(n))
        if kind == ALL_REDUCE:
            self.final_data_size, self.msg_size, self.rank_offset, self.multiplier = data_size, data_size // 2, 1, 2.0
        elif kind == ALL_GATHER:
            self.final_data_size, self.msg_size = data_size * n, data_size
            self.rank_offset, self.multiplier = n // 2, 0.5
        elif kind == REDUCE_SCATTER:
            self.final_data_size, self.msg_size = data_size // n, data_size // 2
            self.rank_offset, self.multiplier = 1, 2.0
        else:
            raise ValueError("halvingDoubling does not implement all-to-all")
        self.my_index = ring.index(rank)
        self.partner = self._partner()
        self.free = 0
        self.zero_latency = 0
        self.non_zero_latency = 0
        self.toggle = False
        self.packets: deque[tuple[int, int]] = deque()  # (partner, size) of each queued packet

    def _partner(self) -> int:
        clockwise = self.rank_offset == 0 or (self.my_index // self.rank_offset) % 2 == 0
        return self.ring.step(self.rank, self.rank_offset if clockwise else -self.rank_offset)

    def start(self) -> None:
        self.insert_packet()

    def on_general(self) -> None:
        self.free += 1
        self.ready()
        if self.stream_count == 0 and self.free == 1:
            self.port.exit()

    def on_received(self) -> None:
        self.insert_packet()

    def insert_packet(self) -> None:
        if self.zero_latency == 0 and self.non_zero_latency == 0:
            self.zero_latency = 1
            self.non_zero_latency = int(math.log2(self.nodes)) - 1
            self.toggle = not self.toggle
        self.packets.append((self.partner, self.msg_size))
        if self.zero_latency > 0:
            processed = False
            self.zero_latency -= 1
        else:
            processed = self.kind == REDUCE_SCATTER or (self.kind == ALL_REDUCE and self.toggle)
            self.non_zero_latency -= 1
        self.port.bundle(processed, self.msg_size, self.ring.local)
        # the next packet goes to the next partner, with the next size
        self.rank_offset = int(self.rank_offset * self.multiplier)
        self.msg_size = int(self.msg_size / self.multiplier)
        if self.rank_offset == self.nodes and self.kind == ALL_REDUCE:
            self.multiplier = 0.5
            self.rank_offset = int(self.rank_offset * self.multiplier)
            self.msg_size = int(self.msg_size / self.multiplier)
        self.partner = self._partner()

    def ready(self) -> None:
        if not self.packets or self.stream_count == 0 or self.free == 0:
            return
        partner, size = self.packets.popleft()
        self.port.send(partner, size)
        self.port.recv(partner, size)
        self.stream_count -= 1
        self.free -= 1


class DoubleBinaryTreeAllReduce(Algorithm):
    """ASTRA-sim's tree all-reduce: reduce up to the root, broadcast back down, whole chunk per message."""

    def __init__(self, rank: int, tree: BinaryTree, data_size: int) -> None:
        self.kind = ALL_REDUCE
        self.rank = rank
        self.data_size = self.final_data_size = data_size
        node = tree.node(rank)
        self.parent, self.left, self.right = node.parent, node.left, node.right
        self.role = node.kind
        self.state = "begin"
        self.reductions = 0

    def start(self) -> None:
        self._step(False)

    def on_general(self) -> None:
        self._step(False)

    def on_received(self) -> None:
        self._step(True)

    def _step(self, received: bool) -> None:
        port, size, state, role = self.port, self.data_size, self.state, self.role
        if role == "leaf":
            if state == "begin":
                port.bundle(False, size, False)
                self.state = "to_parent"
            elif state == "to_parent":
                port.send(self.parent, size)
                port.recv(self.parent, size)
                self.state = "from_parent"
            elif state == "from_parent":
                port.bundle(False, size, False)
                self.state = "end"
            elif state == "end":
                port.exit()
        elif role == "intermediate":
            if state == "begin":
                self.state = "two_children"
                port.recv(self.left, size)
                port.recv(self.right, size)
            elif state == "two_children" and received:
                port.bundle(True, size, False)
                self.state = "one_child"
            elif state == "one_child" and received:
                port.bundle(True, size, False)
                self.state = "to_parent"
            elif self.reductions < 1 and not received:
                self.reductions += 1  # the first reduction's completion; the second one moves on
            elif state == "to_parent":
                self.state = "from_parent"
                port.send(self.parent, size)
                port.recv(self.parent, size)
            elif state == "from_parent" and received:
                port.bundle(True, size, False)
                self.state = "to_children"
            elif state == "to_children":
                port.send(self.left, size)
                port.send(self.right, size)
                port.exit()
        else:  # root: its only child is the whole tree below it
            child = self.left if self.left >= 0 else self.right
            if state == "begin":
                self.state = "one_child"
                port.recv(child, size)
            elif state == "one_child":
                port.bundle(True, size, False)
                self.state = "to_children"
            elif state == "to_children":
                port.send(child, size)
                port.exit()
