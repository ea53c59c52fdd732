"""The hardware bounds of each collective algorithm, in nccl-tests bus bandwidth (GB/s, GB = 10^9 B): what the
scale-up fabric allows, what the node's NICs allow (see network.py), and the slower of the two. Kept apart from the
model that times and selects (nccl.py): these are properties of the machine, not of the library.

The NICs' bound is their line rate times the machine's GPU-NIC path (``scale_out.path_efficiency``): what the node's
PCIe lets GPUDirect traffic reach, 1 on bare-metal nodes whose GPU and NIC share a PCIe switch. The library does not
know the path and sizes its estimates on the line rate (``path=False``); timing uses the machine's bound.
"""

from __future__ import annotations

import math

from simulator.collectives.algorithms import ALL_REDUCE
from simulator.collectives.hardware import HardwareProfile
from simulator.collectives.library import (
    ALGORITHMS,
    COLLNET,
    DIRECT,
    MSCCL,
    NVLS,
    NVLS_TREE,
    P2P,
    PAT,
    RING,
    TREE,
    Communicator,
)
from simulator.collectives.network import net_busbw_bound, node_nic_GBps
from workload.errors import InputError


class HardwareBounds:
    """Bus-bandwidth bounds of a profile's hardware; mixed into the collective model."""

    profile: HardwareProfile

    def scale_up_GBps(self, per_node: int) -> float:
        up = self.profile.scale_up
        if per_node <= 1:
            return math.inf
        if up.fabric == "xgmi-mesh":  # a ring uses one link per neighbour; more rings need more distinct links
            return min(per_node - 1, up.links_per_gpu) * up.link_bandwidth_GBps
        if up.fabric == "pcie":
            return up.link_bandwidth_GBps
        return up.bandwidth_GBps

    def network_GBps(self, comm: Communicator, path: bool = True) -> float:
        """The NIC bandwidth one node puts behind the communicator's GPUs on it (inf on one node); ``path``: as the
        machine's GPU-NIC path lets it through, else the NICs' line rate."""
        out = self.profile.scale_out
        if comm.nodes <= 1:
            return math.inf
        if out is None:
            raise InputError(f"hardware profile {self.profile.name}: a collective spans {comm.nodes} nodes, but the "
                             "profile has no 'scale_out' section")
        line_rate = node_nic_GBps(out.nics_per_node, out.nic_GBps, comm.per_node, self.profile.gpus_per_node)
        return line_rate * out.path_efficiency if path else line_rate

    def up_busbw(self, algorithm: str, kind: str, comm: Communicator) -> float:
        """The scale-up fabric's bound of ``algorithm`` in bus bandwidth (GB/s); inf when it is not used."""
        up = self.scale_up_GBps(comm.per_node)
        n = comm.ranks
        if algorithm in (NVLS, NVLS_TREE):  # every GPU pushes its buffer into the switch and pulls the result
            gain = 2 * (n - 1) / n if kind == ALL_REDUCE else 1.0
            return self.profile.scale_up.bandwidth_GBps * gain
        if algorithm == COLLNET:
            return self.profile.scale_up.bandwidth_GBps
        if algorithm == DIRECT:  # the share of the buffer for peers on the node
            local = comm.per_node - 1
            return up * (n - 1) / local if local else math.inf
        if algorithm == P2P:
            return self.profile.scale_up.bandwidth_GBps if comm.nodes <= 1 else math.inf
        if algorithm in (RING, TREE, PAT, MSCCL):  # MSCCL: all-pairs over the node's links
            return up
        raise InputError(f"unknown algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")

    def net_busbw(self, algorithm: str, kind: str, comm: Communicator, path: bool = True) -> float:
        """The node's NICs' bound of ``algorithm`` in bus bandwidth (GB/s); inf on one node."""
        if comm.nodes <= 1:
            return math.inf
        return net_busbw_bound(algorithm, kind, comm.ranks, comm.nodes, comm.per_node, self.network_GBps(comm, path))

    def raw_busbw(self, algorithm: str, kind: str, comm: Communicator, path: bool = True) -> float:
        """The hardware bound of ``algorithm`` in bus bandwidth (GB/s): the slower of its two fabrics."""
        return min(self.up_busbw(algorithm, kind, comm), self.net_busbw(algorithm, kind, comm, path))
