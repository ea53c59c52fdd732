"""Simulate one rank per class of equivalent ranks: the quotient engine.

Real traces are rarely byte-identical across ranks: pipeline stages run different programs, every rank names
its own send/receive peers and communicator groups. They are still highly regular: shifting every rank one
place along its data-parallel group (or its tensor-parallel group, or one step along a network dimension) maps
the whole workload onto itself. This module finds a group of such shifts and simulates one rank per orbit.

**The symmetries.** Candidates are the cyclic shift along each family of communicator groups (equal-length,
disjoint groups covering every rank with the same member spacing, such as all data-parallel groups: each rank
moves to the next member of its group) and the translation along each network dimension. A candidate is kept
when it is

- a symmetry of the network: in every dimension the new coordinate depends only on the old one (any bijection
  on a Switch or FullyConnected dimension, a rotation on a Ring; a rotation everywhere when collectives run on
  all NPUs, whose rings follow the coordinates), so every message takes as long as its image;
- a symmetry of the workload: every rank's trace equals its image's up to node ids and names
  (simulator/canonical.py), with send/receive peers and group members mapped by the shift (a group's member list
  may come out rotated where its algorithm is a ring or direct, which does not tell positions apart);
- compatible with those kept before: it commutes with them, and together they act freely (each rank is reached
  from its orbit's representative by exactly one combination of shifts).

**The run.** Representatives (the smallest rank of each orbit) are simulated. When representative ``a`` sends
to ``b = g(c)`` (``c`` a representative, ``g`` a combination of shifts), the image of that message under
``g^-1`` is a message from ``g^-1(a)`` to ``c``: it is delivered to ``c`` at the time ``b`` would receive it,
its tag translated to ``c``'s numbering of the communicator group. Everything a rank does happens alike on the
ranks of its orbit, so results are copied to them.

**Exactness guard.** Same-time events of one rank can only be ordered differently than in the full run when
they were scheduled at the same time by different events; the engine (``QuotientEngine``) checks this per rank
and the simulation then falls back to every rank, as it does when the quotient run does not finish.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from network.backends import Callback, NetworkBackend
from network.messaging import Messaging
from simulator.config import SystemConfig
from simulator.engine import CheckedEngine
from simulator.references import rank_references
from simulator.symmetries import XOR, Invariance, Network, Value, cycle_length, families, power, relations
from simulator.system import COLLECTIVE, HANDSHAKE, CommGroup
from workload.graph import TraceGraph

GROUP_STREAMS = 1_000_000  # a communicator group's stream ids start at gid x this (simulator/system.py)


@dataclass(slots=True)
class Quotient:
    """The orbits of a free action of commuting shifts on the ranks, and where each rank sits in its orbit."""

    representatives: list[int]
    rep_of: np.ndarray  # rank -> its orbit's representative
    orbit_of: np.ndarray  # rank -> its orbit's index
    coords: np.ndarray  # rank -> exponents of the shifts that take its representative to it
    orders: tuple[int, ...]
    table: np.ndarray  # (orbit, mixed-radix exponents) -> rank
    described: str
    _orders: np.ndarray = field(init=False, repr=False)
    _radix: np.ndarray = field(init=False, repr=False)
    _relative: dict[tuple[int, int], int] = field(init=False, repr=False)
    _labels: dict[int, tuple[int, ...]] = field(init=False, repr=False)
    rep_list: list[int] = field(init=False, repr=False)  # rep_of as a list (fast to index one rank)

    def label(self, rank: int) -> tuple[int, ...]:
        """The exponents of the shifts that take ``rank``'s representative to it (a tuple, cached)."""
        found = self._labels.get(rank)
        if found is None:
            found = self._labels[rank] = tuple(int(x) for x in self.coords[rank])
        return found

    def relative(self, a: int, b: int) -> int:
        """``g^-1(a)`` where ``g`` takes ``b``'s representative to ``b``: ``a`` as ``b``'s representative sees it."""
        key = (a, b)
        found = self._relative.get(key)
        if found is None:
            e = (self.coords[a] - self.coords[b]) % self._orders
            found = self._relative[key] = int(self.table[self.orbit_of[a], int(e @ self._radix)])
        return found

    def __post_init__(self) -> None:
        self._orders = np.array(self.orders, dtype=np.int64)
        radix = np.ones(len(self.orders), dtype=np.int64)
        for k in range(len(self.orders) - 2, -1, -1):
            radix[k] = radix[k + 1] * self.orders[k + 1]
        self._radix = radix
        self._relative = {}
        self._labels = {}
        self.rep_list = self.rep_of.tolist()

    @property
    def orbit_size(self) -> int:
        return math.prod(self.orders)


