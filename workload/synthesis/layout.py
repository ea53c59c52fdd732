"""Where ranks sit: the grid of parallelism dimensions that communicator groups and peers are cut from.

A workload's communicator groups usually tile the ranks regularly (tensor-parallel groups of consecutive
ranks, data-parallel groups at a stride, pipeline peers at a larger stride). Ranks are then points of a
mixed-radix grid (dimension 0 innermost), every group is a box spanning some dimensions, and every
point-to-point peer is a shift along one dimension. Stored that way, without group names, the layout can be
re-instantiated on another rank count by growing one dimension. Groups that fit no grid are kept as explicit
rank lists; such a layout regenerates only at its own rank count.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from workload.errors import InputError


@dataclass(frozen=True, slots=True)
class Family:
    """Communicator groups of one shape: a rank's group varies the coordinates of ``dims`` and keeps the others.

    ``coords`` (aligned with ``dims``; empty when all are whole) limits a dimension to some of its coordinates,
    e.g. the first and last pipeline stage sharing tied embeddings. ``default`` is the implicit all-NPU group
    (empty ``pg_name``); ``groups`` holds explicit member lists when the workload's groups fit no grid.
    """

    dims: tuple[int, ...] = ()
    default: bool = False
    groups: tuple[tuple[int, ...], ...] = ()
    coords: tuple[tuple[int, ...] | None, ...] = ()

    def values(self, k: int, size: int) -> Sequence[int]:
        """The coordinates the family's k-th dimension (of ``size``) takes."""
        limited = self.coords[k] if self.coords else None
        return range(size) if limited is None else limited


