"""Running one rank per class (simulator/quotient.py), and the guard that makes it exact.

**Messages.** When representative ``a`` sends to ``b = g(c)`` (``c`` a representative, ``g`` a combination of
shifts), the image of that message under ``g^-1`` is a message from ``g^-1(a)`` to ``c``: it is delivered to
``c`` at the time ``b`` would receive it, its tag translated to the image of its communicator group
(``QuotientMessaging``).

**Events.** Each event of the run stands for one event of the full run and its images under every shift. It
says which state it touches and on whose behalf: pairs (owner, label), the owner a representative rank or a
class of links, the label the shift that takes the real instance (the receiving rank, the link) to the
representative. It also carries what decides where the full run puts it among same-time events:

- the full run orders same-time events by when they were scheduled, and events scheduled at the same time by
  the order of the events that scheduled them, back to the start, where ranks start in rank order. ``chain``
  hashes an event's times of scheduling back to the start (equal chains: the two orders are decided at the
  start; different ones: by an earlier time, alike in every image);
- ``root``: the rank whose start the event descends from, in the frame of the event's labels.

**The guard.** Two same-time events of one owner, scheduled at the same time by different events (or on behalf
of different instances), are ordered alike in every image and as this run orders them when their chains
differ, or when their roots, seen from the owner's representative, are ``u`` before ``v`` under every shift.
Otherwise real ranks of a class would order them differently (a ring of sends: the first rank of the ring
completes its own send before the receive from its predecessor, every other rank the reverse): the run stops
(``Diverged``) naming the generators that reverse the pair, and the simulation retries with a finer quotient
without them, then with every rank.
"""

from __future__ import annotations

from heapq import heappush
from typing import Any

from network.backends import Callback, NetworkBackend
from network.messaging import Match, Messaging
from simulator.engine import CheckedEngine
from simulator.quotient import Quotient
from simulator.system import COLLECTIVE, HANDSHAKE, CommGroup

GROUP_STREAMS = 1_000_000  # a communicator group's stream ids start at gid x this (simulator/system.py)
_INHERIT: Any = object()  # call_later: the root of the events scheduled now (no explicit root)
Offset = tuple[tuple[Any, tuple[int, ...]], ...]


class Diverged(Exception):
    """Real ranks of a class would order same-time events differently; ``culprits``: the generators (indices
    into Quotient.shifts) to drop for a finer quotient (empty: none known, simulate every rank)."""

    def __init__(self, why: str, culprits: frozenset[int]) -> None:
        super().__init__(why)
        self.culprits = culprits


