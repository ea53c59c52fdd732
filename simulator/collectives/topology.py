"""Logical topologies the collective algorithms run on: rings and ASTRA-sim's double binary tree.

A collective sees the network as a list of dimensions (ASTRA-sim's "GeneralComplexTopology"): one per
entry of the system file's implementation list. A ring/direct/halving-doubling dimension is a ring of the
NPUs that differ only in that dimension; a ``one*`` algorithm is a single ring over all NPUs; a double
binary tree dimension holds two in-order-numbered binary trees that successive chunks alternate between.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from workload.errors import InputError


class LogicalRing:
    """An ordered ring of NPUs. ``local`` marks a communicator-group ring (ASTRA-sim charges those a
    fixed 10 ns per injected message instead of the endpoint delay)."""

    __slots__ = ("_index", "local", "members")

    def __init__(self, members: Sequence[int], local: bool = False) -> None:
        self.members = members
        self.local = local
        self._index = None if isinstance(members, range) else {m: i for i, m in enumerate(members)}

    @property
    def size(self) -> int:
        return len(self.members)

    def index(self, npu: int) -> int:
        return self.members.index(npu) if self._index is None else self._index[npu]

    def step(self, npu: int, steps: int) -> int:
        """The NPU ``steps`` places clockwise (negative: anticlockwise) from ``npu``."""
        return self.members[(self.index(npu) + steps) % len(self.members)]

    def neighbours(self, npu: int, clockwise: bool) -> tuple[int, int]:
        """(receiver, sender) of ``npu``: the NPUs after and before it in the direction of travel."""
        members = self.members
        i = self.index(npu)
        n = len(members)
        after, before = members[(i + 1) % n], members[(i - 1) % n]
        return (after, before) if clockwise else (before, after)

    def receiver(self, npu: int, clockwise: bool) -> int:
        return self.step(npu, 1 if clockwise else -1)

    def sender(self, npu: int, clockwise: bool) -> int:
        return self.step(npu, -1 if clockwise else 1)


@dataclass(frozen=True, slots=True)
class TreeNode:
    parent: int  # NPU id, -1 for the root
    left: int  # -1 when absent
    right: int

    @property
    def kind(self) -> str:
        if self.parent < 0:
            return "root"
        return "leaf" if self.left < 0 and self.right < 0 else "intermediate"


@functools.lru_cache(maxsize=256)
def _tree_shape(size: int, root_max: bool) -> tuple[tuple[int, int, int], ...]:
    """(parent, left, right) in-order positions for ASTRA-sim's tree over ``size`` positions.

    The root has a single child: a perfect subtree holding every other node, to its left when the root
    takes the largest position (RootMax), to its right when it takes the smallest (RootMin).
    """
    levels = int(math.log2(size))
    shape: list[list[int]] = []

    def build(depth: int, parent: int) -> int:
        me = len(shape)
        shape.append([parent, -1, -1])
        if depth > 1:
            shape[me][1] = build(depth - 1, me)
            shape[me][2] = build(depth - 1, me)
        return me

    root = [-1, -1, -1]
    shape.append(root)
    child = build(levels, 0)
    root[1 if root_max else 2] = child
    # creation order -> in-order position
    order: list[int] = []

    def inorder(i: int) -> None:
        if shape[i][1] >= 0:
            inorder(shape[i][1])
        order.append(i)
        if shape[i][2] >= 0:
            inorder(shape[i][2])

    inorder(0)
    position = {node: pos for pos, node in enumerate(order)}
    out = [(-1, -1, -1)] * len(order)
    for node, (p, lch, rch) in enumerate(shape):
        out[position[node]] = tuple(position[x] if x >= 0 else -1 for x in (p, lch, rch))  # type: ignore[assignment]
    return tuple(out)


class BinaryTree:
    """One of the two trees: NPUs ``start + k * stride`` numbered in order."""

    __slots__ = ("root_max", "size", "start", "stride")

    def __init__(self, size: int, start: int, stride: int, root_max: bool) -> None:
        self.size = size
        self.start = start
        self.stride = stride
        self.root_max = root_max

    def node(self, npu: int) -> TreeNode:
        shape = _tree_shape(self.size, self.root_max)
        p, lch, rch = shape[(npu - self.start) // self.stride]
        return TreeNode(*(self.start + x * self.stride if x >= 0 else -1 for x in (p, lch, rch)))


class DoubleBinaryTree:
    """Two trees over the same NPUs; each request for a tree alternates between them (per rank)."""

    __slots__ = ("_counter", "size", "trees")

    def __init__(self, size: int, start: int, stride: int) -> None:
        if size & (size - 1):
            raise InputError(f"doubleBinaryTree needs a power-of-two number of NPUs in its dimension (got {size})")
        self.size = size
        self.trees = (BinaryTree(size, start, stride, True), BinaryTree(size, start, stride, False))
        self._counter = 0

    def next_tree(self) -> BinaryTree:
        tree = self.trees[self._counter % 2]
        self._counter += 1
        return tree


Dimension = LogicalRing | DoubleBinaryTree


class CollectiveTopology:
    """The dimensions one collective type runs over, as ASTRA-sim builds them for one rank."""

    __slots__ = ("dims",)

    def __init__(self, dims: list[Dimension]) -> None:
        self.dims = dims

    @property
    def num_dims(self) -> int:
        return len(self.dims)

    def nodes_in_dim(self, dim: int) -> int:
        return self.dims[dim].size

    def basic(self, dim: int) -> LogicalRing | BinaryTree:
        d = self.dims[dim]
        return d.next_tree() if isinstance(d, DoubleBinaryTree) else d


def build_topology(rank: int, npus_per_dim: Sequence[int], algorithms: Sequence[str]) -> CollectiveTopology:
    """ASTRA-sim's per-rank logical topology for a list of per-dimension algorithm names.

    Only as many dimensions as names are built; a ``one*`` name ends the list with one ring over all NPUs.
    """
    if len(algorithms) > len(npus_per_dim):
        raise InputError(f"{len(algorithms)} collective algorithms are given for a network of "
                         f"{len(npus_per_dim)} dimension(s): give one per dimension")
    dims: list[Dimension] = []
    offset = 1
    from simulator.collectives.registry import parse_algorithm

    for dim, name in enumerate(algorithms):
        size = npus_per_dim[dim]
        spec = parse_algorithm(name)
        if spec.whole_network:
            total = math.prod(npus_per_dim)
            dims.append(LogicalRing(range(total)))
            break
        if spec.family == "doubleBinaryTree":
            # ASTRA-sim uses rank % offset on the last listed dimension, which is the same number when that is
            # the network's last dimension and crashes otherwise; this form is right for every dimension.
            start = rank - rank % (offset * size) + rank % offset
            dims.append(DoubleBinaryTree(size, start, offset))
        else:
            base = rank - (rank % (offset * size)) // offset * offset
            dims.append(LogicalRing(range(base, base + size * offset, offset)))
        offset *= size
    return CollectiveTopology(dims)
