"""The network configuration, loaded into a typed object: ASTRA-sim's network YAML

    topology: [ Ring, Switch ]     # one building block per dimension: Ring, FullyConnected, Switch
    npus_count: [ 8, 4 ]           # NPUs per dimension (each > 1); dimension 0 is innermost
    bandwidth: [ 50.0, 25.0 ]      # GB/s per link, with 1 GB = 2**30 bytes
    latency: [ 500.0, 1000.0 ]     # ns per hop

or a fabric file (``fabric: fat-tree | torus | ...``, network/fabrics.py). Either may carry a ``packet:``
section for the packet-level backend (network/packet.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from network.fabrics import fabric_from_dict
from network.packet_config import PacketConfig, packet_config_from_dict
from network.topology import DimensionOrderRouter, EcmpRouter, Fabric, from_dimensions
from network.values import MAX_LATENCY_NS, MAX_BANDWIDTH_GiBps, check_size, choice, key_names, number, whole
from workload.errors import ConfigError
from workload.files import read_yaml

BUILDING_BLOCKS = ("Ring", "FullyConnected", "Switch")
NETWORK_KEYS = ("topology", "npus_count", "bandwidth", "latency")


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    topology: tuple[str, ...]
    npus_count: tuple[int, ...]
    bandwidth_GiBps: tuple[float, ...]  # GB/s, 1 GB = 2**30 bytes
    latency_ns: tuple[float, ...]
    path: str = "<memory>"
    fabric: Fabric | None = field(default=None, compare=False, repr=False)  # a real fabric, else dimensions
    packet: PacketConfig = field(default_factory=PacketConfig)  # the packet backend's parameters

    @property
    def num_dims(self) -> int:
        return len(self.topology)

    @property
    def num_npus(self) -> int:
        return math.prod(self.npus_count)

    def bytes_per_ns(self, dim: int) -> float:
        """Link bandwidth of a dimension in bytes per ns, computed as ASTRA-sim does."""
        return self.bandwidth_GiBps[dim] * (1 << 30) / 1_000_000_000

    def coordinates(self, npu: int) -> tuple[int, ...]:
        """The NPU's coordinate in every dimension (dimension 0 varies fastest)."""
        out = []
        for count in self.npus_count:
            out.append(npu % count)
            npu //= count
        return tuple(out)

    def routed_fabric(self) -> tuple[Fabric, EcmpRouter | DimensionOrderRouter]:
        """The physical fabric and its router (ASTRA-sim dimensions become rings, meshes and switches)."""
        if self.fabric is not None:
            return self.fabric, EcmpRouter(self.fabric)
        return from_dimensions(self.topology, self.npus_count, self.bandwidth_GiBps, self.latency_ns, self.path)

    def summary(self) -> dict[str, Any]:
        """The configuration as plain data (for results files)."""
        out: dict[str, Any] = {"topology": list(self.topology), "npus_count": list(self.npus_count),
                               "bandwidth_GiBps": list(self.bandwidth_GiBps), "latency_ns": list(self.latency_ns),
                               "path": self.path, "packet": asdict(self.packet)}
        if self.fabric is not None:
            out["fabric"] = {"kind": self.fabric.kind, "npus": self.fabric.num_npus,
                             "switches": self.fabric.num_switches, "links": self.fabric.num_links}
        return out

    def describe(self) -> str:
        if self.fabric is not None:
            return self.fabric.describe()
        dims = " x ".join(f"{t}({n})" for t, n in zip(self.topology, self.npus_count, strict=True))
        return f"{dims} = {self.num_npus} NPUs"


def _as_list(data: dict[str, Any], key: str, path: str) -> list[Any]:
    if key not in data:
        raise ConfigError(f"{path}: missing key '{key}' (a network file needs {', '.join(NETWORK_KEYS)})")
    value = data[key]
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise ConfigError(f"{path}: '{key}' is empty")
    return value


def network_from_dict(data: Any, path: str = "<memory>", warn: Any = None) -> NetworkConfig:
    """Build a NetworkConfig from parsed YAML, checking it as ASTRA-sim does (with clearer errors)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with keys {', '.join(NETWORK_KEYS)} (or a 'fabric' file)")
    packet = packet_config_from_dict(data["packet"], path) if "packet" in data else PacketConfig()
    if "fabric" in data:
        fabric = fabric_from_dict(data, path)
        dims = fabric.logical_dims
        bw, lat = fabric.link(0, next(iter(fabric.graph.successors(0))))
        return NetworkConfig((fabric.kind,) * len(dims), dims, (bw,) * len(dims), (lat,) * len(dims), path, fabric,
                             packet)
    unknown = key_names(set(data) - set(NETWORK_KEYS) - {"packet"})
    if unknown and warn is not None:
        warn(f"{path}: ignoring unknown network key(s) {unknown}")
    topology = _as_list(data, "topology", path)
    npus = _as_list(data, "npus_count", path)
    bandwidth = _as_list(data, "bandwidth", path)
    latency = _as_list(data, "latency", path)
    for name, values in (("npus_count", npus), ("bandwidth", bandwidth), ("latency", latency)):
        if len(values) != len(topology):
            raise ConfigError(f"{path}: '{name}' has {len(values)} entries but 'topology' has {len(topology)} "
                              "(one entry per dimension)")
    blocks = tuple(choice(t, "topology", path, BUILDING_BLOCKS) for t in topology)
    npus_i = tuple(whole(n, "npus_count", path, low=2) for n in npus)
    check_size(math.prod(npus_i), 0, path, "this network")
    bw = tuple(number(b, "bandwidth", path, high=MAX_BANDWIDTH_GiBps, positive=True) for b in bandwidth)
    lat = tuple(number(x, "latency", path, high=MAX_LATENCY_NS) for x in latency)
    return NetworkConfig(blocks, npus_i, bw, lat, path, packet=packet)


def load_network(path: str | os.PathLike[str], warn: Any = None) -> NetworkConfig:
    path = os.fspath(path)
    return network_from_dict(read_yaml(path, "network configuration"), path, warn)


def load_packet_config(path: str | os.PathLike[str]) -> PacketConfig:
    """The packet parameters of a YAML file: its ``packet:`` section, or the file itself."""
    path = os.fspath(path)
    data = read_yaml(path, "packet configuration")
    if isinstance(data, dict) and isinstance(data.get("packet"), dict):
        data = data["packet"]
    return packet_config_from_dict(data, path)
