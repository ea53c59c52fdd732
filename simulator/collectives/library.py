"""The collective libraries' vocabulary and tuning constants: algorithm and protocol names, and per architecture the
latencies and bandwidth caps NCCL (``src/graph/tuning.cc``) and RCCL ship, which their tuning model uses to pick an
algorithm and protocol. Data only, kept apart from the model (``nccl.py``) that uses it; values are the libraries',
not fitted. These are the newest releases' (NCCL 2.23 on); versions.py has what older releases changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simulator.collectives.algorithms import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER

SEND_RECV = "send_recv"
KINDS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SEND_RECV)
RING, TREE, NVLS, NVLS_TREE, COLLNET, PAT, DIRECT, P2P, MSCCL = (
    "ring", "tree", "nvls", "nvls_tree", "collnet", "pat", "direct", "p2p", "msccl")
ALGORITHMS = (RING, TREE, NVLS, NVLS_TREE, COLLNET, PAT, DIRECT, P2P, MSCCL)
LL, LL128, SIMPLE = "LL", "LL128", "Simple"
PROTOCOLS = (LL, LL128, SIMPLE)
# Spellings in tables and NCCL_ALGO values -> our names
ALGORITHM_ALIASES = {"ring": RING, "tree": TREE, "nvls": NVLS, "nvlstree": NVLS_TREE, "collnet": COLLNET,
                     "collnetdirect": COLLNET, "collnetchain": COLLNET, "sharp": COLLNET, "pat": PAT,
                     "direct": DIRECT, "p2p": P2P, "msccl": MSCCL}


@dataclass(frozen=True, slots=True)
class LibraryConstants:
    """One architecture's tuning constants (microseconds, GB/s), as the library ships them."""

    base_us: dict[str, tuple[float, float, float]]  # algorithm -> (LL, LL128, Simple)
    hop_intra_us: dict[str, tuple[float, float, float]]  # per step on the scale-up fabric
    hop_inter_us: dict[str, tuple[float, float, float]]  # per step over the network
    ll_max_GBps: tuple[float, float, float]  # LL bus bandwidth cap for 1, 2, >2 nodes
    ll128_per_channel_GBps: float
    tree_per_channel_GBps: tuple[float, float, float]
    channels: int  # collective channels the topology search finds on a full node
    ll128: bool  # LL128 enabled by default
    nvls_efficiency: float = 0.0  # NVLS bus bandwidth per link bandwidth (Hopper 0.85, Blackwell 0.74)
    nvls_tree_per_channel_GBps: tuple[float, float] = (0.0, 0.0)  # NVLS-tree cap per channel, 2 and > 2 nodes
    ring_ll_factor: float = 0.5  # the ring's LL bus bandwidth per link bandwidth
    ring_plateau: float = 1.4  # the multi-node Simple ring's latency factor past its plateau size


# MSCCL programs are not in the library's tuning tables (it runs them whenever they apply); their priors are the
# ring's, which has the same kind of steps.
_BASE = {RING: (6.6, 14.0, 8.4), TREE: (6.8, 14.0, 8.4), NVLS: (0, 0, 0), NVLS_TREE: (0, 0, 0), COLLNET: (0, 0, 0),
         PAT: (0, 0, 8.0), DIRECT: (0, 0, 6.0), P2P: (0, 0, 6.0), MSCCL: (6.6, 14.0, 8.4)}
_HOP_NVLINK = {RING: (0.6, 1.9, 3.4), TREE: (0.6, 1.25, 4.0), NVLS: (0, 0, 25.0), NVLS_TREE: (0, 0, 25.0),
               COLLNET: (0, 0, 3.7), PAT: (0, 0, 2.8), DIRECT: (0, 0, 1.0), P2P: (0, 0, 1.0), MSCCL: (0.6, 1.9, 3.4)}