@dataclass(frozen=True, slots=True)
class Layout:
    """Ranks as a grid: ``dims`` sizes (innermost first), the dimensions that decide a rank's class (its trace
    shape) and the class of every coordinate combination of those dimensions (mixed radix, first innermost)."""

    dims: tuple[int, ...]
    class_dims: tuple[int, ...]
    class_of: tuple[int, ...]
    families: tuple[Family, ...]
    explicit: bool = False

    @property
    def num_ranks(self) -> int:
        return math.prod(self.dims)

    def coords(self, rank: int) -> list[int]:
        out = []
        for size in self.dims:
            out.append(rank % size)
            rank //= size
        return out

    def rank_at(self, coords: Sequence[int]) -> int:
        rank, stride = 0, 1
        for c, size in zip(coords, self.dims, strict=True):
            rank += c * stride
            stride *= size
        return rank

    def rank_class(self, rank: int) -> int:
        c = self.coords(rank)
        index, stride = 0, 1
        for d in self.class_dims:
            index += c[d] * stride
            stride *= self.dims[d]
        return self.class_of[index]

    def group(self, rank: int, family: int) -> tuple[int, ...] | None:
        """The members of ``rank``'s group of a family (ascending), or None for the all-NPU default group."""
        fam = self.families[family]
        if fam.default:
            return None
        if fam.groups:
            for members in fam.groups:
                if rank in members:
                    return members
            raise InputError(f"rank {rank} belongs to no group of communicator group family {family}")
        base = self.coords(rank)
        members = [base]
        for k, d in enumerate(fam.dims):
            values = fam.values(k, self.dims[d])
            if base[d] not in values:
                raise InputError(f"rank {rank} belongs to no group of communicator group family {family}")
            members = [[*m[:d], v, *m[d + 1:]] for m in members for v in values]
        return tuple(sorted(self.rank_at(m) for m in members))

    def shape(self, family: Family) -> dict[str, int | list[int]]:
        """A grid family's group size and the rank strides of its dimensions (for readers of a profile)."""
        return {"group_size": math.prod(len(family.values(k, self.dims[d])) for k, d in enumerate(family.dims)),
                "strides": [math.prod(self.dims[:d]) for d in family.dims]}

    def mixes_classes(self, family: int) -> bool:
        """Whether some group of the family holds ranks of different classes (then their collectives on it must
        agree across classes)."""
        fam = self.families[family]
        if fam.default:
            return len(set(self.class_of)) > 1
        groups = list(fam.groups)
        for rank in range(self.num_ranks if not groups else 0):
            c = self.coords(rank)
            if all(c[d] in fam.values(k, self.dims[d]) for k, d in enumerate(fam.dims)):
                groups.append(self.group(rank, family) or ())
        return any(len({self.rank_class(m) for m in members}) > 1 for members in groups)

    def peer(self, rank: int, dim: int, shift: int) -> int:
        c = self.coords(rank)
        c[dim] = (c[dim] + shift) % self.dims[dim]
        return self.rank_at(c)

    def resized(self, num_ranks: int, preferred_dims: Sequence[int]) -> Layout:
        """The layout on ``num_ranks`` ranks: the first of ``preferred_dims`` (dimensions that do not decide a
        rank's class) that can grow or shrink by the ratio does; failing that, whole copies of the grid are
        stacked along a new outermost dimension."""
        if num_ranks == self.num_ranks:
            return self
        if self.explicit:
            raise InputError(f"the profile's communicator groups fit no regular grid, so it regenerates only "
                             f"its own {self.num_ranks} ranks (got --npus {num_ranks})")
        limited = {d for f in self.families for k, d in enumerate(f.dims) if f.coords and f.coords[k] is not None}
        for d in preferred_dims:
            if d in self.class_dims or d in limited:
                continue
            size = self.dims[d] * num_ranks
            if size % self.num_ranks == 0:
                dims = list(self.dims)
                dims[d] = size // self.num_ranks
                return replace(self, dims=tuple(dims))
        if num_ranks % self.num_ranks == 0:
            whole = tuple(range(len(self.dims)))
            new = len(self.dims)
            families = tuple(replace(f, dims=(*f.dims, new)) if not f.default and f.dims == whole else f
                             for f in self.families)
            return replace(self, dims=(*self.dims, num_ranks // self.num_ranks), families=families)
        sizes = " x ".join(str(s) for s in self.dims)
        steps = [self.num_ranks // self.dims[d] for d in range(len(self.dims)) if d not in self.class_dims]
        step = min(steps, default=self.num_ranks)
        raise InputError(f"cannot lay the profile's {sizes} rank grid out on {num_ranks} ranks: use a multiple "
                         f"of {step}")


def box(members: Sequence[int]) -> list[tuple[int, int]] | None:
    """The (stride, size) factors that generate a group from its smallest rank, innermost first, or None when
    the group is no box (e.g. {0, 1, 3})."""
    ranks = sorted(set(members))
    base = ranks[0]
    offsets = {r - base for r in ranks}
    current = [0]
    factors: list[tuple[int, int]] = []
    while len(current) < len(offsets):
        have = set(current)
        stride = min(o for o in offsets if o not in have)
        if factors and stride < factors[-1][0] * factors[-1][1]:
            return None
        size = 1
        while all(c + size * stride in offsets for c in current):
            size += 1
        if size == 1:
            return None
        current = [c + j * stride for j in range(size) for c in current]
        factors.append((stride, size))
    return factors if set(current) == offsets else None


def infer_dims(num_ranks: int, groups: Iterable[Sequence[int]], deltas: Iterable[int] = ()) -> tuple[int, ...]:
    """Grid sizes (innermost first) whose dimension boundaries are the strides and extents of the groups that are
    whole boxes, and the point-to-point distances, where they fit. Other groups may still be sub-boxes of the
    grid (see ``family_of_group``)."""
    cuts = {1, num_ranks}
    for members in groups:
        trial = set(cuts)
        for stride, size in box(members) or []:
            trial.update((stride, stride * size))
        if _chain(trial, num_ranks):
            cuts = trial
    for delta in sorted({abs(d) for d in deltas if d}):
        for cut in (delta, math.gcd(delta, num_ranks)):
            if 0 < cut < num_ranks and num_ranks % cut == 0 and _chain(cuts | {cut}, num_ranks):
                cuts.add(cut)
                break
    ordered = sorted(cuts)
    return tuple(b // a for a, b in itertools.pairwise(ordered)) or (1,)


def _chain(cuts: set[int], num_ranks: int) -> bool:
    ordered = sorted(cuts)
    return ordered[-1] == num_ranks and ordered[0] >= 1 and all(b % a == 0 for a, b in itertools.pairwise(ordered))


def family_of_group(dims: Sequence[int], members: Sequence[int]) -> Family | None:
    """The grid family a group belongs to: the dimensions along which its members' coordinates vary (with the
    coordinates they take when not all), or None when the group is no sub-box of the grid."""
    layout = Layout(tuple(dims), (), (0,), ())
    points = [layout.coords(r) for r in set(members)]
    spanned, coords = [], []
    size = 1
    for d in range(len(dims)):
        values = sorted({p[d] for p in points})
        if len(values) > 1:
            spanned.append(d)
            coords.append(None if len(values) == dims[d] else tuple(values))
            size *= len(values)
    if size != len(points):
        return None
    return Family(tuple(spanned), coords=tuple(coords) if any(c is not None for c in coords) else ())


def shift_between(dims: Sequence[int], src: int, dst: int) -> tuple[int, int] | None:
    """(dimension, signed shift) that moves ``src`` to ``dst``, or None when they differ in several dimensions."""
    layout = Layout(tuple(dims), (), (0,), ())
    a, b = layout.coords(src), layout.coords(dst)
    differ = [d for d in range(len(dims)) if a[d] != b[d]]
    if len(differ) != 1:
        return None
    d = differ[0]
    shift = (b[d] - a[d]) % dims[d]
    if shift > dims[d] // 2:
        shift -= dims[d]
    return d, shift


def class_dims(dims: Sequence[int], rank_class: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The dimensions along which ranks' classes change, and the class per coordinate combination of them."""
    layout = Layout(tuple(dims), (), (0,), ())
    deciding = []
    for d in range(len(dims)):
        for r in range(len(rank_class)):
            c = layout.coords(r)
            if c[d] == 0 and any(rank_class[layout.rank_at([*c[:d], v, *c[d + 1:]])] != rank_class[r]
                                 for v in range(1, dims[d])):
                deciding.append(d)
                break
    sub = Layout(tuple(dims), tuple(deciding), (0,), ())
    count = math.prod(dims[d] for d in deciding)
    table = [0] * count
    for r, cls in enumerate(rank_class):
        c = sub.coords(r)
        index, stride = 0, 1
        for d in deciding:
            index += c[d] * stride
            stride *= dims[d]
        table[index] = cls
    return tuple(deciding), tuple(table)
