"""Analytical network backends behind one small interface: deliver ``size_bytes`` from ``src`` to ``dst``
and call back on arrival.

``analytical-unaware`` is ASTRA-sim's congestion-unaware model: a message takes
floor(hops * latency + bytes / bandwidth) on the lowest dimension where source and destination differ,
and any number of messages overlap at full bandwidth.

``analytical-aware`` is ASTRA-sim's congestion-aware model: every directed link is a FIFO server that
holds a message for bytes / bandwidth and delivers it to the next device latency + bytes / bandwidth after
it started (store-and-forward per hop, whole message). On one dimension it is exactly ASTRA-sim's. On
several dimensions (which ASTRA-sim 2.x refuses) messages use dimension-order routing: they travel along
dimension 0 to the destination's coordinate, then along dimension 1, and so on; within a dimension a Ring
takes the shorter direction (clockwise on ties), a FullyConnected dimension has a direct link per ordered
pair, and a Switch dimension has one switch per line of NPUs with one link each way per NPU.

On a fabric (network/fabrics.py) both route every message on a shortest path chosen per message (ECMP, the
same paths the packet backend takes): congestion-unaware then charges the path's summed latency plus
bytes / its slowest link's bandwidth; congestion-aware queues the message at every link of the path.
``packet`` (network/packet.py) cuts messages into packets with finite buffers and flow control.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from heapq import heappush
from typing import Any, Protocol

from network.config import NetworkConfig
from network.topology import EcmpRouter, Flows, dimension_order_hops

Callback = Callable[[Any], None]
HOPS = {"FullyConnected": 1, "Switch": 2}


class Clock(Protocol):
    """The event engine as a backend sees it (the simulator's Engine provides it)."""

    @property
    def now(self) -> int: ...

    def call_later(self, delay: int, fn: Callback, arg: Any = None) -> None: ...


class NetworkBackend(Protocol):
    """What the system layer needs from a network: timed point-to-point delivery."""

    name: str

    def transmit(self, src: int, dst: int, size_bytes: int, on_delivered: Callback, arg: Any) -> None:
        """Deliver ``size_bytes`` from NPU ``src`` to NPU ``dst``; call ``on_delivered(arg)`` on arrival."""
        ...


class CongestionUnaware:
    """ASTRA-sim's congestion-unaware analytical network."""

    name = "analytical-unaware"

    def __init__(self, config: NetworkConfig, engine: Clock) -> None:
        self.config = config
        self.engine = engine
        self._dims = [(t, n, config.latency_ns[d], config.bytes_per_ns(d))
                      for d, (t, n) in enumerate(zip(config.topology, config.npus_count, strict=True))]
        self._delays: dict[tuple[int, int, int], int] = {}  # (src, dst, bytes) -> ns
        self.messages = 0
        self.bytes = 0
        self._flows = Flows(EcmpRouter(config.fabric)) if config.fabric is not None else None
        self._paths: dict[tuple[int, ...], tuple[float, float]] = {}
        # where the engine lets the hot path push its events itself (simulator/engine.py: Engine.scheduler)
        self._heap, self._ids = (None, None) if hasattr(engine, "insert_offset") or not hasattr(
            engine, "scheduler") else engine.scheduler()

    def hops(self, src: int, dst: int) -> tuple[int, int]:
        """(dimension, hops) of the lowest dimension where the two NPUs differ."""
        for d, (kind, n, _, _) in enumerate(self._dims):
            s, t = src % n, dst % n
            if s != t:
                if kind == "Ring":
                    cw = (t - s) % n
                    return d, min(cw, n - cw)
                return d, HOPS[kind]
            src //= n
            dst //= n
        raise ValueError("a message from an NPU to itself")

    def delay_ns(self, src: int, dst: int, size_bytes: int) -> int:
        key = (src, dst, size_bytes)
        delay = self._delays.get(key)
        if delay is None:
            dim, hops = self.hops(src, dst)
            _, _, latency, bpns = self._dims[dim]
            delay = int(hops * latency + size_bytes / bpns)
            if len(self._delays) < 1_000_000:
                self._delays[key] = delay
        return delay

    def path_delay_ns(self, src: int, dst: int, size_bytes: int) -> int:
        """On a fabric: the chosen path's summed latency plus bytes over its slowest link."""
        assert self._flows is not None and self.config.fabric is not None
        nodes = self._flows.path(src, dst)
        found = self._paths.get(nodes)
        if found is None:
            fabric = self.config.fabric
            hops = [fabric.link(nodes[i], nodes[i + 1]) for i in range(len(nodes) - 1)]
            found = self._paths[nodes] = (sum(lat for _, lat in hops),
                                          min(bw for bw, _ in hops) * (1 << 30) / 1_000_000_000)
        return int(found[0] + size_bytes / found[1])

    def transmit(self, src: int, dst: int, size_bytes: int, on_delivered: Callback, arg: Any) -> None:
        self.messages += 1
        self.bytes += size_bytes
        if self._flows is None:
            delay = self._delays.get((src, dst, size_bytes))
            if delay is None:
                delay = self.delay_ns(src, dst, size_bytes)
        else:
            delay = self.path_delay_ns(src, dst, size_bytes)
        if self._heap is not None:  # Engine.call_later, inlined: once per message
            heappush(self._heap, (self.engine.now + delay, 1, next(self._ids), on_delivered, arg))
        else:
            self.engine.call_later(delay, on_delivered, arg)


class Link:
    """A directed link: a FIFO server with a bandwidth and a latency, and its usage counters."""

    __slots__ = ("busy", "busy_ns", "bytes", "dst", "free_at", "free_id", "free_queued", "history", "latency_ns",
                 "max_queue", "messages", "name", "pending", "per_ns", "src")

    def __init__(self, src: int, dst: int, bytes_per_ns: float, latency_ns: float, name: str | None = None) -> None:
        self.name = name or f"{src}->{dst}"
        self.src = src
        self.dst = dst
        self.per_ns = bytes_per_ns
        self.latency_ns = latency_ns
        self.busy = False
        # the message engine frees links lazily: the time and event id the link frees at, and whether that
        # event is on the heap (only once a message waits for it)
        self.free_at = -1
        self.free_id = -1
        self.free_queued = False
        self.pending: deque[_Message] = deque()
        self.bytes = 0
        self.busy_ns = 0
        self.messages = 0
        self.max_queue = 0
        self.history: list[tuple[int, int]] | None = None  # busy intervals, kept for timelines


class _Message:
    __slots__ = ("arg", "callback", "hop", "origin", "root", "route", "size", "touches")

    def __init__(self, size: int, route: list[Link], callback: Callback, arg: Any, origin: Any,
                 touches: list[Any] | None = None, root: int | None = None) -> None:
        self.size = size
        self.route = route
        self.hop = 0
        self.callback = callback
        self.arg = arg
        self.origin = origin  # on whose behalf its events are scheduled (representative-rank runs only)
        self.touches = touches  # per hop, the offset of its link's events, ((owner, label),) (quotient runs only)
        self.root = root  # the rank its events descend from (quotient runs: simulator/quotient_run.py)


class Classes(Protocol):
    """Classes of equivalent ranks (simulator/quotient.py's Quotient), for links shared by a class."""

    rep_list: list[int]

    def relative(self, a: int, b: int) -> int: ...

    def label(self, rank: int) -> tuple[int, ...]: ...


class CongestionAware:
    """Per-link FIFO store-and-forward network (ASTRA-sim's congestion-aware model, extended to N-D)."""

    name = "analytical-aware"

    def __init__(self, config: NetworkConfig, engine: Clock, symmetric: bool = False,
                 classes: Classes | None = None) -> None:
        self.config = config
        self.engine = engine
        self.symmetric = symmetric  # one link per class of links equal under translation (representative runs)
        self.classes = classes  # one link per class of links equal under the classes' shifts (quotient runs)
        self._touches: dict[tuple[int, int], list[Any]] = {}
        self.keep_history = False  # record every link's busy intervals (for timelines)
        self.links: dict[tuple[Any, Any], Link] = {}
        self._routes: dict[tuple[int, int], list[Link]] = {}
        self._strides = []
        stride = 1
        for n in config.npus_count:
            self._strides.append(stride)
            stride *= n
        self._switch_base = config.num_npus
        self._switch_ids: dict[tuple[int, int], int] = {}  # (dim, line) -> device id
        self._flows = Flows(EcmpRouter(config.fabric)) if config.fabric is not None else None
        self._checked = hasattr(engine, "insert_offset")  # a representative-rank or quotient run's engine
        # where the engine lets the hot path push its events itself (simulator/engine.py: Engine.scheduler)
        self._heap, self._ids = (None, None) if self._checked or not hasattr(engine, "scheduler") else \
            engine.scheduler()
        self._on_arrived = self._arrived  # bound once, not per hop
        self._on_free = self._free

    # --- topology ---------------------------------------------------------------------------------
    def _class(self, a: int, b: int, dim: int) -> tuple[Any, Any, Any]:
        """A link's class in a quotient run: its key, and the (owner, label) of its events. A link leaving an
        NPU belongs to that NPU's class (its events are the NPU's: it alone puts first hops on it); a link
        from a switch down to an NPU, to the class of that NPU."""
        q = self.classes
        assert q is not None
        n = self.config.num_npus
        if a >= n:
            key: Any = ("down", dim, q.rep_list[b])
            return key, key, q.label(b)
        rep = q.rep_list[a]
        key = ("up", dim, rep) if b >= n else ("link", rep, q.relative(b, a))
        return key, rep, q.label(a)

    def _link(self, a: int, b: int, dim: int) -> Link:
        key: tuple[Any, Any] = (a, b)
        if self.classes is not None:
            key = self._class(a, b, dim)[0]
        elif self.symmetric:
            n = self.config.num_npus
            if b >= n:
                key = ("npu", ("switch", dim))
            elif a >= n:
                key = (("switch", dim), "npu")
            else:
                key = (0, self._difference(b, a))
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = Link(a, b, self.config.bytes_per_ns(dim), self.config.latency_ns[dim])
            if self.keep_history:
                link.history = []
        return link

    def _difference(self, b: int, a: int) -> int:
        """b - a in the group of coordinates (per dimension, modulo its size)."""
        out = 0
        for n, stride in zip(self.config.npus_count, self._strides, strict=True):
            out += (((b // stride) % n - (a // stride) % n) % n) * stride
        return out

    def _switch(self, dim: int, npu: int) -> int:
        line = npu - (npu // self._strides[dim]) % self.config.npus_count[dim] * self._strides[dim]
        key = (dim, line)
        sid = self._switch_ids.get(key)
        if sid is None:
            sid = self._switch_ids[key] = self._switch_base + len(self._switch_ids)
        return sid

    def route(self, src: int, dst: int) -> list[Link]:
        """The links a message from ``src`` to ``dst`` takes (dimension-order routing, or ECMP on a fabric)."""
        if self._flows is not None:
            return self._fabric_route(src, dst)
        cached = self._routes.get((src, dst))
        if cached is not None:
            return cached
        steps = list(dimension_order_hops(self.config.npus_count, self.config.topology, src, dst, self._switch))
        hops = [self._link(a, b, dim) for a, b, dim in steps]
        self._routes[(src, dst)] = hops
        if self.classes is not None:
            # per hop, the offset of its link's events: (owner, label) of the link's class
            self._touches[(src, dst)] = [(((c := self._class(a, b, dim))[1], c[2]),) for a, b, dim in steps]
        return hops

    def _fabric_route(self, src: int, dst: int) -> list[Link]:
        assert self._flows is not None and self.config.fabric is not None
        fabric = self.config.fabric
        nodes = self._flows.path(src, dst)
        hops = []
        for a, b in itertools.pairwise(nodes):
            link = self.links.get((a, b))
            if link is None:
                bw, lat = fabric.link(a, b)
                link = self.links[(a, b)] = Link(a, b, bw * (1 << 30) / 1_000_000_000, lat, fabric.link_name(a, b))
                if self.keep_history:
                    link.history = []
            hops.append(link)
        return hops

    # --- transmission -----------------------------------------------------------------------------
    def transmit(self, src: int, dst: int, size_bytes: int, on_delivered: Callback, arg: Any) -> None:
        route = self._routes.get((src, dst)) if self._flows is None else None
        if route is None:
            route = self.route(src, dst)
        if self._checked:  # a folded run: on whose behalf the message's events are scheduled
            msg = _Message(size_bytes, route, on_delivered, arg, self.engine.insert_offset,  # type: ignore[attr-defined]
                           self._touches.get((src, dst)), getattr(self.engine, "insert_root", None))
        else:
            msg = _Message(size_bytes, route, on_delivered, arg, None, None)
        self._enter(route[0], msg)

    def _enter(self, link: Link, msg: _Message) -> None:
        if self._heap is None:
            if link.busy:
                self._wait(link, msg)
            else:
                self._start(link, msg)
            return
        # The message engine: a link's free event goes on the heap only when a message has to wait for it, with
        # the id drawn when the link started sending, so it runs where it always would among same-time events
        # (a link nobody waits for costs no event). The link is busy until its free event has run.
        if link.free_queued:
            self._wait(link, msg)
            return
        now = self.engine.now
        if now < link.free_at or (now == link.free_at and self.engine.current_id < link.free_id):  # type: ignore
            heappush(self._heap, (link.free_at, 1, link.free_id, self._on_free, link))
            link.free_queued = True
            self._wait(link, msg)
        else:
            self._start(link, msg)

    @staticmethod
    def _wait(link: Link, msg: _Message) -> None:
        link.pending.append(msg)
        if len(link.pending) > link.max_queue:
            link.max_queue = len(link.pending)

    def _start(self, link: Link, msg: _Message) -> None:
        link.busy = True  # (the message engine reads free_at and free_id instead)
        size = msg.size
        serialization = size / link.per_ns
        link.bytes += size
        link.messages += 1
        busy = int(serialization)
        link.busy_ns += busy
        engine = self.engine
        if link.history is not None:
            link.history.append((engine.now, engine.now + busy))
        if self._heap is not None:  # the message engine: the arrival's event; the free event's time and id
            now = engine.now
            heappush(self._heap, (now + int(link.latency_ns + serialization), 1, next(self._ids), self._on_arrived,
                                  msg))
            link.free_at = now + busy
            link.free_id = next(self._ids)  # type: ignore[arg-type]
        elif msg.touches is not None:  # a quotient run: each event says which class (link or rank) it touches
            hop, touches = msg.hop, msg.touches
            engine.call_later(int(link.latency_ns + serialization), self._on_arrived, msg,  # type: ignore[call-arg]
                              msg.origin if hop + 1 == len(touches) else touches[hop + 1], msg.root)
            engine.call_later(busy, self._on_free, link, touches[hop], msg.root)  # type: ignore[call-arg]
        elif msg.origin is not None:  # a representative-rank run: these events are the message's own
            current = engine.insert_offset  # type: ignore[attr-defined]
            engine.insert_offset = msg.origin  # type: ignore[attr-defined]
            engine.call_later(int(link.latency_ns + serialization), self._arrived, msg)
            engine.call_later(busy, self._free, link)
            engine.insert_offset = current  # type: ignore[attr-defined]
        else:
            engine.call_later(int(link.latency_ns + serialization), self._arrived, msg)
            engine.call_later(busy, self._free, link)

    def _free(self, link: Link) -> None:
        link.busy = link.free_queued = False
        if link.pending:
            self._start(link, link.pending.popleft())
            if link.pending and self._heap is not None:  # others still wait: the next free event goes on the heap
                heappush(self._heap, (link.free_at, 1, link.free_id, self._on_free, link))
                link.free_queued = True

    def _arrived(self, msg: _Message) -> None:
        msg.hop += 1
        if msg.hop == len(msg.route):
            msg.callback(msg.arg)
        else:
            self._enter(msg.route[msg.hop], msg)


def _packet(config: NetworkConfig, engine: Clock, symmetric: bool) -> NetworkBackend:
    from network.packet import PacketNetwork

    fabric, router = config.routed_fabric()
    return PacketNetwork(fabric, router, config.packet, engine)  # type: ignore[return-value]


BACKENDS: dict[str, Callable[[NetworkConfig, Clock, bool], NetworkBackend]] = {
    "analytical-unaware": lambda config, engine, symmetric: CongestionUnaware(config, engine),
    "analytical-aware": lambda config, engine, symmetric: CongestionAware(config, engine, symmetric),
    "packet": _packet,
}
# backends that can simulate one rank per class of equivalent ranks (simulator/quotient.py)
QUOTIENT_BACKENDS = ("analytical-unaware", "analytical-aware")
# backends that can simulate one representative rank for all (messages between equal links are interchangeable)
SYMMETRIC_BACKENDS = ("analytical-unaware", "analytical-aware")


def make_backend(name: str, config: NetworkConfig, engine: Clock, symmetric: bool = False,
                 classes: Classes | None = None) -> NetworkBackend:
    """The backend registered under ``name``; an unknown name is an error listing the valid ones.

    ``symmetric`` builds it for a single representative rank (see MirroredMessaging), ``classes`` for one rank
    per class of equivalent ranks (a QUOTIENT_BACKENDS name).
    """
    from workload.errors import InputError

    build = BACKENDS.get(name)
    if build is None:
        raise InputError(f"unknown network backend {name!r}; valid: {', '.join(BACKENDS)}")
    if classes is not None and name == "analytical-aware":
        return CongestionAware(config, engine, classes=classes)
    return build(config, engine, symmetric)