class QuotientEngine(CheckedEngine):
    """A CheckedEngine for quotient runs (see the module docstring); stops the run with ``Diverged``."""

    __slots__ = ("_chain", "_owns", "_pseudo", "_reference", "_root", "identity", "insert_root", "quotient")

    def __init__(self, quotient: Quotient) -> None:
        super().__init__()
        self.quotient = quotient
        self.identity: tuple[int, ...] = (0,) * len(quotient.orders)  # the label of a representative's own events
        self._root: int | None = None  # the running event's root (None: unknown)
        self._reference: Offset = ()  # the running event's offset: the frame its code acts in
        self._chain = hash((-1, 0))  # the chain of the events scheduled now
        self.insert_root: int | None = None  # the root of events scheduled on behalf of insert_offset
        self._owns: dict[int, Offset] = {}
        self._pseudo = -1 - len(quotient.rep_of)  # parents of what start_context starts (start_rank: -1 - rank)

    def own(self, rank: int) -> Offset:  # type: ignore[override]
        """The offset of a representative's own events (one object per rank: compared by identity first)."""
        found = self._owns.get(rank)
        if found is None:
            found = self._owns[rank] = ((rank, self.identity),)
        return found

    def start_rank(self, rank: int, stalled: bool = False) -> None:
        """What runs next starts ``rank``'s events (its wake at set-up, or after a stall): in the full run ranks
        start in rank order, each after the events already scheduled."""
        self._current = -1 - rank
        self._root = self.insert_root = rank
        self._reference = self.insert_offset = self.own(rank)
        self._chain = hash(("stalled", self.env._now)) if stalled else hash((-1, 0))

    def start_context(self, rank: int, offset: Offset | None, tag: Any) -> None:
        """What runs next starts events of ``rank`` afresh, on behalf of ``offset`` (None: the rank's own), in a
        shared event whose parts run in rank order, as the full run orders them (simulator/nccl_flows.py);
        ``tag`` names that event (its time, or (time, how many such events ran before it at that time))."""
        self._pseudo -= 1
        self._current = self._pseudo
        self._root = self.insert_root = rank
        self._reference = self.insert_offset = self.own(rank) if offset is None else offset
        self._chain = hash(tag)
        # the part touches its owners as an event would: parts of one shared event are ordered by their ranks
        self._touch((None, None, self.env._now, self._current, self._reference, None, self._chain, rank))

    def call_first(self, delay: int, fn: Callback, arg: Any = None) -> None:
        """An event before every other of its time, touching no rank (the NCCL model's completions, which then
        start each rank's part with start_context)."""
        self._next_id += 1
        now = self.env._now
        payload = (fn, arg, now, self._current, (), self._next_id, self._chain, None)
        heappush(self._queue, (now + delay, 0, next(self._eid), self._checked_dispatch, payload))

    def frame_root(self, offset: Offset) -> int | None:
        """The root of an event on behalf of ``offset``, scheduled by code acting on the instance of the first
        owner it shares with the running event (a rank's own events, scheduled by the rank)."""
        root = self._root
        if root is None or offset is self._reference:
            return root
        for owner, label in offset:
            for o, ref in self._reference:
                if o == owner:
                    return root if ref == label else self.quotient.moved(root, label, ref)
        return None

    def call_as(self, delay: int, fn: Callback, arg: Any, offset: Offset) -> None:
        """call_later on behalf of ``offset``, its root the frame's (frame_root): a rank's own events (RankEvents),
        the hot path of a run."""
        self._next_id += 1
        root = self._root
        if root is not None and offset is not self._reference:
            root = self.frame_root(offset)
        now = self.env._now
        heappush(self._queue, (now + delay, 1, next(self._eid), self._dispatch,
                               (fn, arg, now, self._current, offset, self._next_id, self._chain, root)))

    def call_later(self, delay: int, fn: Callback, arg: Any = None, offset: Any = None,  # type: ignore[override]
                   root: Any = _INHERIT) -> None:
        self._next_id += 1
        if offset is None:
            offset = self.insert_offset
            if root is _INHERIT:
                root = self.insert_root
        elif root is _INHERIT:
            root = self.frame_root(offset)
        now = self.env._now
        heappush(self._queue, (now + delay, 1, next(self._eid), self._dispatch,
                               (fn, arg, now, self._current, offset, self._next_id, self._chain, root)))

    def _checked_dispatch(self, payload: tuple[Any, ...]) -> None:
        fn, arg, inserted, _, offset, eid, chain, root = payload
        now = self.env._now
        if offset:  # _touch, inlined: once per event
            if now != self._seen_tick:
                self._seen_tick = now
                seen = self._seen = {}
            else:
                seen = self._seen
            for owner, label in offset:
                key = (inserted, owner)
                before = seen.get(key)
                seen[key] = payload  # consecutive pairs in order suffice: the full run's order is total
                if before is not None:
                    self._after(before, payload, owner, label)
        self._current = eid
        self.insert_offset = self._reference = offset
        self.insert_root = self._root = root
        self._chain = hash((now, chain))
        fn(arg)

    def _touch(self, payload: tuple[Any, ...]) -> None:
        """Check an event (payload) against the same-time events before it that touched its owners."""
        now = self.env._now
        if now != self._seen_tick:
            self._seen_tick = now
            self._seen = {}
        seen = self._seen
        for owner, label in payload[4]:
            key = (payload[2], owner)
            before = seen.get(key)
            seen[key] = payload
            if before is not None:
                self._after(before, payload, owner, label)

    def _after(self, before: tuple[Any, ...], payload: tuple[Any, ...], owner: Any, label: tuple[int, ...]) -> None:
        """An event (payload) touches ``owner`` as ``label`` after ``before`` did, at the same time, both scheduled
        at the same time: check that the full run orders them so in every image."""
        _, _, _, parent, offset, _, chain, root = payload
        if before is payload:  # the event touches two instances of the owner's class
            first = next(lb for o, lb in offset if o == owner)
            if first != label:
                self._compare(chain, root, first, chain, root, label)
        elif before[3] != parent or _label(before, owner) != label:
            self._compare(before[6], before[7], _label(before, owner), chain, root, label)

    def _compare(self, c1: int, r1: int | None, l1: tuple[int, ...], c2: int, r2: int | None, l2: tuple[int, ...]
                 ) -> None:
        """Two events (chain, root, label) ran in this order, same time, same owner, scheduled at the same time by
        different events (or on behalf of different instances): raise Diverged unless the full run orders them
        so in every image."""
        if c1 != c2:
            return  # decided where their chains part: by a time of scheduling, alike in every image
        q = self.quotient
        if r1 is None or r2 is None:
            raise Diverged("same-time events of unknown origin", frozenset(range(len(q.orders))))
        u = q.moved(r1, self.identity, l1)
        v = q.moved(r2, self.identity, l2)
        if u == v:
            return  # one rank's start: the same real event, then the same program order
        culprits = q.broken_by(u, v)
        if culprits:
            raise Diverged(f"same-time events descending from ranks {u} and {v} make ranks of a class diverge",
                           culprits)


