"""Which permutations of the ranks are symmetries of a run: the candidates the quotient engine folds along.

A permutation of the ranks is a symmetry when every rank behaves like its image: the network looks the same
from both (each dimension's coordinate is mapped on its own, by a rotation on Ring dimensions), their traces are
equal up to node ids and names with peers and group members mapped, and every collective algorithm treats the
mapped NPUs the way it treated the originals. That last condition depends on the algorithm:

- ring and direct (and their one* forms on one dimension) only see positions relative to the NPU itself, so
  any **rotation** of a dimension or of a group's member list maps them onto themselves;
- halving-doubling pairs position i with i XOR 2^k, so it is mapped onto itself by the **XOR** maps
  i -> i XOR c (on a power-of-two dimension or group);
- a mix of the two only by the rotation by half the size, which is both (**half**);
- the double binary tree gives every position its own role (root, intermediate, leaf) in two different trees:
  only the identity of its dimension keeps them (**fixed**); shifts along other dimensions still do.

Candidates are the cyclic shift along each family of communicator groups, the shift from each group of a
family onto the next and, where group collectives run halving-doubling, the XOR shifts of member positions; the
translation along each network dimension and, where collectives on all NPUs run halving-doubling there, its XOR
shifts. simulator/quotient.py keeps those that are symmetries, commute and act freely.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from simulator.collectives.registry import parse_algorithm
from simulator.config import SystemConfig
from simulator.node_table import COLLECTIVE_KINDS
from workload.protoscan import sorted_distinct

ROTATION, XOR, HALF, FIXED = "rotation", "xor", "half", "fixed"  # what an algorithm lets a symmetry do
ANY = "any"  # a model that sees only where a group's members sit, not their order (--collective-model nccl)
WORLD: tuple[int, ...] = ()  # the member list of a collective on all NPUs
Value = tuple[Any, ...]  # a rank's reference to other ranks (simulator/references.py: rank_references)


def algorithm_relation(name: str) -> str:
    family = parse_algorithm(name).family
    return XOR if family == "halvingDoubling" else FIXED if family == "doubleBinaryTree" else ROTATION


def combine(a: str | None, b: str) -> str:
    """The maps both relations allow."""
    if a is None or a == b:
        return b
    return HALF if {a, b} <= {ROTATION, XOR, HALF} else FIXED


def _kinds(values: list[tuple[Value, ...]]) -> tuple[set[str], set[str]]:
    world, groups = set(), set()
    for rank_values in values:
        for v in rank_values:
            if v[0] == "group":
                for ctype in v[1]:
                    kind = COLLECTIVE_KINDS.get(ctype)  # type: ignore[call-overload]
                    if kind is not None:  # broadcasts replay their duration; unsupported types stop the run anyway
                        (world if v[2] == WORLD else groups).add(kind)
    return world, groups


def relations(values: list[tuple[Value, ...]], system: SystemConfig, dims: int
              ) -> tuple[list[str | None] | None, str] | None:
    """(per network dimension, the maps collectives on all NPUs allow: None where there are none; the maps of a
    group's member positions that collectives on groups allow), or None when nothing may fold (custom
    algorithms name their peers; a one* algorithm on several dimensions is one ring across them)."""
    world, groups = _kinds(values)
    if any(system.custom(kind) is not None for kind in world | groups):
        return None
    per_dim: list[str | None] | None = None
    if world:
        per_dim = [None] * dims
        for kind in world:
            names = system.implementation(kind)
            for d in range(dims):  # dimensions without an algorithm carry no traffic: rotations, as rings
                name = names[d] if d < len(names) else "ring"
                if parse_algorithm(name).whole_network and dims > 1:
                    return None
                per_dim[d] = combine(per_dim[d], algorithm_relation(name))
    group = None
    for kind in groups:
        names = system.implementation(kind)
        if names:  # groups smaller than the network run one ring: the algorithm if there is one, else ring
            group = combine(group, algorithm_relation(names[0] if len(names) == 1 else "ring"))
    return per_dim, group or ROTATION


def is_rotation(listed: tuple[int, ...], mapped: tuple[int, ...]) -> bool:
    if len(listed) != len(mapped) or not listed:
        return len(listed) == len(mapped)
    try:
        k = mapped.index(listed[0])
    except ValueError:
        return False
    return mapped[k:] + mapped[:k] == listed


def is_xor(listed: tuple[int, ...], mapped: tuple[int, ...]) -> bool:
    """Whether ``mapped[i] == listed[i ^ c]`` for one c (a power-of-two list)."""
    n = len(listed)
    if n != len(mapped) or n & (n - 1) or not n:
        return False
    try:
        c = listed.index(mapped[0])
    except ValueError:
        return False
    return all(mapped[i] == listed[i ^ c] for i in range(n))


def members_mapped(relation: str, listed: tuple[int, ...], mapped: tuple[int, ...]) -> bool:
    """Whether a group's members, mapped by a permutation (``mapped``), run its collectives as ``listed`` does."""
    if mapped == listed:
        return True
    if relation == ANY:
        return sorted(listed) == sorted(mapped)
    if relation == ROTATION:
        return is_rotation(listed, mapped)
    if relation == XOR:
        return is_xor(listed, mapped)
    if relation == HALF:
        n = len(listed)
        return n % 2 == 0 and mapped == listed[n // 2:] + listed[:n // 2]
    return False


def keeps_blocks(sigma: np.ndarray, blocks: np.ndarray) -> bool:
    """Whether ``sigma`` maps blocks onto blocks (``blocks``: rank -> its block, such as its node or NIC)."""
    image = np.full(int(blocks.max()) + 1, -1, dtype=np.int64)
    image[blocks] = blocks[sigma]
    return bool(np.array_equal(image[blocks], blocks[sigma]))


def cycle_length(sigma: np.ndarray) -> int | None:
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


def power(sigma: np.ndarray, k: int) -> np.ndarray:
    out = np.arange(len(sigma))
    for _ in range(k):
        out = sigma[out]
    return out


class Network:
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

    def xor(self, dim: int, bit: int) -> np.ndarray:
        """Coordinate i of ``dim`` to i XOR bit."""
        c = self.coord[dim]
        return np.arange(len(c)) + ((c ^ bit) - c) * self.strides[dim]

    def preserves(self, sigma: np.ndarray, world: Sequence[str | None] | None) -> bool:
        """Whether ``sigma`` maps coordinates dimension by dimension (each new coordinate a function of the old
        one alone), by rotations on Ring dimensions, and as collectives on all NPUs allow (``world``: per
        dimension, None where they do not run; without such collectives, any bijection elsewhere)."""
        for d, n in enumerate(self.counts):
            old, new = self.coord[d], self.coord[d][sigma]
            image = np.full(n, -1, dtype=np.int64)
            image[old] = new
            if not np.array_equal(image[old], new) or len(sorted_distinct(image)) != n:
                return False
            positions = np.arange(n)
            shift = sorted_distinct((image - positions) % n)
            if self.topology[d] == "Ring" and len(shift) != 1:
                return False
            relation = None if world is None else world[d] or ROTATION
            if relation == ROTATION and len(shift) != 1:
                return False
            if relation == XOR and not np.array_equal(image, positions ^ int(image[0])):
                return False
            if relation == HALF and not (len(shift) == 1 and int(shift[0]) in (0, n // 2)):
                return False
            if relation == FIXED and not np.array_equal(image, positions):
                return False
        return True


def families(values: list[tuple[Value, ...]], npus: int, xor: bool) -> list[tuple[str, np.ndarray]]:
    """The shifts of each family of groups (equal-length groups with equal member spacing, disjoint, covering
    every rank): each rank to the next member of its group; with ``xor``, also member i to member i XOR 2^k; and
    each group onto the next one (in order of their first members), member by member."""
    lists = sorted({v[2] for rank_values in values for v in rank_values if v[0] == "group" and v[2]})
    by_shape: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for members in lists:
        by_shape.setdefault(tuple(m - members[0] for m in members), []).append(members)
    out = []
    for shape, family in sorted(by_shape.items(), key=lambda kv: (len(kv[0]), kv[0])):
        n = len(shape)
        if n < 2 or n * len(family) != npus:
            continue
        where = _listed(family[0])  # names the family by its first group
        positions = [(f"group shift along {where}", [(k + 1) % n for k in range(n)])]  # member k to position[k]
        if xor and not n & (n - 1):
            positions += [(f"group exchange of members {1 << b} apart along {where}", [k ^ (1 << b) for k in range(n)])
                          for b in range(n.bit_length() - 1)]
        for name, position in positions:
            sigma = np.full(npus, -1, dtype=np.int64)
            for members in family:
                for k, m in enumerate(members):
                    sigma[m] = members[position[k]]
            if (sigma >= 0).all():
                out.append((name, sigma))
        if len(family) > 1:  # and each group onto the next, member by member
            sigma = np.full(npus, -1, dtype=np.int64)
            for j, members in enumerate(family):
                sigma[list(members)] = family[(j + 1) % len(family)]
            if (sigma >= 0).all():
                out.append((f"shift of groups {where} -> {_listed(family[1])} -> ...", sigma))
    return out


def _listed(members: tuple[int, ...]) -> str:
    """A group in a few words: "[0, 1]", "[0, 8, 16, ..., 56]"."""
    if len(members) <= 4:
        return f"[{', '.join(map(str, members))}]"
    return f"[{members[0]}, {members[1]}, {members[2]}, ..., {members[-1]}]"


class Invariance:
    """Whether a permutation maps every rank's trace onto its image's (groups' members as ``relation`` allows),
    and then how it maps the communicator groups (by number: a group named in a rank's trace is mapped to the
    group its image names in the same place)."""

    def __init__(self, keys: list[bytes], values: list[tuple[Value, ...]], relation: str) -> None:
        self.keys = keys
        self.values = values
        self.relation = relation

    def holds(self, sigma: np.ndarray) -> dict[int, int] | None:
        """The map of group numbers ``sigma`` induces, or None when it is not a symmetry of the workload."""
        mapped: dict[tuple[tuple[int, ...], tuple[int, ...]], bool] = {}
        groups: dict[int, int] = {}
        for r in range(len(sigma)):
            s = int(sigma[r])
            if self.keys[s] != self.keys[r]:
                return None
            for mine, theirs in zip(self.values[r], self.values[s], strict=True):
                if mine[0] != theirs[0] or mine[1] != theirs[1]:
                    return None
                if mine[0] == "peer":
                    if int(sigma[mine[2]]) != theirs[2]:
                        return None
                    continue
                if groups.setdefault(mine[3], theirs[3]) != theirs[3]:
                    return None  # one group's members would disagree on its image
                key = (mine[2], theirs[2])
                ok = mapped.get(key)
                if ok is None:
                    image = tuple(int(sigma[m]) for m in mine[2])
                    ok = mapped[key] = members_mapped(self.relation, theirs[2], image)
                if not ok:
                    return None
        if len(set(groups.values())) != len(groups):
            return None
        return groups
