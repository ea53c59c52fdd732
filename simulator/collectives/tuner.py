"""Tuner plugins that override the library's own algorithm/protocol choice: aws-ofi-nccl's region tuner.

Why a module of its own: on AWS the network plugin (aws-ofi-nccl) also ships a tuner that NCCL loads with it. For
communicators of more than two nodes with 8 GPUs per node, it replaces NCCL's cost model by regions measured on the
platform: polygons in the (log2 buffer bytes, log2 ranks) plane, checked in order, the first one holding the call
(its edges included) giving the algorithm and protocol; a call outside every region, or on two nodes or fewer, falls
back to NCCL's own choice. A region whose pair NCCL does not offer for the call is skipped. The vertices below are
the plugin's (aws/aws-ofi-nccl at 2daf7d3, src/tuner/nccl_ofi_regions.cpp), recorded as data; the geometry is ours.
Only all-reduce is reproduced: the other collectives fall back to the library's choice here.

A profile says the tuner is loaded with ``tuner: aws-ofi-nccl/p5`` (p5, p5e) or ``aws-ofi-nccl/p6-b200``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.collectives.algorithms import ALL_REDUCE
from simulator.collectives.library import LL, LL128, NVLS_TREE, RING, SIMPLE, TREE

MAX_SIZE = 100.0 * (1 << 30)  # the plugin's largest buffer and rank count: the far corner of its plane
MAX_RANKS = 1024.0 * 1024
_ZERO = 1e-6  # log2 of a 0 coordinate is taken at this value

Point = tuple[float, float]  # (log2 bytes, log2 ranks)


def _log(x: float, y: float) -> Point:
    return math.log2(x if x > 0 else _ZERO), math.log2(y if y > 0 else _ZERO)


def _extend(a: tuple[float, float], b: tuple[float, float]) -> Point:
    """The point where the line through ``a`` and ``b`` (bytes, ranks) meets the far edge of the plane (largest
    size or largest rank count, whichever it reaches first), in log2 coordinates."""
    (ax, ay), (bx, by) = _log(*a), _log(*b)
    zx, zy = _log(MAX_SIZE, MAX_RANKS)
    if ax == bx:
        return ax, zy
    if ay == by:
        return zx, ay
    slope = (ay - by) / (ax - bx)
    offset = by - slope * bx
    at_zx = slope * zx + offset
    return (zx, at_zx) if at_zx < zy else ((zy - offset) / slope, zy)


@dataclass(frozen=True, slots=True)
class Region:
    algorithm: str
    protocol: str
    vertices: tuple[Point, ...]  # log2 coordinates

    def holds(self, p: Point) -> bool:
        """Inside or on an edge (even-odd rule)."""
        n = len(self.vertices)
        inside = False
        for i in range(n):
            (x0, y0), (x1, y1) = self.vertices[i], self.vertices[(i + 1) % n]
            if _on_segment(p, (x0, y0), (x1, y1)):
                return True
            if (y0 > p[1]) != (y1 > p[1]) and p[0] < x0 + (p[1] - y0) * (x1 - x0) / (y1 - y0):
                inside = not inside
        return inside


def _on_segment(p: Point, a: Point, b: Point, eps: float = 1e-10) -> bool:
    dx, dy = b[0] - a[0], b[1] - a[1]
    length2 = dx * dx + dy * dy
    if length2 == 0:
        return math.dist(p, a) < eps
    t = ((p[0] - a[0]) * dx + (p[1] - a[1]) * dy) / length2
    if t < 0 or t > 1:
        return False
    return math.dist(p, (a[0] + t * dx, a[1] + t * dy)) < eps


def _region(algorithm: str, protocol: str, *vertices: tuple[float, float] | Point, logged: tuple[int, ...] = ()
            ) -> Region:
    """A region from (bytes, ranks) vertices; the indices in ``logged`` are already in log2 coordinates."""
    return Region(algorithm, protocol, tuple(
        (float(v[0]), float(v[1])) if i in logged else _log(*v) for i, v in enumerate(vertices)))


def _p5_all_reduce() -> tuple[Region, ...]:
    tree_ll128 = _extend((402653184, 2048), (402653184, 4096))
    nvls_1 = _extend((8053063680, 160), (9663676416, 192))
    return (
        _region(TREE, LL128, (0, 16), (31457280, 16), (37748736, 32), (117440512, 64), (301989888, 128),
                (301989888, 256), (335544320, 512), (536870912, 1024), (402653184, 2048), (402653184, 4096),
                tree_ll128, (math.log2(_ZERO), tree_ll128[1]), logged=(10, 11)),
        _region(NVLS_TREE, SIMPLE, (31457281, 16), (MAX_SIZE, 16), (31457281, 16)),
        _region(RING, LL128, (31457280, 17), (1073741824, 17), (2147483648, 64), (2147483648, 128),
                (1342177280, 160), (2147483648, 256), (1074790400, 256), (444596224, 160), (301989888, 128),
                (117440512, 64), (37748736, 32)),
        _region(NVLS_TREE, SIMPLE, (2147483648, 128), (6442450944, 128), (8053063680, 160), (9663676416, 192),
                nvls_1, tree_ll128, (402653184, 4096), (402653184, 2048), (536870912, 1024), (335544320, 512),
                (301989888, 256), (310378496, 160), (444596224, 160), (1074790400, 256), (2684354560, 256),
                (2147483648, 224), (1342177280, 160), logged=(4, 5)),
        _region(RING, SIMPLE, (1073741824, 17), (nvls_1[0], math.log2(17)), nvls_1, (9663676416, 192),
                (8053063680, 160), (2684354560, 64), (1610612736, 32), logged=(1, 2)),
    )


def _p6_all_reduce() -> tuple[Region, ...]:
    tree_ll = _extend((393216, 16), (393216, 1024))
    tree_ll128 = _extend((96993280, 1024), (106430464, 2048))
    nvls = _extend((10737418240, 512), (34359738368, 1500))
    return (
        _region(TREE, LL, (0, 16), (393216, 16), tree_ll, (0, MAX_RANKS), logged=(2,)),
        _region(TREE, LL128, tree_ll, (393216, 16), (4718592, 16), (18350080, 32), (40370176, 64),
                (57147392, 128), (72876032, 256), (96993280, 1024), (106430464, 2048), tree_ll128, logged=(0, 9)),
        _region(RING, LL128, (90701824, 128), (50855936, 64), (18350080, 32), (133693440, 32), (120061952, 64)),
        _region(NVLS_TREE, SIMPLE, tree_ll128, (106430464, 2048), (96993280, 1024), (72876032, 256),
                (57147392, 128), (40370176, 64), (18350080, 32), (50855936, 64), (90701824, 128),
                (120061952, 64), (133693440, 32), (18350080, 32), (4718592, 16), (MAX_SIZE, 16),
                (435159040, 32), (1072693248, 64), (10737418240, 512), (34359738368, 1500), nvls,
                logged=(0, 18)),
        _region(RING, SIMPLE, nvls, (10737418240, 512), (1072693248, 64), (435159040, 32), (MAX_SIZE, 16),
                logged=(0,)),
    )


# tuner name -> collective -> regions (for communicators of 8 GPUs per node)
TUNERS: dict[str, dict[str, tuple[Region, ...]]] = {
    "aws-ofi-nccl/p5": {ALL_REDUCE: _p5_all_reduce()},
    "aws-ofi-nccl/p6-b200": {ALL_REDUCE: _p6_all_reduce()},
}


def tuner_choice(tuner: str, kind: str, size_bytes: int, ranks: int, nodes: int,
                 offered: set[tuple[str, str]]) -> tuple[str, str] | None:
    """The (algorithm, protocol) the tuner sets for this call, or None where it leaves the choice to the library."""
    regions = TUNERS.get(tuner, {}).get(kind)
    if not regions or nodes <= 2 or ranks != 8 * nodes:
        return None
    point = _log(size_bytes, ranks)
    for region in regions:
        if (region.algorithm, region.protocol) in offered and region.holds(point):
            return region.algorithm, region.protocol
    return None
