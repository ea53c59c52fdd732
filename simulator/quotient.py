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

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from network.backends import Callback, NetworkBackend
from network.messaging import Messaging
from simulator.canonical import behaviour_key
from simulator.config import SystemConfig
from simulator.engine import CheckedEngine
from simulator.node_table import COLLECTIVE_KINDS, NO_VALUE, node_table
from simulator.symmetry import SYMMETRIC_ALGORITHMS
from simulator.system import COLLECTIVE, HANDSHAKE, CommGroup
from workload.graph import TraceGraph
from workload.groups import metadata_groups
from workload.schema import NodeType

ROTATION_SAFE = ("ring", "direct")  # algorithms that do not tell a group's members apart by position
WORLD: tuple[int, ...] = ()
GROUP_STREAMS = 1_000_000  # a communicator group's stream ids start at gid x this (simulator/system.py)


# A rank's references to other ranks, compactly: the distinct values its trace names, in order of first use.
# A value is ("peer", own rank written, peer) for sends and receives, or ("group", collective types, members as
# listed; WORLD for all NPUs) for collectives. Which node uses which value (the template) goes into the rank's
# key, so two ranks with equal keys differ only in their values, and a shift maps one onto the other when it
# maps the values. Generated workloads give the same form without building traces (TraceSet.structure).
Value = tuple[Any, ...]


def rank_references(graph: TraceGraph, rank: int, comm_groups: dict[int, tuple[int, ...]], npus: int
                    ) -> tuple[bytes, tuple[Value, ...]] | None:
    """(key, values) of the rank's trace, or None when its references cannot be read before the run (an
    undeclared group, a send written into another rank's trace): such traces are simulated rank by rank."""
    t = node_table(graph)
    declared = dict(comm_groups)
    types = graph.types
    for i in np.flatnonzero(types == NodeType.METADATA_NODE).tolist():
        for name, ranks in metadata_groups(graph, i) or ():
            if str(name).isdigit():
                declared[int(name)] = tuple(ranks) if ranks else tuple(range(npus))
    slots: dict[Any, int] = {}
    template: list[tuple[int, int]] = []
    kinds: dict[Any, set[int]] = {}
    wanted = (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE, NodeType.COMM_COLL_NODE)
    for i in np.flatnonzero(np.isin(types, wanted)).tolist():
        if t.is_cpu[i]:
            continue
        ntype = t.types[i]
        if ntype == NodeType.COMM_COLL_NODE:
            name = t.pg_name.get(i, "")
            members = WORLD if name in ("", "0") else declared.get(int(name)) if name.isdigit() else None
            if members is None:
                return None
            if len(members) == npus and members == tuple(range(npus)):
                members = WORLD
            value: Any = ("group", members)
            kinds.setdefault(value, set()).add(t.comm_type[i])
        else:
            own, peer = (t.comm_src[i], t.comm_dst[i]) if ntype == NodeType.COMM_SEND_NODE else (
                t.comm_dst[i], t.comm_src[i])
            if own not in (NO_VALUE, rank) or not 0 <= peer < npus:
                return None
            value = ("peer", own == rank, peer)
        template.append((i, slots.setdefault(value, len(slots))))
    values = tuple(("group", tuple(sorted(kinds[v])), v[1]) if v[0] == "group" else v for v in slots)
    key = hashlib.blake2b(behaviour_key(graph, references=False) + repr(template).encode(), digest_size=20).digest()
    return key, values


def _is_rotation(listed: tuple[int, ...], mapped: tuple[int, ...]) -> bool:
    if len(listed) != len(mapped) or not listed:
        return len(listed) == len(mapped)
    try:
        k = mapped.index(listed[0])
    except ValueError:
        return False
    return mapped[k:] + mapped[:k] == listed


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


def _cycle_length(sigma: np.ndarray) -> int | None:
    """The length of every cycle of the permutation, or None when they differ (or it has fixed points)."""
    seen = np.zeros(len(sigma), dtype=bool)
    length = None
    for start in range(len(sigma)):
        if seen[start]:
            continue
        n, x = 0, start
        while not seen[x]:
            seen[x] = True
            x = int(sigma[x])
            n += 1
        if length is None:
            length = n
        elif n != length:
            return None
    return length if length and length > 1 else None


def _power(sigma: np.ndarray, k: int) -> np.ndarray:
    out = np.arange(len(sigma))
    for _ in range(k):
        out = sigma[out]
    return out


