"""Point-to-point messaging over a backend, with ASTRA-sim's send/receive matching.

A send and a receive match on (tag, source, destination, size), the n-th send with that key meeting
the n-th receive. When the data arrives the send's callback runs, then the receive's if it is posted;
a receive posted after the arrival completes at once (in a zero-delay event). A backend that orders
same-time completions by each rank's issue order (the NCCL model) completes the two halves apart instead.
"""

from __future__ import annotations

from typing import Any

from network.backends import Callback, Clock, NetworkBackend

LAST = 1 << 62  # after every issue counter


class Match:
    """One send and the receive it matches (either may come first), and whether its data has arrived. Matches
    still waiting for their other half form one FIFO per (tag, source, destination, size) key: the oldest is
    in ``Messaging._waiting``, each points to the next (``later``), and the oldest knows the newest (``last``;
    None: itself, so that no match refers to itself and garbage stays free of cycles)."""

    __slots__ = ("arrived", "last", "later", "on_received", "on_sent", "order", "recv_arg", "send_arg", "sent")

    def __init__(self) -> None:
        self.sent = False  # a send has been posted (while waiting: the queue holds sends, not receives)
        self.on_sent: Callback | None = None
        self.send_arg: Any = None
        self.on_received: Callback | None = None
        self.recv_arg: Any = None
        self.arrived = False
        self.later: Match | None = None
        self.last: Match | None = None
        self.order = LAST  # the receive's place in its rank's issue order (backends that order completions)

    def receive_order(self) -> int:
        """Where the delivery's receiving half goes among its rank's same-time completions: the receive's place in
        the rank's issue order, or after all of them when no receive is posted yet (the data then waits)."""
        return self.order if self.on_received is not None else LAST


class Messaging:
    """Sends and receives between NPUs; counts what crosses the network.

    Matching is the hot path of every message: one dict look-up finds the oldest unmatched half of the key,
    and a key's entry disappears once nothing waits on it (memory stays proportional to what is in flight)."""

    __slots__ = ("_halves", "_on_arrival", "_own", "_post_order", "_waiting", "backend", "clock", "messages")

    def __init__(self, clock: Clock, backend: NetworkBackend) -> None:
        self.clock = clock
        self._own: dict[str, int] = {"offset": 0} if hasattr(clock, "insert_offset") else {}
        self.backend = backend
        self._waiting: dict[tuple[int, int, int, int], Match] = {}
        self.messages = 0
        self._on_arrival = self._arrived  # bound once, not per message
        # a backend that completes a delivery's two halves apart, each in its own rank's issue order (the NCCL
        # model: simulator/nccl_run.py), numbers each posted receive and is handed both halves
        self._post_order = getattr(backend, "post_order", None)
        self._halves = getattr(backend, "transmit_halves", None)

    def _match(self, key: tuple[int, int, int, int], send: bool, head: Match | None = None) -> Match:
        """The match of the next send (``send``) or receive with this key: the oldest waiting other half, or a
        new match queued behind the key's others. ``head``: the key's waiting entry when the caller has it."""
        waiting = self._waiting
        if head is None:
            head = waiting.get(key)
        if head is None:
            waiting[key] = entry = Match()
            return entry
        if head.sent != send:  # the oldest waiting other half: take it off the queue
            later = head.later
            if later is None:
                del waiting[key]
            else:
                if head.last is not later:
                    later.last = head.last
                waiting[key] = later
            return head
        entry = Match()
        (head.last or head).later = entry
        head.last = entry
        return entry

    def send(self, src: int, dst: int, size_bytes: int, tag: int, on_sent: Callback | None, arg: Any = None) -> None:
        """Send; ``on_sent(arg)`` runs when the data arrives at ``dst`` (None: nothing to call)."""
        key = (tag, src, dst, size_bytes)
        head = self._waiting.get(key)
        if head is None:  # nothing waits: the common case, matched here without a call
            self._waiting[key] = entry = Match()
        else:
            entry = self._match(key, True, head)
        entry.on_sent = on_sent
        entry.send_arg = arg
        entry.sent = True
        self.messages += 1
        if self._halves is not None:
            self._halves(src, dst, size_bytes, self, entry)
        else:
            self.backend.transmit(src, dst, size_bytes, self._on_arrival, entry)

    def recv(self, dst: int, src: int, size_bytes: int, tag: int, on_received: Callback, arg: Any = None) -> None:
        """Post a receive at ``dst``; ``on_received(arg)`` runs when the matching data has arrived."""
        key = (tag, src, dst, size_bytes)
        head = self._waiting.get(key)
        if head is None:
            self._waiting[key] = entry = Match()
        else:
            entry = self._match(key, False, head)
            if entry.arrived:
                self.clock.call_later(0, on_received, arg, **self._own)
                return
        entry.on_received = on_received
        entry.recv_arg = arg
        if self._post_order is not None:
            entry.order = self._post_order(dst)

    def _arrived(self, entry: Match) -> None:
        if entry.on_sent is not None:
            entry.on_sent(entry.send_arg)
        if entry.on_received is not None:
            entry.on_received(entry.recv_arg)
        else:
            entry.arrived = True

    def sent_half(self, entry: Match) -> None:
        """The sender's half of a delivery (transmit_halves): its send completes."""
        if entry.on_sent is not None:
            entry.on_sent(entry.send_arg)

    def received_half(self, entry: Match) -> None:
        """The receiver's half of a delivery: its receive completes, or the data waits for it."""
        if entry.on_received is not None:
            entry.on_received(entry.recv_arg)
        else:
            entry.arrived = True

    def unmatched(self) -> list[tuple[int, int, int, int, int, str]]:
        """Messages still waiting: (tag, src, dst, size, place in its key's queue (1: oldest), "receive posted,
        nothing sent" / "in flight" / "arrived, never received")."""
        out = []
        for (tag, src, dst, size), entry in self._waiting.items():
            place: Match | None = entry
            n = 0
            while place is not None:
                n += 1
                state = "arrived, never received" if place.arrived else (
                    "in flight" if place.sent else "receive posted, nothing sent")
                out.append((tag, src, dst, size, n, state))
                place = place.later
        return out


