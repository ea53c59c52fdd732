"""ASTRA-sim's system, remote-memory and communicator-group files, loaded unchanged into typed objects.

Hyphenated keys map explicitly to fields with units in their names. Where ASTRA-sim 2.x crashes or
misbehaves on a missing key, a documented default is used or loading refuses with a ConfigError naming
file and key; keys ASTRA-sim does not read are accepted with a warning that they have no effect.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from network.values import MAX_COUNT, MAX_DELAY_NS, MAX_RATE, choice, flag, key_names, number, whole
from simulator.collectives.registry import parse_algorithm
from workload.errors import ConfigError, InputError, shown
from workload.files import read_json

Warn = Callable[[str], None]

SCHEDULING_POLICIES = ("LIFO", "FIFO", "EXPLICIT")
COLLECTIVE_OPTIMIZATIONS = ("baseline", "localBWAware")
IMPLEMENTATION_KEYS = {
    "all-reduce-implementation": "all_reduce",
    "all-gather-implementation": "all_gather",
    "reduce-scatter-implementation": "reduce_scatter",
    "all-to-all-implementation": "all_to_all",
}
# Keys 2.x reads but that only matter for things astrasim-py does not model (logs, memory traces, the
# LogGP shared-bus model), and keys present in many configs that 2.x does not read at all.
_NO_TIMING_EFFECT = ("trace-enabled", "track-local-mem", "local-mem-trace-filename", "L", "o", "g", "G",
                     "local-reduction-delay")
_NOT_READ_BY_ASTRA_SIM = ("boost-mode", "intra-dimension-scheduling", "inter-dimension-scheduling")
_CUSTOM_KEYS = ("all-reduce-implementation-custom", "all-gather-implementation-custom",
                "reduce-scatter-implementation-custom", "all-to-all-implementation-custom",
                "per-node-custom-implementation")

SYSTEM_KEYS = ("scheduling-policy", "collective-optimization", "endpoint-delay", "active-chunks-per-dimension",
               "preferred-dataset-splits", "local-mem-bw", "peak-perf", "roofline-enabled", "replay-only", "device",
               "model-shared-bus", *IMPLEMENTATION_KEYS, *_CUSTOM_KEYS, *_NO_TIMING_EFFECT, *_NOT_READ_BY_ASTRA_SIM)
MEMORY_KEYS = ("memory-type", "remote-mem-latency", "remote-mem-bw", "num-nodes", "num-npus-per-node")

# Used when no --system is given; the same as configs/system/default.json.
DEFAULT_SYSTEM: dict[str, Any] = {
    "scheduling-policy": "LIFO",
    "endpoint-delay": 10,
    "active-chunks-per-dimension": 1,
    "preferred-dataset-splits": 4,
    "all-reduce-implementation": ["ring"],
    "all-gather-implementation": ["ring"],
    "reduce-scatter-implementation": ["ring"],
    "all-to-all-implementation": ["ring"],
    "collective-optimization": "localBWAware",
    "local-mem-bw": 1600,
}


def default_system(num_dims: int) -> SystemConfig:
    """The built-in system used when none is given, with one algorithm per network dimension."""
    data = {k: v * num_dims if k.endswith("-implementation") else v for k, v in DEFAULT_SYSTEM.items()}
    return system_from_dict(data, "<built-in default system>")


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemConfig:
    """The system JSON. Defaults are ASTRA-sim's own where it has one (see ``defaults_used``)."""

    scheduling_policy: str = "LIFO"
    collective_optimization: str = "localBWAware"
    endpoint_delay_ns: float | None = None  # None: the key is absent (ASTRA-sim then uses 10, unscaled)
    active_chunks_per_dimension: int = 1
    preferred_dataset_splits: int = 1
    local_mem_bw_GBps: float | None = None  # GB/s with 1 GB = 1e9 bytes
    peak_perf_tflops: float | None = None
    roofline_enabled: bool = False
    replay_only: bool = False
    implementations: dict[str, tuple[str, ...]] = field(default_factory=dict)  # collective -> one per dim
    # collective -> the path prefix of a custom algorithm's Chakra ETs (<prefix>.<position>.et), covering all dims
    custom_implementations: dict[str, str] = field(default_factory=dict)
    device: str | None = None  # astrasim-py extension: a compute/devices.py preset name
    path: str = "<memory>"
    defaults_used: tuple[str, ...] = ()

    def endpoint_delay(self, injection_scale: float = 1.0) -> int:
        """ns charged per injected collective message: int(endpoint-delay * scale), or 10 when absent."""
        if self.endpoint_delay_ns is None:
            return 10  # ASTRA-sim's built-in value, which --injection-scale does not scale
        return int(int(self.endpoint_delay_ns) * injection_scale)

    def implementation(self, collective: str) -> tuple[str, ...]:
        return self.implementations.get(collective, ())

    def custom(self, collective: str) -> str | None:
        """The ET prefix of the custom algorithm this collective runs (ASTRA-sim's ``*-implementation-custom``,
        which takes precedence over the native implementation), or None."""
        return self.custom_implementations.get(collective)