def _orbit_coordinates(gens: list[np.ndarray], orders: list[int], npus: int) -> Quotient | None:
    """Orbits and exponent coordinates of the action generated by ``gens``; None unless it is free (every
    rank of an orbit reached by exactly one exponent vector, every orbit of size prod(orders))."""
    m = len(gens)
    size = math.prod(orders)
    coords = np.full((npus, m), -1, dtype=np.int64)
    orbit_of = np.full(npus, -1, dtype=np.int64)
    reps: list[int] = []
    for start in range(npus):
        if orbit_of[start] >= 0:
            continue
        orbit = len(reps)
        reps.append(start)
        coords[start] = 0
        orbit_of[start] = orbit
        frontier = [start]
        count = 1
        while frontier:
            nxt = []
            for x in frontier:
                ex = coords[x]
                for k in range(m):
                    y = int(gens[k][x])
                    ey = ex.copy()
                    ey[k] = (ey[k] + 1) % orders[k]
                    if orbit_of[y] >= 0:
                        if orbit_of[y] != orbit or not np.array_equal(coords[y], ey):
                            return None
                        continue
                    orbit_of[y] = orbit
                    coords[y] = ey
                    count += 1
                    nxt.append(y)
            frontier = nxt
        if count != size:
            return None
    radix = np.ones(m, dtype=np.int64)
    for k in range(m - 2, -1, -1):
        radix[k] = radix[k + 1] * orders[k + 1]
    table = np.empty((len(reps), size), dtype=np.int64)
    table[orbit_of, coords @ radix] = np.arange(npus)
    rep_arr = np.array(reps, dtype=np.int64)
    return Quotient(reps, rep_arr[orbit_of], orbit_of, coords, tuple(orders), table, "")


def find_quotient(graphs: list[TraceGraph], comm_groups: dict[int, tuple[int, ...]], npus_per_dim: Sequence[int],
                  topology: Sequence[str], system: SystemConfig) -> Quotient | None:
    """The largest free action of commuting shifts this workload and network allow (None: nothing folds)."""
    keys, values = [], []
    for r, g in enumerate(graphs):
        found = rank_references(g, r, comm_groups, len(graphs))
        if found is None:
            return None
        keys.append(found[0])
        values.append(found[1])
    return quotient_of(keys, values, npus_per_dim, topology, system)


def quotient_of(keys: list[bytes], values: list[tuple[Value, ...]], npus_per_dim: Sequence[int],
                topology: Sequence[str], system: SystemConfig) -> Quotient | None:
    """``find_quotient`` from each rank's (key, values) (see rank_references), without the traces."""
    npus = len(keys)
    allowed = relations(values, system, len(npus_per_dim))
    if allowed is None:
        return None
    world, group = allowed
    invariance = Invariance(keys, values, group)
    network = Network(npus_per_dim, topology)
    candidates = families(values, npus, xor=group == XOR)
    for d, n in enumerate(network.counts):
        if n > 1:
            candidates.append((f"translation along dimension {d + 1}", network.translation(d)))
        if world is not None and world[d] == XOR:  # halving-doubling there: its XOR maps (n is a power of two)
            candidates += [(f"exchange of positions {1 << b} apart along dimension {d + 1}", network.xor(d, 1 << b))
                           for b in range(max(n.bit_length() - 2, 0))]  # the last bit is the half rotation
    gens: list[np.ndarray] = []
    orders: list[int] = []
    names: list[str] = []
    best: Quotient | None = None
    for name, base in candidates:
        full = cycle_length(base)
        if full is None:
            continue
        # the shift itself, else its smallest power that fits the network (a 2-step shift along a data-parallel
        # group whose members alternate between two positions of a node)
        for step in (d for d in range(1, full) if full % d == 0):
            sigma = power(base, step)
            order = full // step
            if not network.preserves(sigma, world):
                continue
            if any(not np.array_equal(sigma[g], g[sigma]) for g in gens) or not invariance.holds(sigma):
                continue
            trial = _orbit_coordinates([*gens, sigma], [*orders, order], npus)
            if trial is None:
                continue
            gens.append(sigma)
            orders.append(order)
            names.append(f"{name}{f' by {step}' if step > 1 else ''} (order {order})")
            best = trial
            break
    if best is None:
        return None
    best.described = ", ".join(names)
    return best


