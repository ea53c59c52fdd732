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

**The run.** Representatives (the smallest rank of each orbit) are simulated, and results copied to the ranks
of their orbits; simulator/quotient_run.py delivers messages as the images of real ones and guards exactness:
where real ranks of a class would order same-time events differently, the run is retried with a finer
quotient (without the shifts that reverse them, ``finer``), then with every rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from simulator.config import SystemConfig
from simulator.references import rank_references
from simulator.symmetries import (
    ANY,
    XOR,
    Invariance,
    Network,
    Value,
    cycle_length,
    families,
    keeps_blocks,
    power,
    relations,
)
from workload.graph import TraceGraph


@dataclass(slots=True)
class Shift:
    """One generator of a quotient: the permutation of ranks, its order, what it is, and how it maps the
    communicator groups (by number) backwards (image -> original)."""

    sigma: np.ndarray
    order: int
    name: str
    groups_back: dict[int, int]

    @property
    def groups(self) -> dict[int, int]:
        """How the shift maps group numbers (original -> image)."""
        return {b: a for a, b in self.groups_back.items()}


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
    shifts: list[Shift] = field(default_factory=list)  # the generators, in the order of the exponents
    # two representatives whose traces are equal up to the ranks they name, which no kept shift maps onto each
    # other (None: every class runs a different trace): why the run does not fold further
    alike: tuple[int, int] | None = None
    _orders: np.ndarray = field(init=False, repr=False)
    _radix: np.ndarray = field(init=False, repr=False)
    _exponents: np.ndarray = field(init=False, repr=False)  # every exponent vector, in mixed-radix order
    _relative: dict[tuple[int, int], int] = field(init=False, repr=False)
    _labels: dict[int, tuple[int, ...]] = field(init=False, repr=False)
    _moved: dict[tuple[int, tuple[int, ...], tuple[int, ...]], int] = field(init=False, repr=False)
    _kept: dict[tuple[int, int], frozenset[int]] = field(init=False, repr=False)
    _groups: dict[tuple[int, tuple[int, ...]], int] = field(init=False, repr=False)
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

    def moved(self, rank: int, to: tuple[int, ...], since: tuple[int, ...]) -> int:
        """``g_to g_since^-1 (rank)`` (``g_e``: the shifts with exponents e): where ``rank`` goes when the shift
        ``since`` is undone and ``to`` is applied."""
        key = (rank, to, since)
        found = self._moved.get(key)
        if found is None:
            e = (self.coords[rank] + np.array(to, dtype=np.int64) - np.array(since, dtype=np.int64)) % self._orders
            found = self._moved[key] = int(self.table[self.orbit_of[rank], int(e @ self._radix)])
        return found

    def group_image(self, number: int, label: tuple[int, ...]) -> int | None:
        """The number of the group that ``g_label^-1`` maps group ``number`` to (None: a group no trace names)."""
        key = (number, label)
        found = self._groups.get(key)
        if found is None:
            found = number
            for shift, times in zip(self.shifts, label, strict=True):
                for _ in range(times):
                    found = shift.groups_back.get(found)  # type: ignore[assignment]
                    if found is None:
                        return None
            self._groups[key] = found
        return found

    def broken_by(self, u: int, v: int) -> frozenset[int]:
        """The generators that can put ``v`` before ``u``: empty when every shift keeps ``u`` before ``v`` (the
        order of ranks that decides same-time ties in the full run); else those whose powers alone reverse the
        pair, or those of the smallest combination that does."""
        key = (u, v)
        found = self._kept.get(key)
        if found is None:
            e = self._exponents
            first = self.table[self.orbit_of[u], ((self.coords[u] + e) % self._orders) @ self._radix]
            second = self.table[self.orbit_of[v], ((self.coords[v] + e) % self._orders) @ self._radix]
            reversed_ = first > second
            if not reversed_.any():
                found = frozenset()
            elif reversed_[0]:  # even the representatives' own instances: the shifts that led there
                involved = np.flatnonzero((self.coords[u] != 0) | (self.coords[v] != 0)).tolist()
                found = frozenset(involved or range(len(self.orders)))
            else:
                support = e[reversed_] != 0
                alone = [k for k in range(len(self.orders)) if (support.sum(axis=1) == 1)[support[:, k]].any()]
                smallest = support[int(np.argmin(support.sum(axis=1)))]
                found = frozenset(alone) if alone else frozenset(np.flatnonzero(smallest).tolist())
            self._kept[key] = found
        return found

    def __post_init__(self) -> None:
        self._orders = np.array(self.orders, dtype=np.int64)
        radix = np.ones(len(self.orders), dtype=np.int64)
        for k in range(len(self.orders) - 2, -1, -1):
            radix[k] = radix[k + 1] * self.orders[k + 1]
        self._radix = radix
        size = math.prod(self.orders)
        self._exponents = (np.arange(size)[:, None] // radix[None, :]) % self._orders[None, :]
        self._relative = {}
        self._labels = {}
        self._moved = {}
        self._kept = {}
        self._groups = {}
        self.rep_list = self.rep_of.tolist()

    @property
    def orbit_size(self) -> int:
        return math.prod(self.orders)


def _orbit_coordinates(shifts: list[Shift], npus: int) -> Quotient | None:
    """Orbits and exponent coordinates of the action generated by ``shifts``; None unless it is free (every
    rank of an orbit reached by exactly one exponent vector, every orbit of size prod(orders))."""
    gens = [s.sigma for s in shifts]
    orders = [s.order for s in shifts]
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
    return Quotient(reps, rep_arr[orbit_of], orbit_of, coords, tuple(orders), table, ", ".join(s.name for s in shifts),
                    list(shifts))


def finer(quotient: Quotient, dropped: frozenset[int] | set[int]) -> Quotient | None:
    """The quotient by the generators not ``dropped`` (None: none is left, or they no longer act freely)."""
    kept = [s for k, s in enumerate(quotient.shifts) if k not in dropped]
    return _orbit_coordinates(kept, len(quotient.rep_of)) if kept else None


def find_quotient(graphs: list[TraceGraph], comm_groups: dict[int, tuple[int, ...]], npus_per_dim: Sequence[int],
                  topology: Sequence[str], system: SystemConfig, blocks: Sequence[np.ndarray] = ()
                  ) -> Quotient | None:
    """The largest free action of commuting shifts this workload and network allow (None: nothing folds)."""
    keys, values = [], []
    for r, g in enumerate(graphs):
        found = rank_references(g, r, comm_groups, len(graphs))
        if found is None:
            return None
        keys.append(found[0])
        values.append(found[1])
    return quotient_of(keys, values, npus_per_dim, topology, system, blocks)


def quotient_of(keys: list[bytes], values: list[tuple[Value, ...]], npus_per_dim: Sequence[int],
                topology: Sequence[str], system: SystemConfig, blocks: Sequence[np.ndarray] = ()
                ) -> Quotient | None:
    """``find_quotient`` from each rank's (key, values) (see rank_references), without the traces. With
    ``blocks`` (rank -> node, rank -> NIC: the NCCL model, which times a group by where its members sit), every
    shift must map blocks onto blocks instead of following collective algorithms."""
    npus = len(keys)
    if blocks:
        world, group = None, ANY
    else:
        allowed = relations(values, system, len(npus_per_dim))
        if allowed is None:
            return None
        world, group = allowed
    invariance = Invariance(keys, values, group)
    network = Network(npus_per_dim, topology)
    candidates = families(values, npus, xor=group in (XOR, ANY))
    for d, n in enumerate(network.counts):
        if n > 1:
            candidates.append((f"translation along dimension {d + 1}", network.translation(d)))
        if world is not None and world[d] == XOR:  # halving-doubling there: its XOR maps (n is a power of two)
            candidates += [(f"exchange of positions {1 << b} apart along dimension {d + 1}", network.xor(d, 1 << b))
                           for b in range(max(n.bit_length() - 2, 0))]  # the last bit is the half rotation
    shifts: list[Shift] = []
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
            if not network.preserves(sigma, world) or not all(keeps_blocks(sigma, b) for b in blocks):
                continue
            if any(not np.array_equal(sigma[s.sigma], s.sigma[sigma]) for s in shifts):
                continue
            groups = invariance.holds(sigma)
            if groups is None:
                continue
            shift = Shift(sigma, order, f"{name}{f' by {step}' if step > 1 else ''} (order {order})",
                          {b: a for a, b in groups.items()})
            trial = _orbit_coordinates([*shifts, shift], npus)
            if trial is None:
                continue
            shifts.append(shift)
            best = trial
            break
    if best is not None:
        best.alike = _alike(keys, best.representatives)
    return best


def _alike(keys: list[bytes], representatives: list[int]) -> tuple[int, int] | None:
    """The first two representatives with equal keys (traces equal but for the ranks they name)."""
    first: dict[bytes, int] = {}
    for r in representatives:
        seen = first.setdefault(keys[r], r)
        if seen != r:
            return seen, r
    return None