def _number(data: dict[str, Any], key: str, path: str, kind: type = float, *, low: float = 0,
            high: float = MAX_DELAY_NS, positive: bool = False) -> Any:
    if kind is int:
        return whole(data[key], key, path, low=int(low), high=int(min(high, MAX_COUNT)))
    return number(data[key], key, path, low=low, high=high, positive=positive)


def _flag(data: dict[str, Any], key: str, path: str) -> bool:
    return flag(data[key], key, path)


def system_from_dict(data: dict[str, Any], path: str = "<memory>", warn: Warn | None = None) -> SystemConfig:
    warn = warn or (lambda message: None)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    kw: dict[str, Any] = {"path": path}
    defaults: list[str] = []

    def one_of(key: str, field_name: str, options: tuple[str, ...], default: str) -> None:
        if key in data:
            kw[field_name] = choice(data[key], key, path, options)
        else:
            defaults.append(f"{key}={default}")

    one_of("scheduling-policy", "scheduling_policy", SCHEDULING_POLICIES, "LIFO")
    one_of("collective-optimization", "collective_optimization", COLLECTIVE_OPTIMIZATIONS, "localBWAware")
    if "endpoint-delay" in data:
        kw["endpoint_delay_ns"] = _number(data, "endpoint-delay", path)
    if "active-chunks-per-dimension" in data:
        kw["active_chunks_per_dimension"] = _number(data, "active-chunks-per-dimension", path, int, low=1)
    if "preferred-dataset-splits" in data:
        kw["preferred_dataset_splits"] = _number(data, "preferred-dataset-splits", path, int, low=1)
    else:
        defaults.append("preferred-dataset-splits=1")  # ASTRA-sim divides by zero without it
    if "local-mem-bw" in data:  # GB/s
        kw["local_mem_bw_GBps"] = _number(data, "local-mem-bw", path, high=MAX_RATE, positive=True)
    if "peak-perf" in data:  # TFLOP/s
        kw["peak_perf_tflops"] = _number(data, "peak-perf", path, high=MAX_RATE, positive=True)
    for key, name in (("roofline-enabled", "roofline_enabled"), ("replay-only", "replay_only")):
        if key in data:
            kw[name] = _flag(data, key, path)
    if "device" in data:
        if not isinstance(data["device"], str):
            raise ConfigError(f"{path}: 'device' must be a device preset name (got {shown(data['device'])})")
        from compute.devices import device

        device(data["device"])  # an unknown name is an error listing the presets
        kw["device"] = data["device"]
    impls: dict[str, tuple[str, ...]] = {}
    for key, collective in IMPLEMENTATION_KEYS.items():
        if key not in data:
            continue
        names = data[key]
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names or len(names) > 64 or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{path}: '{key}' must be a list of algorithm names, one per dimension "
                              f"(got {shown(data[key])})")
        for n in names:
            try:
                parse_algorithm(n)
            except InputError as e:
                raise ConfigError(f"{path}: '{key}': {e}") from None
        impls[collective] = tuple(names)
    kw["implementations"] = impls

    custom: dict[str, str] = {}
    for key in _CUSTOM_KEYS:
        if key not in data:
            continue
        if key == "per-node-custom-implementation":
            raise ConfigError(f"{path}: '{key}' (a custom algorithm per workload node) is not supported; give one "
                              "per collective type with '<collective>-implementation-custom'")
        value = data[key]
        if not (isinstance(value, list) and len(value) == 1 and isinstance(value[0], str) and value[0]):
            raise ConfigError(f"{path}: '{key}' must be a list of one Chakra ET path prefix (it covers every "
                              f"dimension, as in ASTRA-sim), not {shown(value)}")
        beside = os.path.join(os.path.dirname(path), value[0]) if not os.path.isabs(value[0]) else value[0]
        # ASTRA-sim reads it relative to its working directory; beside the system file is tried first
        custom[key.replace("-implementation-custom", "").replace("-", "_")] = (
            beside if os.path.exists(f"{beside}.0.et") else value[0])
    kw["custom_implementations"] = custom
    if "model-shared-bus" in data and _flag(data, "model-shared-bus", path):
        warn(f"{path}: 'model-shared-bus' = 1 (ASTRA-sim's LogGP memory-bus model) is not modelled; "
             "collective timings will differ from ASTRA-sim")
    for key in _NOT_READ_BY_ASTRA_SIM:
        if key in data:
            warn(f"{path}: '{key}' is not read by ASTRA-sim 2.x and has no effect")
    quiet = [key for key in _NO_TIMING_EFFECT if key in data and data[key] not in (0, False, "")]
    if quiet:
        warn(f"{path}: {', '.join(quiet)}: accepted, but they only control ASTRA-sim's logs, memory traces or "
             "shared-bus model, which do not change simulated time here")
    unknown = key_names(set(data) - set(SYSTEM_KEYS))
    if unknown:
        warn(f"{path}: unknown key(s) {unknown} (ignored)")
    kw["defaults_used"] = tuple(defaults)
    return SystemConfig(**kw)