HOP_PCI_US = {**_HOP_NVLINK, RING: (1.0, 2.5, 5.7), TREE: (1.0, 1.9, 4.0)}
_HOP_NET = {RING: (2.7, 4.0, 14.0), TREE: (5.0, 8.5, 14.0), NVLS: (0, 0, 18.0), NVLS_TREE: (0, 0, 14.0),
            COLLNET: (0, 0, 31.0), PAT: (0, 0, 14.0), DIRECT: (0, 0, 5.0), P2P: (0, 0, 5.0), MSCCL: (2.7, 4.0, 14.0)}
# RCCL keeps NCCL's structure with larger base latencies (kernel launch on ROCm).
_RCCL_BASE = {**_BASE, RING: (12.0, 12.0, 17.0), TREE: (12.0, 12.0, 17.0), MSCCL: (12.0, 12.0, 17.0)}


def _nccl(ll: float, ll128: float, tree: float, channels: int, nvls: float = 0.0,
          nvls_tree: tuple[float, float] = (0.0, 0.0), plateau: float = 1.4) -> LibraryConstants:
    return LibraryConstants(_BASE, _HOP_NVLINK, _HOP_NET, (ll, ll / 3.1, ll / 4.0), ll128,
                            (tree, tree * 1.07, tree * 0.93), channels, True, nvls, nvls_tree, ring_plateau=plateau)


CONSTANTS: dict[str, LibraryConstants] = {
    "volta": _nccl(39.0, 20.0, 26.5, 12, plateau=1.9),
    "ampere": _nccl(87.7, 20.0, 24.0, 24),
    "hopper": _nccl(141.0, 36.7, 38.7, 32, 0.85, (57.7, 45.5)),
    "blackwell": _nccl(282.0, 73.4, 77.4, 32, 0.74, (96.0, 80.0)),
    "cdna3": LibraryConstants(_RCCL_BASE, _HOP_NVLINK, _HOP_NET, (60.0, 22.5, 19.0), 20.0, (24.0, 23.6, 17.8), 56,
                              True),
    "cdna4": LibraryConstants(_RCCL_BASE, _HOP_NVLINK, _HOP_NET, (80.0, 30.0, 25.0), 26.0, (32.0, 30.0, 24.0), 56,
                              True),
}
PROTOCOL_INDEX = {LL: 0, LL128: 1, SIMPLE: 2}
# NCCL's static correction of the tree all-reduce's bandwidth at medium sizes (tuning.cc, 2.2x): per protocol, the
# factor at buffer sizes 64 B x 2^i for i = 0..22; none outside that range.
TREE_CORRECTION = {
    LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}


def tree_correction(protocol: str, size_bytes: int) -> float:
    """The factor NCCL applies to a tree all-reduce's bandwidth estimate at this buffer size."""
    log_size = (size_bytes >> 6).bit_length() - 1
    table = TREE_CORRECTION[protocol]
    return table[log_size] if 0 <= log_size < len(table) else 1.0


def algorithm_name(text: str) -> str | None:
    """Our name of an algorithm as tables and NCCL_ALGO spell it ("NVLSTree" -> "nvls_tree"), None if unknown."""
    return ALGORITHM_ALIASES.get(text.lower().replace("_", "").replace("-", ""))


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw."""
    if ranks <= 1:
        return 0.0
    if kind == ALL_REDUCE:
        return 2 * (ranks - 1) / ranks
    if kind == SEND_RECV:
        return 1.0
    return (ranks - 1) / ranks


@dataclass(frozen=True, slots=True)
class Communicator:
    """Where a collective's ranks sit: how many, on how many nodes, at most how many per node."""

    ranks: int
    nodes: int
    per_node: int

    @staticmethod
    def of(members: Sequence[int], gpus_per_node: int) -> Communicator:
        counts: dict[int, int] = {}
        for r in members:
            counts[r // gpus_per_node] = counts.get(r // gpus_per_node, 0) + 1
        return Communicator(len(members), len(counts), max(counts.values()) if counts else 0)

    @staticmethod
    def packed(ranks: int, nodes: int) -> Communicator:
        return Communicator(ranks, nodes, -(-ranks // nodes))