class MirroredMessaging(Messaging):
    """Messaging for a single representative rank of a translation-symmetric run.

    When every rank does the same thing relative to its position, the message rank X sends to me is the
    image of the message I send to R, with X = me - (R - me) in every dimension: it arrives when mine
    would arrive at R. So each of my sends is delivered back to me, as coming from X.
    """

    __slots__ = ("_dims", "_mirror", "interchangeable")

    def __init__(self, clock: Clock, backend: NetworkBackend, npus_per_dim: tuple[int, ...]) -> None:
        super().__init__(clock, backend)
        self.interchangeable = not hasattr(backend, "links")
        self._mirror: dict[tuple[int, int], int] = {}
        self._dims = npus_per_dim

    def mirror(self, me: int, dst: int) -> int:
        key = (me, dst)
        src = self._mirror.get(key)
        if src is None:
            src, stride = 0, 1
            for n in self._dims:
                a, b = (me // stride) % n, (dst // stride) % n
                src += ((2 * a - b) % n) * stride
                stride *= n
            self._mirror[key] = src
        return src

    def send(self, src: int, dst: int, size_bytes: int, tag: int, on_sent: Callback | None, arg: Any = None) -> None:
        entry = self._match((tag, self.mirror(src, dst), src, size_bytes), True)
        entry.on_sent = on_sent  # my own send's completion happens at the same time
        entry.send_arg = arg
        entry.sent = True
        self.messages += 1
        clock = self.clock
        own = clock.insert_offset  # type: ignore[attr-defined]
        # What is scheduled now stands for other ranks' events. Without links, messages with the same tag (one
        # collective stream) are interchangeable for the receiving algorithm, so the order among them cannot
        # matter; through links it can (they queue behind each other on routes of different lengths).
        origin = ("message", tag) if self.interchangeable else ("message", tag, dst - src)
        clock.insert_offset = origin  # type: ignore[attr-defined]
        self.backend.transmit(src, dst, size_bytes, self._arrived, entry)
        clock.insert_offset = own  # type: ignore[attr-defined]