def load_system(path: str | os.PathLike[str], warn: Warn | None = None) -> SystemConfig:
    path = os.fspath(path)
    return system_from_dict(read_json(path, "system configuration"), path, warn)


MEMORY_TYPES = ("NO_MEMORY_EXPANSION", "PER_NPU_MEMORY_EXPANSION", "PER_NODE_MEMORY_EXPANSION", "MEMORY_POOL")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryConfig:
    """The remote-memory JSON."""

    memory_type: str = "NO_MEMORY_EXPANSION"
    latency_ns: int = 0
    bandwidth_bytes_per_ns: int = 0
    num_nodes: int = 0
    npus_per_node: int = 0
    path: str = "<memory>"

    def access_time_ns(self, tensor_size: int) -> int:
        """remote-mem-latency + floor(tensor_size / remote-mem-bw)."""
        return self.latency_ns + int(float(tensor_size) / self.bandwidth_bytes_per_ns)


def memory_from_dict(data: dict[str, Any], path: str = "<memory>", warn: Warn | None = None) -> MemoryConfig:
    warn = warn or (lambda message: None)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    kw: dict[str, Any] = {"path": path}
    if "memory-type" in data:
        kw["memory_type"] = choice(data["memory-type"], "memory-type", path, MEMORY_TYPES)
    for key, name, high in (("remote-mem-latency", "latency_ns", MAX_DELAY_NS),
                            ("remote-mem-bw", "bandwidth_bytes_per_ns", MAX_RATE),
                            ("num-nodes", "num_nodes", MAX_COUNT), ("num-npus-per-node", "npus_per_node", MAX_COUNT)):
        if key in data:
            kw[name] = _number(data, key, path, int, low=0, high=high)
    mtype = kw.get("memory_type", "NO_MEMORY_EXPANSION")
    if mtype != "NO_MEMORY_EXPANSION" and kw.get("bandwidth_bytes_per_ns", 0) <= 0:
        raise ConfigError(f"{path}: {mtype} needs a positive 'remote-mem-bw' (bytes per ns)")
    if mtype == "PER_NODE_MEMORY_EXPANSION" and (kw.get("num_nodes", 0) < 1 or kw.get("npus_per_node", 0) < 1):
        raise ConfigError(f"{path}: PER_NODE_MEMORY_EXPANSION needs positive 'num-nodes' and 'num-npus-per-node'")
    unknown = key_names(set(data) - set(MEMORY_KEYS))
    if unknown:
        warn(f"{path}: unknown key(s) {unknown} (ignored)")
    return MemoryConfig(**kw)


def check_memory_fits(memory: MemoryConfig, num_npus: int) -> None:
    """PER_NODE_MEMORY_EXPANSION must cover the network's NPUs exactly: num-nodes x num-npus-per-node."""
    if memory.memory_type == "PER_NODE_MEMORY_EXPANSION" and memory.num_nodes * memory.npus_per_node != num_npus:
        raise ConfigError(f"{memory.path}: 'num-nodes' x 'num-npus-per-node' = {memory.num_nodes} x "
                          f"{memory.npus_per_node} = {memory.num_nodes * memory.npus_per_node}, but the network has "
                          f"{num_npus} NPUs")


def load_memory(path: str | os.PathLike[str], warn: Warn | None = None) -> MemoryConfig:
    path = os.fspath(path)
    return memory_from_dict(read_json(path, "remote-memory configuration"), path, warn)
