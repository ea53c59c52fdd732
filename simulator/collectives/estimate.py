"""The library's own estimate, which picks the algorithm and protocol: NCCL's tuning model (``src/graph/tuning.cc``)
and RCCL's derivative, for the release the profile states (versions.py). For every (algorithm, protocol) the library
enables, a latency (a base, and per step on the scale-up fabric and over the network) and an algorithm bandwidth
(the fabric's bound with the library's caps per protocol and channel); the cheapest ``latency + size / bandwidth``
wins, so the library's sub-optimal choices are reproduced. Kept apart from the timing (nccl.py), which uses the
calibrated parameters for what was chosen.
"""

from __future__ import annotations

import math

from simulator.collectives.algorithms import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER
from simulator.collectives.bounds import HardwareBounds
from simulator.collectives.library import (
    COLLNET,
    DIRECT,
    HOP_PCI_US,
    KINDS,
    LL,
    LL128,
    MSCCL,
    NVLS,
    NVLS_TREE,
    P2P,
    PAT,
    PROTOCOL_INDEX,
    RING,
    SEND_RECV,
    SIMPLE,
    TREE,
    Communicator,
    LibraryConstants,
    bus_factor,
)
from simulator.collectives.versions import available
from workload.errors import InputError


class LibraryEstimate(HardwareBounds):
    """The library's estimate of every candidate; mixed into the collective model, which sets ``tuning`` (the
    constants of the profile's library release)."""

    tuning: LibraryConstants

    def enabled(self, kind: str, comm: Communicator) -> list[tuple[str, str]]:
        """(algorithm, protocol) pairs the library would consider."""
        prof, c = self.profile, self.tuning
        # RCCL enables LL128 where its topology models of known single-node platforms say so (RCCL_LL128_FORCE_ENABLE
        # otherwise, off by default): not across nodes
        ll128 = c.ll128 and prof.scale_up.fabric != "pcie" and not (prof.library == "rccl" and comm.nodes > 1)
        protocols = [LL, LL128, SIMPLE] if ll128 else [LL, SIMPLE]
        sharp = prof.scale_out is not None and prof.scale_out.sharp and comm.nodes > 1
        nvls = prof.scale_up.nvls and comm.per_node > 1
        pairs: list[tuple[str, str]] = []
        if kind == ALL_REDUCE:
            pairs += [(RING, p) for p in protocols] + [(TREE, p) for p in protocols]
            if nvls and comm.nodes == 1:
                pairs.append((NVLS, SIMPLE))
            if nvls and comm.nodes > 1:
                pairs.append((NVLS_TREE, SIMPLE))
            if sharp:
                pairs.append((COLLNET, SIMPLE))
        elif kind in (ALL_GATHER, REDUCE_SCATTER):
            pairs += [(RING, p) for p in protocols]
            if comm.per_node == 1 and comm.nodes > 1:
                pairs.append((PAT, SIMPLE))
            if nvls and comm.nodes == 1:
                pairs.append((NVLS, SIMPLE))
            if sharp and comm.per_node == 1:
                pairs.append((COLLNET, SIMPLE))
        elif kind == ALL_TO_ALL:
            pairs.append((DIRECT, SIMPLE))
        elif kind == SEND_RECV:
            pairs.append((P2P, SIMPLE))
        else:
            raise InputError(f"the collective model cannot time {kind!r}; valid: {', '.join(KINDS)}")
        pairs = [(a, p) for a, p in pairs if available(a, prof.library, prof.library_version)]
        allowed = [(a, p) for a, p in pairs  # the platform's NCCL_ALGO / NCCL_PROTO
                   if (prof.algorithms is None or a in (DIRECT, P2P) or a in prof.algorithms)
                   and (prof.protocols is None or p in prof.protocols)]
        return allowed or pairs

    def _steps(self, algorithm: str, kind: str, comm: Communicator) -> tuple[int, int]:
        """(intra-node, inter-node) latency steps of one call."""
        n, nodes, ppn = comm.ranks, comm.nodes, comm.per_node
        log_nodes = (nodes - 1).bit_length() if nodes > 1 else 0
        if algorithm == RING:
            total = 2 * (n - 1) if kind == ALL_REDUCE else n - 1
            inter = 0 if nodes == 1 else (2 * (nodes - 1) if kind == ALL_REDUCE else nodes - 1)
            return total - inter, inter
        if algorithm == TREE:
            return 2 * (ppn - 1), 2 * log_nodes
        if algorithm == NVLS:
            return 1, 0 if nodes == 1 else 1
        if algorithm == NVLS_TREE:
            return 1, 2 * log_nodes
        if algorithm == COLLNET:
            return 2 * (ppn - 1), 1
        if algorithm == PAT:
            return 0, log_nodes
        if algorithm == DIRECT:
            return ppn - 1, n - ppn
        if algorithm == MSCCL:  # all-pairs: one exchange to reduce, one to gather
            return (2, 0) if kind == ALL_REDUCE else (1, 0)
        return (1, 0) if nodes <= 1 else (0, 1)

    def library_latency_us(self, algorithm: str, protocol: str, kind: str, comm: Communicator) -> float:
        c, p = self.tuning, PROTOCOL_INDEX[protocol]
        intra, inter = self._intra_hops(c)[algorithm][p], c.hop_inter_us[algorithm][p]
        if comm.nodes > 1 and protocol == LL:
            intra *= 1.8
        s_intra, s_inter = self._steps(algorithm, kind, comm)
        if algorithm in (NVLS, NVLS_TREE):  # NCCL charges NVLS one switch traversal (and a base before 2.19)
            return c.base_us[algorithm][p] + intra + s_inter * inter
        if algorithm == RING and comm.nodes > 1:
            intra = max(intra, 3.0 if protocol == SIMPLE else 1.0)  # a network post per step
        return c.base_us[algorithm][p] + s_intra * intra + s_inter * inter

    def library_bandwidth(self, algorithm: str, protocol: str, kind: str, comm: Communicator) -> tuple[float, int]:
        """(the library's algorithm bandwidth in GB/s, its channels on a full node)."""
        c = self.tuning
        nodes_idx = 0 if comm.nodes == 1 else 1 if comm.nodes == 2 else 2
        channels = c.channels
        raw = self.raw_busbw(RING if algorithm in (TREE, PAT) else algorithm, kind, comm, path=False)
        if algorithm == NVLS_TREE:  # NVLS inside the node, a tree of nodes over the NICs (2 nodes: twice the NICs)
            nvls_channels = 16
            intra = (self.profile.scale_up.bandwidth_GBps * c.nvls_efficiency * (nvls_channels - 1) / nvls_channels
                     * (2.0 if kind == ALL_REDUCE else (comm.per_node - 1) / comm.per_node))
            inter = self.network_GBps(comm, path=False) * (2.0 if comm.nodes <= 2 else 1.0)
            cap = nvls_channels * c.nvls_tree_per_channel_GBps[0 if comm.nodes <= 2 else 1] or math.inf
            bus = min(intra, inter, cap)
        elif algorithm == NVLS:  # NVLS channels x their bandwidth: ~70% of the links on NVSwitch systems
            bus = min(raw, self.profile.scale_up.bandwidth_GBps) * 0.7
        elif algorithm == COLLNET:
            bus = raw * 0.85
        else:
            bus = raw
        if algorithm == RING and protocol == LL:
            bus = min(c.ll_max_GBps[nodes_idx], bus * c.ring_ll_factor)
        elif algorithm == RING and protocol == LL128:
            bus = min(bus * 0.92, channels * c.ll128_per_channel_GBps)
        if algorithm == TREE:
            bus = min(bus * 0.92, channels * c.tree_per_channel_GBps[nodes_idx])
            if protocol == LL:
                bus = min(bus / 3.8, c.ll_max_GBps[nodes_idx])
            elif protocol == LL128:
                bus = min(bus * (7 / 9 if comm.nodes == 1 else 120 / 128), channels * c.ll128_per_channel_GBps)
        if algorithm == PAT:
            bus *= 0.75
        if algorithm == MSCCL:
            bus *= {LL: 0.5, LL128: 0.92, SIMPLE: 1.0}[protocol]
        n = comm.ranks
        if algorithm == RING:
            nsteps = 2 * (n - 1) if kind == ALL_REDUCE else n - 1
            algbw = bus * n / nsteps if kind in (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER) else bus
        elif algorithm == MSCCL:
            algbw = bus / bus_factor(kind, n)
        elif algorithm == NVLS_TREE and kind == ALL_REDUCE:
            algbw = bus * n / (2 * (n - 1))
        elif kind == ALL_REDUCE:
            algbw = bus * (5 / 6 if algorithm == NVLS else 0.5)
        else:
            algbw = bus / bus_factor(kind, n) if kind in (ALL_TO_ALL,) else bus
        return algbw, channels

    def channels_for(self, protocol: str, size_bytes: int, full: int, ranks: int) -> int:
        """Channels the library launches: fewer while each thread would get too little data."""
        threads = 512
        per_thread = {LL: 8 * ranks, LL128: 8, SIMPLE: 64}[protocol]
        return max(1, min(full, size_bytes // (threads * per_thread)))

    def _intra_hops(self, constants: LibraryConstants) -> dict[str, tuple[float, float, float]]:
        """Per-step latencies on the scale-up fabric: NVLink's (of ``constants``) or PCIe's."""
        return HOP_PCI_US if self.profile.scale_up.fabric == "pcie" else constants.hop_intra_us
