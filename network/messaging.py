"""Point-to-point messaging over a backend, with ASTRA-sim's send/receive matching.

A send and a receive match on (tag, source, destination, size), the n-th send with that key meeting
the n-th receive. When the data arrives the send's callback runs, then the receive's if it is posted;
a receive posted after the arrival completes at once (in a zero-delay event).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from network.backends import Callback, Clock, NetworkBackend


class _Match:
    """One send and the receive it matches (either may come first), and whether its data has arrived."""

    __slots__ = ("arrived", "on_received", "on_sent", "recv_arg", "send_arg", "sent", "seq")

    def __init__(self, seq: int) -> None:
        self.seq = seq  # the n-th send and the n-th receive of its key match
        self.sent = False
        self.on_sent: Callback | None = None
        self.send_arg: Any = None
        self.on_received: Callback | None = None
        self.recv_arg: Any = None
        self.arrived = False


class _Channel:
    """The matches of one (tag, source, destination, size) key still waiting for their other half: only
    sends or only receives, oldest first (the n-th send meets the n-th receive)."""

    __slots__ = ("count", "sends", "waiting")

    def __init__(self) -> None:
        self.count = 0  # matches begun so far
        self.waiting: deque[_Match] = deque()
        self.sends = False  # what waits: sends (True) or receives


class Messaging:
    """Sends and receives between NPUs; counts what crosses the network."""

    __slots__ = ("_channels", "_own", "backend", "clock", "messages")

    def __init__(self, clock: Clock, backend: NetworkBackend) -> None:
        self.clock = clock
        self._own: dict[str, int] = {"offset": 0} if hasattr(clock, "insert_offset") else {}
        self.backend = backend
        self._channels: dict[tuple[int, int, int, int], _Channel] = {}
        self.messages = 0

    def _match(self, tag: int, src: int, dst: int, size: int, send: bool) -> tuple[_Match, bool]:
        """The match of the next send (``send``) or receive with this key, and whether its other half came
        first."""
        key = (tag, src, dst, size)
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = _Channel()
        waiting = channel.waiting
        if waiting and channel.sends != send:
            return waiting.popleft(), True
        channel.count += 1
        entry = _Match(channel.count)
        waiting.append(entry)
        channel.sends = send
        return entry, False

    def _post_send(self, entry: _Match, on_sent: Callback | None, arg: Any) -> None:
        entry.on_sent = on_sent
        entry.send_arg = arg
        entry.sent = True
        self.messages += 1

    def send(self, src: int, dst: int, size_bytes: int, tag: int, on_sent: Callback | None, arg: Any = None) -> None:
        """Send; ``on_sent(arg)`` runs when the data arrives at ``dst`` (None: nothing to call)."""
        entry, _ = self._match(tag, src, dst, size_bytes, True)
        self._post_send(entry, on_sent, arg)
        self.backend.transmit(src, dst, size_bytes, self._arrived, entry)

    def recv(self, dst: int, src: int, size_bytes: int, tag: int, on_received: Callback, arg: Any = None) -> None:
        """Post a receive at ``dst``; ``on_received(arg)`` runs when the matching data has arrived."""
        entry, _ = self._match(tag, src, dst, size_bytes, False)
        if entry.arrived:
            self.clock.call_later(0, on_received, arg, **self._own)
            return
        entry.on_received = on_received
        entry.recv_arg = arg

    def _arrived(self, entry: _Match) -> None:
        if entry.on_sent is not None:
            entry.on_sent(entry.send_arg)
        if entry.on_received is not None:
            entry.on_received(entry.recv_arg)
        else:
            entry.arrived = True

    def unmatched(self) -> list[tuple[int, int, int, int, int, str]]:
        """Messages still waiting: (tag, src, dst, size, n, "receive posted, no send" / "arrived, no receive")."""
        out = []
        for (tag, src, dst, size), channel in self._channels.items():
            for e in channel.waiting:
                state = "arrived, never received" if e.arrived else (
                    "in flight" if e.sent else "receive posted, nothing sent")
                out.append((tag, src, dst, size, e.seq, state))
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
        entry, _ = self._match(tag, self.mirror(src, dst), src, size_bytes, True)
        self._post_send(entry, on_sent, arg)  # my own send's completion happens at the same time
        clock = self.clock
        own = clock.insert_offset  # type: ignore[attr-defined]
        # What is scheduled now stands for other ranks' events. Without links, messages with the same tag (one
        # collective stream) are interchangeable for the receiving algorithm, so the order among them cannot
        # matter; through links it can (they queue behind each other on routes of different lengths).
        origin = ("message", tag) if self.interchangeable else ("message", tag, dst - src)
        clock.insert_offset = origin  # type: ignore[attr-defined]
        self.backend.transmit(src, dst, size_bytes, self._arrived, entry)
        clock.insert_offset = own  # type: ignore[attr-defined]
