"""The NCCL model (simulator/nccl_run.py) in a run with one rank per class of equivalent ranks.

A collective starts when every member of its communicator has issued it. Member ``m`` of communicator ``X``
issues its k-th call on ``X`` when its representative issues its k-th call on the image of ``X`` under the
shift taking ``m`` to it. So a call is known by its communicator's class (the canonical communicator: the
smallest group number the shifts map it to) and k, and it starts once every (representative, communicator)
pair it stands for has issued it: one job for the whole class of calls.

Resources (GPU ports, NICs) go by class too: a port belongs to its GPU's class, a NIC to the class of the NICs
the shifts map it to (the shifts map nodes to nodes and NICs to NICs: simulator/quotient.py checks). A job
weighs, on each class it uses, how many of its resources are in the class times the number of images of the
job; the flow scheduler (simulator/nccl_flows.py) divides by the class's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.collectives.hardware import HardwareProfile
from simulator.quotient import Quotient
from simulator.system import CommGroup


@dataclass(frozen=True, slots=True)
class CommClass:
    """A communicator seen from a representative: its class and what a call on it needs."""

    key: int  # the canonical communicator's group number (0: every rank)
    members: tuple[int, ...]  # the canonical communicator's members
    pairs: int  # (representative, communicator) pairs whose calls make up one call of the class
    orbit: int  # how many communicators the class holds


class NcclClasses:
    """Communicator and resource classes of a quotient run (see the module docstring)."""

    def __init__(self, quotient: Quotient, profile: HardwareProfile) -> None:
        self.quotient = quotient
        self.profile = profile
        self.gpus_per_node = profile.gpus_per_node
        self.nics_per_node = profile.nics_per_node
        self.groups_of: dict[int, dict[int, CommGroup]] = {}  # representative -> its groups (RankWorkload.groups)
        self._comms: dict[tuple[int, int], CommClass] = {}
        self._forward = [s.groups for s in quotient.shifts]
        self._resources: dict[tuple[Any, ...], tuple[tuple[Any, ...], int]] = {}
        self._nic_classes: dict[int, tuple[tuple[Any, ...], int]] = {}  # orbit -> its GPUs' NICs' class

    def comm(self, rank: int, gid: int, members: Sequence[int]) -> CommClass:
        """The class of communicator ``gid`` (RankWorkload's internal number) of representative ``rank``."""
        key = (rank, gid)
        found = self._comms.get(key)
        if found is None:
            found = self._comms[key] = self._classify(rank, gid, members)
        return found

    def _classify(self, rank: int, gid: int, members: Sequence[int]) -> CommClass:
        q = self.quotient
        if gid == 0:
            return CommClass(0, tuple(members), len(q.representatives), 1)
        number = next((n for n, g in self.groups_of.get(rank, {}).items() if g.gid == gid), None)
        if number is None:
            raise AssertionError(f"rank {rank} issues on communicator {gid}, which it has not declared")
        # the class: every number the shifts reach from this one, with the exponents that reach it
        reached = {number: (0,) * len(q.orders)}
        frontier = [number]
        while frontier:
            nxt = []
            for n in frontier:
                for k, forward in enumerate(self._forward):
                    image = forward.get(n)
                    if image is not None and image not in reached:
                        e = list(reached[n])
                        e[k] = (e[k] + 1) % q.orders[k]
                        reached[image] = tuple(e)
                        nxt.append(image)
            frontier = nxt
        canonical = min(reached)
        shift = reached[canonical]
        identity = (0,) * len(q.orders)
        images = tuple(q.moved(m, shift, identity) for m in members)
        pairs = {(q.rep_list[m], q.group_image(canonical, q.label(m))) for m in images}
        return CommClass(canonical, images, len(pairs), len(reached))

    def resource(self, key: tuple[Any, ...]) -> tuple[tuple[Any, ...], int]:
        """(the class of a GPU port ("up", rank) or NIC ("nic", node, nic), how many resources it holds)."""
        found = self._resources.get(key)
        if found is None:
            q = self.quotient
            if key[0] == "up":
                found = (("up", q.rep_list[key[1]]), q.orbit_size)
            else:
                _, node, nic = key
                gpn, nics = self.gpus_per_node, self.nics_per_node
                found = self._nic_class(int(q.orbit_of[node * gpn + -(-nic * gpn // nics)]))  # its first GPU's
            self._resources[key] = found
        return found

    def _nic_class(self, orbit: int) -> tuple[tuple[Any, ...], int]:
        """The class of the NICs of the GPUs of ``orbit``: the shifts map NICs to NICs, so the images of a NIC
        are the NICs of its GPU's images (the smallest and how many). Built once per orbit that a
        communicator uses, from the orbit's row of ranks, not by walking the shifts NIC by NIC (that took 140
        ms per communicator on 16,384 ranks of Llama-3 405B)."""
        found = self._nic_classes.get(orbit)
        if found is None:
            nics = self.nics_per_node
            codes = np.unique(self.profile.nic_of(self.quotient.table[orbit]))  # in (node, nic) order
            first = int(codes[0])
            found = self._nic_classes[orbit] = (("nic", first // nics, first % nics), len(codes))
        return found