class _Network:
    """The rank <-> coordinate arithmetic of the network's dimensions."""

    def __init__(self, npus_per_dim: Sequence[int], topology: Sequence[str]) -> None:
        self.counts = list(npus_per_dim)
        self.topology = list(topology)
        ranks = np.arange(math.prod(self.counts))
        self.coord: list[np.ndarray] = []
        stride = 1
        self.strides = []
        for n in self.counts:
            self.coord.append((ranks // stride) % n)
            self.strides.append(stride)
            stride *= n

    def translation(self, dim: int) -> np.ndarray:
        n, stride = self.counts[dim], self.strides[dim]
        c = self.coord[dim]
        return np.arange(len(c)) + (((c + 1) % n) - c) * stride

    def preserves(self, sigma: np.ndarray, rotations_only: bool) -> bool:
        """Whether ``sigma`` maps coordinates dimension by dimension (each new coordinate a function of the old
        one alone), by rotations on Ring dimensions (everywhere with ``rotations_only``)."""
        for d, n in enumerate(self.counts):
            old, new = self.coord[d], self.coord[d][sigma]
            image = np.full(n, -1, dtype=np.int64)
            image[old] = new
            if not np.array_equal(image[old], new) or len(np.unique(image)) != n:
                return False
            if (rotations_only or self.topology[d] == "Ring") and len(np.unique((image - np.arange(n)) % n)) != 1:
                return False
        # a dimension's coordinate must not depend on the others: checked by the function test above per dim
        return True


def _families(values: list[tuple[Value, ...]], npus: int) -> list[np.ndarray]:
    """The shift along each family of groups: equal-length groups with equal member spacing, disjoint, covering
    every rank; a rank moves to the next member of its group."""
    lists = sorted({v[2] for rank_values in values for v in rank_values if v[0] == "group" and v[2]})
    by_shape: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for members in lists:
        by_shape.setdefault(tuple(m - members[0] for m in members), []).append(members)
    out = []
    for shape, family in sorted(by_shape.items(), key=lambda kv: (len(kv[0]), kv[0])):
        if len(shape) < 2 or len(shape) * len(family) != npus:
            continue
        sigma = np.full(npus, -1, dtype=np.int64)
        for members in family:
            for k, m in enumerate(members):
                sigma[m] = members[(k + 1) % len(members)]
        if (sigma >= 0).all():
            out.append(sigma)
    return out


class _Invariance:
    """Whether a permutation maps every rank's trace onto its image's."""

    def __init__(self, keys: list[bytes], values: list[tuple[Value, ...]], rotate: bool) -> None:
        self.keys = keys
        self.values = values
        self.rotate = rotate

    def holds(self, sigma: np.ndarray) -> bool:
        mapped: dict[tuple[tuple[int, ...], tuple[int, ...]], bool] = {}
        for r in range(len(sigma)):
            s = int(sigma[r])
            if self.keys[s] != self.keys[r]:
                return False
            for mine, theirs in zip(self.values[r], self.values[s], strict=True):
                if mine[0] != theirs[0] or mine[1] != theirs[1]:
                    return False
                if mine[0] == "peer":
                    if int(sigma[mine[2]]) != theirs[2]:
                        return False
                    continue
                key = (mine[2], theirs[2])
                ok = mapped.get(key)
                if ok is None:
                    image = tuple(int(sigma[m]) for m in mine[2])
                    ok = mapped[key] = image == theirs[2] or (self.rotate and _is_rotation(theirs[2], image))
                if not ok:
                    return False
        return True


def _algorithms(values: list[tuple[Value, ...]], system: SystemConfig, dims: int) -> tuple[bool, bool]:
    """(whether the collectives on all NPUs run translation-symmetric algorithms, whether those on groups run
    algorithms that do not tell members apart by position)."""
    world_kinds, group_kinds = set(), set()
    for rank_values in values:
        for v in rank_values:
            if v[0] == "group":
                for ctype in v[1]:
                    kind = COLLECTIVE_KINDS.get(ctype)  # type: ignore[call-overload]
                    if kind is not None:  # broadcasts replay their duration; unsupported types stop the run anyway
                        (world_kinds if v[2] == WORLD else group_kinds).add(kind)
    if any(system.custom(kind) is not None for kind in world_kinds | group_kinds):
        return False, False  # a custom algorithm's ET names its peers: not folded
    world_ok = all(name.startswith(SYMMETRIC_ALGORITHMS) and not (name.startswith("one") and dims > 1)
                   for kind in world_kinds for name in system.implementation(kind))
    group_ok = all((system.implementation(kind)[0] if len(system.implementation(kind)) == 1 else "ring")
                   in ROTATION_SAFE for kind in group_kinds if system.implementation(kind))
    return world_ok, group_ok


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
    world_ok, rotate = _algorithms(values, system, len(npus_per_dim))
    if not world_ok:
        return None
    world = any(v[0] == "group" and v[2] == WORLD for rank_values in values for v in rank_values)
    invariance = _Invariance(keys, values, rotate)
    network = _Network(npus_per_dim, topology)
    candidates = [("group shift", s) for s in _families(values, npus)]
    candidates += [(f"translation along dimension {d + 1}", network.translation(d))
                   for d, n in enumerate(network.counts) if n > 1]
    gens: list[np.ndarray] = []
    orders: list[int] = []
    names: list[str] = []
    best: Quotient | None = None
    for name, base in candidates:
        full = _cycle_length(base)
        if full is None:
            continue
        # the shift itself, else its smallest power that fits the network (a 2-step shift along a data-parallel
        # group whose members alternate between two positions of a node)
        for step in (d for d in range(1, full) if full % d == 0):
            sigma = _power(base, step)
            order = full // step
            if not network.preserves(sigma, rotations_only=world):
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
        now = self.env.now
        if now != self._seen_tick:
            self._seen_tick = now
            self._seen = {}
        seen = self._seen
        for owner, label in offset if isinstance(offset, tuple) else ((None, offset),):
            origin = (parent, label)
            if seen.setdefault((inserted, owner), origin) != origin:
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
