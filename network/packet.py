"""The packet-level backend (``--backend packet``): messages cut into packets that queue at every port.

Model:
  * A message is cut into packets of ``mtu_bytes`` (the last one shorter); each packet also carries
    ``header_bytes`` on the wire. All packets of a message follow one route (per-flow ECMP on fabrics,
    dimension order on ASTRA-sim dimensions: network/topology.py).
  * Every directed link has an output queue at its source device and sends one packet at a time:
    serialisation (wire bytes / bandwidth), then the link's latency to the next device (store-and-forward
    per packet). An NPU sends its own messages one after another (FIFO, like analytical-aware) and, where it
    relays other NPUs' packets (tori, ASTRA-sim rings), takes turns between its own and relayed packets,
    up to 16 packets a turn (round-robin with a 64 KiB quantum at the default MTU).
  * Lossless credit-based flow control (default): a packet starts on a link only when the output queue it
    will join at the next device has room for it (``buffer_bytes`` per queue), reserving that room; otherwise
    it waits, blocking whatever queues behind it (head-of-line blocking), and the wait counts as pause time.
    Credits return the moment a packet leaves a queue. ``flow_control: none`` gives unlimited buffers. The
    receiving NPU always takes its packets.
  * Virtual channels (``virtual_channels: hops``, the default): every output queue is split by hop, a packet
    on the k-th link of its route waiting in channel k, with ``buffer_bytes`` of its own. A packet in channel
    k only ever waits for room in channel k + 1, so the waits cannot form a cycle and credit flow control
    cannot deadlock on any routing (dragonflies and tori included), as real switches use virtual channels
    for. A link takes turns between its channels whose head packet can go; a blocked channel does not block
    the others. ``virtual_channels: none``: one FIFO per port, which can deadlock on cyclic routes exactly as
    a network without virtual channels does (the run then stops naming the blocked links).

Time runs in integer picoseconds inside the backend (a 4 KiB packet is not a whole number of ns) and in ns
outside; a message is delivered at the ns its last packet arrives in (floor). The backend runs its own event
loop between the simulator's events, so packets cost no simulator events; a new message enters the network no
earlier than the last packet event already processed (less than 1 ns later than its send in the worst case).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from array import array
from collections import deque
from typing import Any

from network.packet_config import PacketConfig
from network.topology import DimensionOrderRouter, EcmpRouter, Fabric, Flows

_ARRIVE, _TX_DONE = 0, 1
_NEVER = 1 << 62


class PacketLink:
    """A directed link, its output queue at the source device (one per virtual channel), and its statistics."""

    __slots__ = ("blocked_since", "burst", "busy_until", "bytes", "cap", "clear_at", "cur_size", "cur_vc", "dst",
                 "history", "lat_ps", "max_queue", "max_queue_bytes", "messages", "name", "num_waiters", "occ", "own",
                 "packets",
                 "pause_ps", "ps_per_byte", "queued", "queued_bytes", "relay", "relay_turn", "rr", "serve_own", "src",
                 "tx_pending", "waiters", "waiting")

    def __init__(self, name: str, src: int, dst: int, bandwidth_GiBps: float, latency_ns: float, cap: int,
                 burst: int) -> None:
        self.name = name
        self.src = src
        self.dst = dst
        self.ps_per_byte = 1e12 / (bandwidth_GiBps * (1 << 30))
        self.lat_ps = round(latency_ns * 1000)
        self.burst = burst  # packets per turn of own (and of relayed) traffic at an NPU
        self.busy_until = 0  # ps when the current transmission ends
        # ps from which a packet arriving can go straight out: busy_until while nothing is queued, blocked or
        # pending, else _NEVER (one comparison decides the common case)
        self.clear_at = 0
        self.own: deque[_Message] = deque()  # this NPU's messages, cut into packets as they are sent
        # per virtual channel: relayed packets (message, hop, wire bytes) queued here, the bytes of the queue
        # (reserved by packets on their way, queued, in transmission), the upstream links waiting for room in
        # it (with the channel of theirs that waits), and what the head packet of each own channel waits for
        self.relay: list[deque[tuple[_Message, int, int]]] = [deque()]
        self.occ = [0]
        self.waiters: list[deque[tuple[PacketLink, int]]] = [deque()]
        self.num_waiters = 0  # over all channels
        self.waiting: list[PacketLink | None] = [None]
        self.cap = cap
        self.serve_own = True  # whose turn: own or relayed packets (round-robin, `burst` packets a turn)
        self.relay_turn = 0  # relayed packets sent in the current turn
        self.rr = 0  # the relay channel to try first (round-robin between channels)
        self.cur_size = 0  # wire bytes of the relayed packet in transmission (they leave occ when it ends)
        self.cur_vc = 0  # and its channel
        self.blocked_since = -1  # ps since which no queued packet can go for want of room (-1: not blocked)
        self.tx_pending = False  # a TX_DONE event is scheduled
        self.bytes = 0
        self.packets = 0
        self.messages = 0
        self.queued = 0  # relayed packets waiting, over all channels
        self.queued_bytes = 0  # and their wire bytes
        self.max_queue = 0  # the most packets ever waiting in the queue (not counting the one being sent)
        self.max_queue_bytes = 0
        self.pause_ps = 0
        self.history: list[tuple[int, int]] | None = None

    def grow(self, channels: int) -> None:
        """Have at least ``channels`` virtual channels."""
        while len(self.occ) < channels:
            self.relay.append(deque())
            self.occ.append(0)
            self.waiters.append(deque())
            self.waiting.append(None)

    # what link statistics read, in ns like the analytical links
    @property
    def busy_ns(self) -> int:
        return int(self.bytes * self.ps_per_byte) // 1000

    def enqueue(self, packet: tuple[_Message, int, int], vc: int) -> None:
        """A relayed packet joins channel ``vc`` (it has to wait: the link is busy, blocked or has a queue)."""
        self.relay[vc].append(packet)
        self.queued += 1
        self.queued_bytes += packet[2]
        self.clear_at = _NEVER
        if self.queued > self.max_queue:
            self.max_queue = self.queued
        if self.queued_bytes > self.max_queue_bytes:
            self.max_queue_bytes = self.queued_bytes

    def release_sent(self, t: int) -> None:
        """The relayed packet whose transmission has ended by ``t`` leaves the queue: its room is free."""
        if self.cur_size and self.busy_until <= t:
            self.occ[self.cur_vc] -= self.cur_size
            self.cur_size = 0

    @property
    def pause_ns(self) -> int:
        return self.pause_ps // 1000


def _record(history: list[tuple[int, int]], start_ps: int, end_ps: int) -> None:
    """Add a busy interval (in ns) to a link's history, merged with the previous one when they touch."""
    a, b = start_ps // 1000, end_ps // 1000
    if history and history[-1][1] >= a:
        history[-1] = (history[-1][0], max(b, history[-1][1]))
    else:
        history.append((a, b))