class QuotientEngine(CheckedEngine):
    """A CheckedEngine for quotient runs. An event's offset lists the state it touches and on whose behalf:
    pairs (owner, label), the owner a representative rank or a class of links, the label the shift that takes
    the real instance the event belongs to (the receiving rank, the link) to that representative. The events
    one real event schedules keep their order in the image, so two same-time events of one owner can only be
    ordered differently from the full run when they were scheduled by different events, or by one event on
    behalf of different real instances (different labels)."""

    __slots__ = ("identity",)

    def __init__(self, orbit_rank: int = 1) -> None:
        super().__init__()
        self.identity: tuple[int, ...] = (0,) * orbit_rank  # the label of a representative's own events

    def own(self, rank: int) -> tuple[tuple[Any, tuple[int, ...]], ...]:  # type: ignore[override]
        return ((rank, self.identity),)

    def _checked_dispatch(self, payload: tuple[Any, ...]) -> None:
        fn, arg, inserted, parent, offset, eid = payload
        now = self.env._now
        if now != self._seen_tick:
            self._seen_tick = now
            self._seen = {}
        seen = self._seen
        if offset.__class__ is tuple:
            for owner, label in offset:
                origin = (parent, label)
                if seen.setdefault((inserted, owner), origin) != origin:
                    self.ambiguous = True
        elif seen.setdefault((inserted, None), (parent, offset)) != (parent, offset):
            self.ambiguous = True
        self._current = eid
        self.insert_offset = offset
        fn(arg)


class QuotientMessaging(Messaging):
    """Messaging among representatives: a send to any rank is delivered to that rank's representative as the
    image of the message under the shifts that take the representative to it (see the module docstring)."""

    __slots__ = ("_gids", "_translated", "groups_of", "quotient")

    def __init__(self, clock: QuotientEngine, backend: NetworkBackend, quotient: Quotient) -> None:
        super().__init__(clock, backend)
        self.quotient = quotient
        self.groups_of: dict[int, dict[int, CommGroup]] = {}  # representative -> its groups (RankWorkload.groups)
        self._gids: dict[int, dict[frozenset[int], int]] = {}
        self._translated: dict[tuple[int, int, int], int] = {}

    def _members(self, rank: int, gid: int) -> tuple[int, ...] | None:
        for group in self.groups_of.get(rank, {}).values():
            if group.gid == gid:
                return group.members
        return None

    def _gid(self, rank: int, members: frozenset[int]) -> int | None:
        table = self._gids.get(rank)
        if table is None or members not in table:
            table = self._gids[rank] = {frozenset(g.members): g.gid for g in self.groups_of.get(rank, {}).values()}
        return table.get(members)

    def _tag(self, tag: int, src: int, dst: int, rep: int) -> int:
        """The wire tag in ``rep``'s numbering of the communicator group (collective streams of a group)."""
        kind, stream = tag & 3, tag >> 2
        if stream < GROUP_STREAMS or kind not in (COLLECTIVE, COLLECTIVE + HANDSHAKE):
            return tag
        gid = stream // GROUP_STREAMS
        key = (gid, src, dst)
        theirs = self._translated.get(key)
        if theirs is None:
            q = self.quotient
            members = self._members(src, gid)
            if members is None:
                return tag
            found = self._gid(rep, frozenset(q.relative(m, dst) for m in members))
            if found is None:  # the representative has not declared the image group (yet): not a symmetry here
                self.clock.ambiguous = True  # type: ignore[attr-defined]
                return tag
            theirs = self._translated[key] = found
        return 4 * (theirs * GROUP_STREAMS + stream % GROUP_STREAMS) + kind

    def send(self, src: int, dst: int, size_bytes: int, tag: int, on_sent: Callback | None, arg: Any = None) -> None:
        q = self.quotient
        rep = q.rep_list[dst]
        source = q.relative(src, dst)
        wire = self._tag(tag, src, dst, rep)
        entry = self._match((wire, source, rep, size_bytes), True)
        entry.on_sent = on_sent
        entry.send_arg = arg
        entry.sent = True
        self.messages += 1
        clock = self.clock
        own = clock.insert_offset  # type: ignore[attr-defined]
        # the delivery touches the receiving representative on behalf of dst, and the sender when it completes
        # a send of its own
        touched = ((rep, q.label(dst)),)
        clock.insert_offset = (*touched, (src, q.label(src))) if on_sent is not None else touched  # type: ignore
        self.backend.transmit(src, dst, size_bytes, self._arrived, entry)
        clock.insert_offset = own  # type: ignore[attr-defined]

    def recv(self, dst: int, src: int, size_bytes: int, tag: int, on_received: Callback, arg: Any = None) -> None:
        entry = self._match((tag, src, dst, size_bytes), False)
        if entry.arrived:
            self.clock.call_later(0, on_received, arg, offset=self.clock.own(dst))  # type: ignore[attr-defined]
            return
        entry.on_received = on_received
        entry.recv_arg = arg
