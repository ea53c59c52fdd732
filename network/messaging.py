"""Point-to-point messaging over a backend, with ASTRA-sim's send/receive matching.

A send and a receive match on (tag, source, destination, size), the n-th send with that key meeting
the n-th receive. When the data arrives the send's callback runs, then the receive's if it is posted;
a receive posted after the arrival completes at once (in a zero-delay event).
"""

from __future__ import annotations

from typing import Any

from network.backends import Callback, Clock, NetworkBackend


class _Match:
    __slots__ = ("arrived", "on_received", "on_sent", "recv_arg", "send_arg", "sent")

    def __init__(self) -> None:
        self.sent = False
        self.on_sent: Callback | None = None
        self.send_arg: Any = None
        self.on_received: Callback | None = None
        self.recv_arg: Any = None
        self.arrived = False


class Messaging:
    """Sends and receives between NPUs; counts what crosses the network."""

    __slots__ = ("_entries", "_own", "_recv_seq", "_send_seq", "backend", "clock", "messages")

    def __init__(self, clock: Clock, backend: NetworkBackend) -> None:
        self.clock = clock
        self._own: dict[str, int] = {"offset": 0} if hasattr(clock, "insert_offset") else {}
        self.backend = backend
        self._send_seq: dict[tuple[int, int, int, int], int] = {}
        self._recv_seq: dict[tuple[int, int, int, int], int] = {}
        self._entries: dict[tuple[int, int, int, int, int], _Match] = {}
        self.messages = 0

    def _slot(self, counters: dict[tuple[int, int, int, int], int], tag: int, src: int, dst: int, size: int
              ) -> tuple[tuple[int, int, int, int, int], _Match]:
        """The match entry of the next send (or receive) with this key."""
        key = (tag, src, dst, size)
        seq = counters.get(key, 0) + 1
        counters[key] = seq
        full = (tag, src, dst, size, seq)
        entry = self._entries.get(full)
        if entry is None:
            entry = self._entries[full] = _Match()
        return full, entry

    def _post_send(self, entry: _Match, on_sent: Callback | None, arg: Any) -> None:
        entry.on_sent = on_sent
        entry.send_arg = arg
        entry.sent = True
        self.messages += 1

    def send(self, src: int, dst: int, size_bytes: int, tag: int, on_sent: Callback | None, arg: Any = None) -> None:
        """Send; ``on_sent(arg)`` runs when the data arrives at ``dst`` (None: nothing to call)."""
        full, entry = self._slot(self._send_seq, tag, src, dst, size_bytes)
        self._post_send(entry, on_sent, arg)
        self.backend.transmit(src, dst, size_bytes, self._arrived, full)

    def recv(self, dst: int, src: int, size_bytes: int, tag: int, on_received: Callback, arg: Any = None) -> None:
        """Post a receive at ``dst``; ``on_received(arg)`` runs when the matching data has arrived."""
        full, entry = self._slot(self._recv_seq, tag, src, dst, size_bytes)
        if entry.arrived:
            del self._entries[full]
            self.clock.call_later(0, on_received, arg, **self._own)
            return
        entry.on_received = on_received
        entry.recv_arg = arg

    def _arrived(self, full: tuple[int, int, int, int, int]) -> None:
        entry = self._entries[full]
        if entry.on_sent is not None:
            entry.on_sent(entry.send_arg)
        if entry.on_received is not None:
            del self._entries[full]
            entry.on_received(entry.recv_arg)
        else:
            entry.arrived = True

    def unmatched(self) -> list[tuple[int, int, int, int, int, str]]:
        """Messages still waiting: (tag, src, dst, size, n, "receive posted, no send" / "arrived, no receive")."""
        out = []
        for (tag, src, dst, size, seq), e in self._entries.items():
            state = "arrived, never received" if e.arrived else (
                "in flight" if e.sent else "receive posted, nothing sent")
            out.append((tag, src, dst, size, seq, state))
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
        full, entry = self._slot(self._send_seq, tag, self.mirror(src, dst), src, size_bytes)
        self._post_send(entry, on_sent, arg)  # my own send's completion happens at the same time
        clock = self.clock
        own = clock.insert_offset  # type: ignore[attr-defined]
        # What is scheduled now stands for other ranks' events. Without links, messages with the same tag (one
        # collective stream) are interchangeable for the receiving algorithm, so the order among them cannot
        # matter; through links it can (they queue behind each other on routes of different lengths).
        origin = ("message", tag) if self.interchangeable else ("message", tag, dst - src)
        clock.insert_offset = origin  # type: ignore[attr-defined]
        self.backend.transmit(src, dst, size_bytes, self._arrived, full)
        clock.insert_offset = own  # type: ignore[attr-defined]