def _label(payload: tuple[Any, ...], owner: Any) -> tuple[int, ...]:
    """The label of ``owner`` in an event's offset (the last, if it names the owner twice)."""
    found: tuple[int, ...] = ()
    for o, label in payload[4]:
        if o == owner:
            found = label
    return found


class QuotientMessaging(Messaging):
    """Messaging among representatives: a send to any rank is delivered to that rank's representative as the
    image of the message under the shifts that take the representative to it (see the module docstring)."""

    __slots__ = ("_names", "_routes", "_translated", "groups_of", "quotient")

    def __init__(self, clock: QuotientEngine, backend: NetworkBackend, quotient: Quotient) -> None:
        super().__init__(clock, backend)
        self.quotient = quotient
        self.groups_of: dict[int, dict[int, CommGroup]] = {}  # representative -> its groups (RankWorkload.groups)
        self._names: dict[int, dict[int, int]] = {}  # representative -> {internal gid: group number}
        self._translated: dict[tuple[int, int, int], int] = {}
        # (src, dst) -> (the representative of dst, src as it sees it, the delivery's offset without and with the
        # sender's completion, the sender's own offset)
        self._routes: dict[tuple[int, int], tuple[int, int, Offset, Offset, Offset]] = {}

    def _tag(self, tag: int, src: int, dst: int) -> int:
        """The wire tag of the message's image: a collective stream of a group goes to the image group."""
        kind, stream = tag & 3, tag >> 2
        if stream < GROUP_STREAMS or kind not in (COLLECTIVE, COLLECTIVE + HANDSHAKE):
            return tag
        gid = stream // GROUP_STREAMS
        key = (gid, src, dst)
        theirs = self._translated.get(key)
        if theirs is None:
            names = self._names.get(src)
            if names is None:
                names = self._names[src] = {g.gid: number for number, g in self.groups_of.get(src, {}).items()}
            number = names.get(gid)
            if number is None:
                return tag
            q = self.quotient
            label = q.label(dst)
            image = q.group_image(number, label)
            if image is None:
                raise Diverged(f"group {number} has no image under the shifts",
                               frozenset(k for k, e in enumerate(label) if e))
            theirs = self._translated[key] = image + (gid - number)  # gid: the number (+1 when a trace declares it)
        return 4 * (theirs * GROUP_STREAMS + stream % GROUP_STREAMS) + kind

    def send(self, src: int, dst: int, size_bytes: int, tag: int, on_sent: Callback | None, arg: Any = None) -> None:
        clock: QuotientEngine = self.clock  # type: ignore[assignment]
        route = self._routes.get((src, dst))
        if route is None:
            q = self.quotient
            rep = q.rep_list[dst]
            # the delivery touches the receiving representative on behalf of dst, and the sender when it completes
            # a send of its own
            touched = ((rep, q.label(dst)),)
            route = self._routes[(src, dst)] = (rep, q.relative(src, dst), touched, (*touched, (src, clock.identity)),
                                                clock.own(src))
        rep, source, touched, with_sender, sender = route
        if tag >> 2 >= GROUP_STREAMS:  # a group's stream: the image group's
            tag = self._tag(tag, src, dst)
        key = (tag, source, rep, size_bytes)
        entry = self._waiting.get(key)
        if entry is None:  # nothing waits: the common case, matched here without a call (Messaging.send)
            self._waiting[key] = entry = Match()
        else:
            entry = self._match(key, True, entry)
        entry.on_sent = on_sent
        entry.send_arg = arg
        entry.sent = True
        self.messages += 1
        own, own_root = clock.insert_offset, clock.insert_root
        root = clock._root  # the message's frame: the sender's own (frame_root, inlined for the usual case)
        clock.insert_root = root if root is None or sender is clock._reference else clock.frame_root(sender)
        if self._halves is not None:  # the sender's half on its own behalf, the receiver's on dst's (rooted there)
            self._halves(src, dst, size_bytes, self, entry, ((sender, src), (touched, dst)), rep)
        else:
            clock.insert_offset = with_sender if on_sent is not None else touched
            self.backend.transmit(src, dst, size_bytes, self._on_arrival, entry)
        clock.insert_offset, clock.insert_root = own, own_root

    def recv(self, dst: int, src: int, size_bytes: int, tag: int, on_received: Callback, arg: Any = None) -> None:
        key = (tag, src, dst, size_bytes)
        entry = self._waiting.get(key)
        if entry is None:  # nothing sent yet: the common case, matched without a call (Messaging.recv)
            self._waiting[key] = entry = Match()
        else:
            entry = self._match(key, False, entry)
            if entry.arrived:
                self.clock.call_later(0, on_received, arg, offset=self.clock.own(dst))  # type: ignore[attr-defined]
                return
        entry.on_received = on_received
        entry.recv_arg = arg
        if self._post_order is not None:
            entry.order = self._post_order(dst)