class _Message:
    __slots__ = ("arg", "callback", "dst", "last", "route", "sent", "size", "src", "start_ps", "tail")

    def __init__(self, src: int, dst: int, size: int, route: list[PacketLink], callback: Any, arg: Any,
                 start_ps: int, mtu: int) -> None:
        self.src = src
        self.dst = dst
        self.size = size
        self.route = route
        self.last = len(route) - 1  # index of the final link
        self.callback = callback
        self.arg = arg
        self.sent = 0  # payload bytes cut into packets so far
        self.tail = max(1, -(-size // mtu))  # packets still to go over the final link
        self.start_ps = start_ps


class PacketNetwork:
    """Packet-level network over a fabric; plugs into the simulator like the analytical backends."""

    name = "packet"
    BURST = 16  # packets of one kind (own or relayed) an NPU sends per turn (downstream room permitting)

    def __init__(self, fabric: Fabric, router: EcmpRouter | DimensionOrderRouter, config: PacketConfig,
                 engine: Any) -> None:
        self.fabric = fabric
        self.config = config
        self.engine = engine
        self.mtu = config.mtu_bytes
        self.header = config.header_bytes
        self.hop_channels = config.virtual_channels == "hops"
        self.channels = 1  # virtual channels per queue: the longest route's hops (grown as routes appear)
        cap = config.buffer_bytes if config.flow_control == "credit" else _NEVER
        self.links: dict[tuple[int, int], PacketLink] = {}
        npus = fabric.num_npus
        for a, b, data in sorted(fabric.graph.edges(data=True)):
            burst = 1 if a >= npus else self.BURST
            self.links[(a, b)] = PacketLink(fabric.link_name(a, b), a, b, data["bandwidth_GiBps"],
                                            data["latency_ns"], cap, burst)
        # events: (ps, sequence, kind, message or link, hop, wire bytes); ties go in the order they were made
        self.heap: list[tuple[int, int, int, Any, int, int]] = []
        self._seq = itertools.count()
        self.watermark = 0  # ps of the last packet event processed
        self._flows = Flows(router)
        self._routes: dict[tuple[int, ...], list[PacketLink]] = {}
        self._wakes: set[int] = set()
        self._ready: list[tuple[int, int, _Message]] = []  # heap: arrived at a later ns than the simulator's
        self.events = 0
        self.loop_s = 0.0  # wall-clock seconds spent in the packet event loop
        self._next_check = 0x10000
        self.messages = 0
        self.bytes = 0
        self.stopped = False
        self.tick: Any = None  # called with the simulated ns now and then in long packet loops; True: stop
        # per delivered message: src, dst, bytes, start ns, end ns
        self.log = {k: array("q") for k in ("src", "dst", "size", "start_ns", "end_ns")}

    def enable_history(self) -> None:
        for link in self.links.values():
            link.history = []

    # --- the simulator's side ----------------------------------------------------------------------
    def transmit(self, src: int, dst: int, size_bytes: int, on_delivered: Any, arg: Any) -> None:
        now = max(self.engine.now * 1000, self.watermark)
        self.messages += 1
        self.bytes += size_bytes
        msg = _Message(src, dst, size_bytes, self._route(src, dst), on_delivered, arg, now, self.mtu)
        for link in msg.route:
            link.messages += 1
        first = msg.route[0]
        first.own.append(msg)
        first.clear_at = _NEVER
        if not first.tx_pending and first.blocked_since < 0:
            if first.busy_until <= now:
                self._start(first, now)
            else:
                self._push(first.busy_until, _TX_DONE, first, 0, 0)
                first.tx_pending = True
        self._wake_for_next()

    def _route(self, src: int, dst: int) -> list[PacketLink]:
        nodes = self._flows.path(src, dst)
        route = self._routes.get(nodes)
        if route is None:
            links = self.links
            route = self._routes[nodes] = [links[(nodes[i], nodes[i + 1])] for i in range(len(nodes) - 1)]
            if self.hop_channels and len(route) > self.channels:
                self.channels = len(route)
                for link in links.values():
                    link.grow(self.channels)
        return route

    def _wake_for_next(self) -> None:
        """Make sure the simulator calls back when the next packet event or delivery is due."""
        now = self.engine.now
        due = min(self._ready[0][0] if self._ready else _NEVER, self.heap[0][0] if self.heap else _NEVER)
        if due == _NEVER:
            return
        due = max(due // 1000, now)
        if self._wakes and min(self._wakes) <= due:
            return
        self._wakes.add(due)
        self.engine.call_later(due - now, self._run, due)

    def _run(self, due: int) -> None:
        """Deliver what has arrived by now, then process packet events up to the simulator's next event."""
        self._wakes.discard(due)
        now_ns = self.engine.now
        ready = self._ready
        while ready and ready[0][0] // 1000 <= now_ns:
            self._deliver(heapq.heappop(ready)[2], now_ns)
        if not self.stopped:
            nxt = self.engine.env.peek()
            limit = int(nxt) * 1000 if nxt != float("inf") else _NEVER
            if ready:
                limit = min(limit, ready[0][0])
            began = time.perf_counter()
            self._loop(limit, now_ns)
            self.loop_s += time.perf_counter() - began
            if self.events >= self._next_check:  # many short loops add up to a long run too
                self._next_check = self.events + 0x10000
                if self.tick is not None and self.tick(now_ns):
                    self.stopped = True
        self._wake_for_next()

    def _deliver(self, msg: _Message, now_ns: int) -> None:
        log = self.log
        log["src"].append(msg.src)
        log["dst"].append(msg.dst)
        log["size"].append(msg.size)
        log["start_ns"].append(msg.start_ps // 1000)
        log["end_ns"].append(now_ns)
        msg.callback(msg.arg)

    # --- the packet event loop ---------------------------------------------------------------------
    def _loop(self, limit: int, now_ns: int) -> None:
        """Process packet events in time order while they are due before ``limit`` (ps).

        Only the last packet of a message has an event at its destination (packets of a message arrive in
        order). The common case is inlined: a packet reaching a link with nothing queued goes straight out.
        """
        heap = self.heap
        pop, push = heapq.heappop, heapq.heappush
        seq = self._seq
        start = self._start
        channels = self.hop_channels
        count = 0
        while heap and heap[0][0] < limit:
            t, _, kind, obj, hop, wire = pop(heap)
            count += 1
            if kind == _ARRIVE:
                route = obj.route
                if hop == obj.last:  # the message's last packet has reached its destination
                    if t // 1000 > now_ns:  # the simulator's clock must reach that ns first
                        push(self._ready, (t, next(seq), obj))
                        limit = t  # what comes after it waits for its delivery
                    else:
                        self._deliver(obj, now_ns)
                    continue
                hop += 1
                link = route[hop]  # it holds room reserved in this link's queue (channel `vc`)
                vc = hop if channels else 0
                if link.clear_at <= t:  # nothing queued: send it on at once
                    if hop != obj.last:
                        nxt = route[hop + 1]
                        if nxt.cur_size and nxt.busy_until <= t:
                            nxt.occ[nxt.cur_vc] -= nxt.cur_size
                            nxt.cur_size = 0
                        vn = hop + 1 if channels else 0
                        occ = nxt.occ[vn] + wire
                        if occ > nxt.cap:  # no room downstream: the general path blocks the channel
                            link.enqueue((obj, hop, wire), vc)
                            start(link, t)
                            continue
                        nxt.occ[vn] = occ
                        arrive = True
                    else:
                        obj.tail -= 1
                        arrive = not obj.tail
                    if link.cur_size:
                        link.occ[link.cur_vc] -= link.cur_size
                    link.cur_size = wire
                    link.cur_vc = vc
                    end = t + int(wire * link.ps_per_byte + 0.5)
                    link.busy_until = end
                    link.bytes += wire
                    link.packets += 1
                    if link.history is not None:
                        _record(link.history, t, end)
                    if arrive:
                        push(heap, (end + link.lat_ps, next(seq), _ARRIVE, obj, hop, wire))
                    if link.num_waiters:
                        push(heap, (end, next(seq), _TX_DONE, link, 0, 0))
                        link.tx_pending = True
                        link.clear_at = _NEVER
                    else:
                        link.clear_at = end
                    continue
                link.enqueue((obj, hop, wire), vc)
                # a blocked link retries when a packet joins another channel (one FIFO: it waits behind the head)
                if not link.tx_pending and (link.blocked_since < 0 or channels):
                    if link.busy_until <= t:
                        start(link, t)
                    else:  # busy: take the packet when the transmission ends
                        push(heap, (link.busy_until, next(seq), _TX_DONE, link, 0, 0))
                        link.tx_pending = True
            else:  # TX_DONE: the link's transmission has ended: room behind it, and its next packet
                link = obj
                link.tx_pending = False
                if link.cur_size:
                    link.occ[link.cur_vc] -= link.cur_size
                    link.cur_size = 0
                if link.num_waiters:
                    for vc, waiters in enumerate(link.waiters):
                        while waiters:
                            upstream, k = waiters[0]
                            if link.occ[vc] + self._head_wire(upstream, k) > link.cap:
                                break
                            waiters.popleft()
                            link.num_waiters -= 1
                            upstream.waiting[k] = None
                            if upstream.blocked_since >= 0 and upstream.busy_until <= t and not upstream.tx_pending:
                                start(upstream, t)
                if not link.tx_pending and (link.blocked_since < 0 or channels):
                    if link.own or link.queued:
                        start(link, t)
                    else:
                        link.clear_at = link.busy_until
            if not count & 0xFFFF and self.tick is not None and self.tick(t // 1000):
                self.stopped = True
                break
        self.events += count

    def _head_wire(self, link: PacketLink, k: int) -> int:
        """Wire bytes of the packet that channel ``k`` of the link sends next (0: none)."""
        own, relay = link.own, link.relay[k]
        if own and (k == 0 if self.hop_channels else (link.serve_own or not relay)):
            msg = own[0]
            return min(self.mtu, msg.size - msg.sent) + self.header
        return relay[0][2] if relay else 0

    def _choose(self, link: PacketLink, t: int) -> tuple[int, bool, Any, int, int, Any] | None:
        """The next packet the idle link can send: (channel, own?, message, hop, wire bytes, next link or None
        when it is the last hop). Channels whose head waits for room register with the queue they wait for;
        None when every one waits (with one FIFO, the head alone decides)."""
        own, relay = link.own, link.relay
        if not self.hop_channels:
            return self._try(link, 0, bool(own) and (link.serve_own or not relay[0]), t)
        own_first = bool(own) and (link.serve_own or not link.queued)
        if own_first:
            choice = self._try(link, 0, True, t)
            if choice is not None:
                return choice
        if link.queued:
            n = len(relay)
            for i in range(n):
                k = (link.rr + i) % n
                if k and relay[k]:
                    choice = self._try(link, k, False, t)
                    if choice is not None:
                        return choice
        return self._try(link, 0, True, t) if own and not own_first else None

    def _try(self, link: PacketLink, k: int, use_own: bool, t: int) -> tuple[int, bool, Any, int, int, Any] | None:
        """Channel ``k``'s head packet (or the NPU's own next one) if it can go now; else register its wait."""
        if use_own:
            msg, hop = link.own[0], 0
            wire = (self.mtu if msg.size - msg.sent > self.mtu else msg.size - msg.sent) + self.header
        else:
            msg, hop, wire = link.relay[k][0]
        if hop == msg.last:
            return k, use_own, msg, hop, wire, None
        nxt = msg.route[hop + 1]
        nxt.release_sent(t)
        vn = hop + 1 if self.hop_channels else 0
        if wire <= nxt.cap - nxt.occ[vn]:
            return k, use_own, msg, hop, wire, nxt
        if link.waiting[k] is not nxt:  # wait for room there (head-of-line within the channel)
            link.waiting[k] = nxt
            nxt.waiters[vn].append((link, k))
            nxt.num_waiters += 1
        if nxt.busy_until > t and not nxt.tx_pending:
            self._push(nxt.busy_until, _TX_DONE, nxt, 0, 0)
            nxt.tx_pending = True
            nxt.clear_at = _NEVER
        return None

    def _start(self, link: PacketLink, t: int) -> None:
        """Send the next packet (or burst of own packets) on an idle link if the queue it joins has room."""
        if link.cur_size:  # the relayed packet it sent last has left: its room is free
            link.occ[link.cur_vc] -= link.cur_size
            link.cur_size = 0
        if not link.own and not link.queued:
            link.clear_at = link.busy_until
            return
        choice = self._choose(link, t)
        if choice is None:  # no room downstream for any head packet: wait, and block what queues behind
            if link.blocked_since < 0:
                link.blocked_since = t
            link.clear_at = _NEVER
            return
        k, use_own, msg, hop, wire, nxt = choice
        if link.blocked_since >= 0:
            link.pause_ps += t - link.blocked_since
            link.blocked_since = -1
        header, mtu = self.header, self.mtu
        count = 1
        final = nxt is None
        vn = hop + 1 if self.hop_channels else 0
        if use_own and link.burst > 1:
            count = max(1, min(link.burst, -(-(msg.size - msg.sent) // mtu)))
            if not final:
                count = min(count, max(1, (nxt.cap - nxt.occ[vn]) // (mtu + header)))
        # (count > 1 only for own packets: one message's packets back to back, one turn of the round-robin)
        ps_per_byte = link.ps_per_byte
        end = t
        lat = link.lat_ps
        heap, seq = self.heap, self._seq
        push = heapq.heappush
        own = link.own
        if use_own:
            remaining = msg.size - msg.sent
            total = 0
            for _ in range(count):
                size = mtu if remaining > mtu else remaining
                remaining -= size
                wire = size + header
                end += int(wire * ps_per_byte + 0.5)
                total += wire
                if final:
                    msg.tail -= 1
                    if msg.tail:
                        continue
                push(heap, (end + lat, next(seq), _ARRIVE, msg, hop, wire))
            msg.sent = msg.size - remaining
            if msg.sent >= msg.size:
                own.popleft()
            link.serve_own = False
        else:
            total = wire
            end += int(wire * ps_per_byte + 0.5)
            if final:
                msg.tail -= 1
            if not final or not msg.tail:
                push(heap, (end + lat, next(seq), _ARRIVE, msg, hop, wire))
            link.relay[k].popleft()
            link.queued -= 1
            link.queued_bytes -= wire
            link.cur_size = wire
            link.cur_vc = k
            link.rr = k + 1
            link.relay_turn += 1
            if link.relay_turn >= link.burst or not link.queued:
                link.serve_own = True
                link.relay_turn = 0
        if not final:
            nxt.occ[vn] += total
        link.busy_until = end
        link.bytes += total
        link.packets += count
        if link.history is not None:
            _record(link.history, t, end)
        if own or link.queued or link.num_waiters:
            push(heap, (end, next(seq), _TX_DONE, link, 0, 0))
            link.tx_pending = True
            link.clear_at = _NEVER
        else:
            link.clear_at = end

    def _push(self, t: int, kind: int, obj: Any, hop: int, wire: int) -> None:
        heapq.heappush(self.heap, (t, next(self._seq), kind, obj, hop, wire))

    # --- statistics -------------------------------------------------------------------------------
    @property
    def packet_hops(self) -> int:
        """Packets sent over links so far (one per packet per link)."""
        return sum(link.packets for link in self.links.values())

    def blocked_links(self) -> list[str]:
        """Links whose head packet waits for room downstream (at the end of a run: a deadlock)."""
        return [link.name for link in self.links.values() if link.blocked_since >= 0]

    def message_stats(self) -> dict[str, Any]:
        """Per-message latency (ns) over delivered messages, and the packet work done."""
        latencies = sorted(e - s for s, e in zip(self.log["start_ns"], self.log["end_ns"], strict=True))
        n = len(latencies)
        stats: dict[str, Any] = {"messages": n, "packet_hops": self.packet_hops, "packet_events": self.events}
        if n:
            stats.update(latency_mean_ns=sum(latencies) / n, latency_p50_ns=latencies[(n - 1) // 2],
                         latency_p99_ns=latencies[min(n - 1, math.ceil(0.99 * n) - 1)], latency_max_ns=latencies[-1])
        return stats
