"""Collective algorithm names, in ASTRA-sim's vocabulary, and which collectives each implements.

    ring, direct, directN (N messages in flight), halvingDoubling, doubleBinaryTree,
    oneRing, oneDirect, oneDirectN, oneHalvingDoubling (one ring over all NPUs, ignoring dimensions)
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from simulator.collectives.algorithms import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    REDUCE_SCATTER,
    Algorithm,
    Direct,
    DoubleBinaryTreeAllReduce,
    HalvingDoubling,
    Ring,
)
from simulator.collectives.topology import BinaryTree, LogicalRing
from workload.errors import InputError

FAMILIES: dict[str, tuple[str, ...]] = {
    "ring": (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL),
    "direct": (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL),
    "halvingDoubling": (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER),
    "doubleBinaryTree": (ALL_REDUCE,),
}
NAMES = ("ring", "direct", "directN", "halvingDoubling", "doubleBinaryTree", "oneRing", "oneDirect", "oneDirectN",
         "oneHalvingDoubling")
_BASE = re.compile(r"(ring|direct|halvingDoubling|doubleBinaryTree)(\d{1,5})?")

@dataclass(frozen=True, slots=True)
class AlgorithmSpec:
    name: str  # as written, e.g. "direct4"
    family: str  # ring | direct | halvingDoubling | doubleBinaryTree
    whole_network: bool  # a one* name: one ring over all NPUs
    window: int  # direct: messages in flight, -1 for all

    def supports(self, collective: str) -> bool:
        return collective in FAMILIES[self.family]


@functools.cache
def parse_algorithm(name: str) -> AlgorithmSpec:
    """The spec of an algorithm name; an unknown name is an InputError listing the valid ones."""
    one = name.startswith("one") and name[3:4].isupper()
    base = name[3].lower() + name[4:] if one else name
    m = _BASE.fullmatch(base)
    if m is not None and not (m[2] and m[1] != "direct") and not (one and m[1] == "doubleBinaryTree"):
        window = int(m[2]) if m[2] else -1
        if window != 0:
            return AlgorithmSpec(name, m[1], one, window)
    raise InputError(f"unknown collective algorithm {name!r}; valid: {', '.join(NAMES)} "
                     "(directN / oneDirectN take a window N >= 1, e.g. direct4)")


def check_supported(spec: AlgorithmSpec, collective: str, where: str) -> None:
    if not spec.supports(collective):
        implemented = ", ".join(c.replace("_", "-") for c in FAMILIES[spec.family])
        raise InputError(f"{where}: {spec.name} does not implement {collective.replace('_', '-')} "
                         f"(it implements {implemented})")


POWER_OF_TWO_FAMILIES = ("halvingDoubling", "doubleBinaryTree")


def check_dimensions(names: tuple[str, ...], npus_per_dim: tuple[int, ...], where: str) -> None:
    """Refuse algorithms that cannot run on the dimensions they are given (halving-doubling and the
    double binary tree need a power-of-two number of NPUs)."""
    for dim, name in enumerate(names[:len(npus_per_dim)]):
        spec = parse_algorithm(name)
        npus = math.prod(npus_per_dim) if spec.whole_network else npus_per_dim[dim]
        if spec.family in POWER_OF_TWO_FAMILIES and npus & (npus - 1):
            what = "the whole network" if spec.whole_network else f"dimension {dim}"
            raise InputError(f"{where}: {name} needs a power-of-two number of NPUs, but {what} has {npus} "
                             "(use ring or direct there)")
        if spec.whole_network:
            break


def make_algorithm(spec: AlgorithmSpec, collective: str, rank: int, topology: LogicalRing | BinaryTree,
                   size: int, clockwise: bool) -> Algorithm:
    """The timed executor of one phase."""
    if spec.family == "doubleBinaryTree":
        if not isinstance(topology, BinaryTree):
            raise InputError("doubleBinaryTree cannot run on a communicator group smaller than all NPUs")
        return DoubleBinaryTreeAllReduce(rank, topology, size)
    assert isinstance(topology, LogicalRing)
    if spec.family == "ring":
        return Ring(collective, rank, topology, size, clockwise)
    if spec.family == "direct":
        return Direct(collective, rank, topology, size, clockwise, spec.window)
    check_supported(spec, collective, "collective algorithm")
    return HalvingDoubling(collective, rank, topology, size)
