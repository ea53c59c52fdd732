"""Expert-parallel exchange libraries (DeepEP, HybridEP): the network efficiency of their dispatch and combine.

Megatron-Core's flex MoE dispatcher exchanges tokens with DeepEP's or HybridEP's kernels rather than NCCL's
all-to-all. Across nodes their RDMA leg reaches a fraction of the NICs' line rate that depends on how many nodes the
exchange spans: on H100/H800 with 400 Gb/s NICs both measure 86-88% over 4 to 8 nodes, but only 63-72%
(HybridEP) and 43% (DeepEP V1) over 2. ``configs/collectives/ep_exchange.yml`` holds the measurements and their
sources; a collective whose trace node carries ``comm_library`` runs its network stage at that efficiency
(``simulator/collectives/nccl.py``), interpolated linearly in the node count and held beyond the last measurement.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from workload.errors import InputError
from workload.files import read_yaml

EXCHANGE_FILE = Path(__file__).resolve().parents[2] / "configs" / "collectives" / "ep_exchange.yml"


@dataclass(frozen=True, slots=True)
class ExchangeLibrary:
    """One library's measured network efficiency: (nodes, fraction of the NICs' line rate), by node count."""

    name: str
    points: tuple[tuple[int, float], ...]
    source: str

    def network_efficiency(self, nodes: int) -> float:
        """The fraction of the NICs' line rate the exchange reaches over ``nodes`` nodes (at least 2)."""
        if nodes <= self.points[0][0]:
            return self.points[0][1]
        for (n0, e0), (n1, e1) in zip(self.points, self.points[1:], strict=False):
            if nodes <= n1:
                return e0 + (e1 - e0) * (nodes - n0) / (n1 - n0)
        return self.points[-1][1]


def _library(name: str, entry: dict) -> ExchangeLibrary:
    where = f"{EXCHANGE_FILE.name}: library {name}"
    try:
        nic = float(entry["nic_GBps"])
        measured = {int(n): [float(v) for v in values] for n, values in entry["measured"].items()}
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{where}: needs nic_GBps and measured {{nodes: [dispatch, combine] GB/s}} ({e})") from None
    if nic <= 0 or not measured or any(n < 2 or not values for n, values in measured.items()):
        raise InputError(f"{where}: measurements need 2 or more nodes and a positive nic_GBps")
    # the metric counts a token's copy to its own node, which symmetric routing reaches as often as any other
    points = tuple((n, sum(values) / len(values) * (n - 1) / n / nic) for n, values in sorted(measured.items()))
    return ExchangeLibrary(name, points, str(entry.get("source", "")))


@functools.cache
def exchange_libraries() -> dict[str, ExchangeLibrary]:
    """The shipped libraries by name."""
    data = read_yaml(str(EXCHANGE_FILE), "expert-parallel exchange libraries")
    return {name: _library(name, entry) for name, entry in sorted(data["libraries"].items())}


def exchange_library(name: str) -> ExchangeLibrary:
    """The library ``name``; an unknown name is an error listing the known ones."""
    libraries = exchange_libraries()
    found = libraries.get(name)
    if found is None:
        raise InputError(f"unknown expert-parallel exchange library {name!r}; valid: {', '.join(libraries)}")
    return found
