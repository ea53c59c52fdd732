"""The unit of every bandwidth astrasim-py reads or writes, in one place.

Two conventions meet in one run. ASTRA-sim reads a network file's ``bandwidth`` as GB/s with GB = 2^30 bytes
(a GiB/s, though its files say GB/s); the bandwidths we report (algbw and busbw as nccl-tests defines them),
hardware profiles and the system file's ``local-mem-bw`` use GB = 10^9 bytes. So every name that holds a
bandwidth carries its unit: ``_GiBps`` is 2^30 bytes per second, ``_GBps`` 10^9 bytes per second, ``_Gbps``
gigabits per second (NIC speeds, as vendors state them), ``_bytes_per_ns`` what it says; and every printed
figure says which GB it is.

Earlier versions named these ``*_gbps`` (which reads as gigabits); ``LEGACY_KEYS`` maps those names
to the current ones, and whatever reads results back (the HTML report, sweep databases, ``plot``) accepts both.
"""

from __future__ import annotations

from typing import Any

REPORTED_GB = "GB/s with GB = 10^9 B (as nccl-tests)"
NETWORK_GB = "GB/s with GB = 2^30 B (as ASTRA-sim reads them)"
LOCAL_GB = "GB/s with GB = 10^9 B"

# Output keys (JSON, CSV headers, sweep columns) as named before 0.2 -> their current names.
LEGACY_KEYS = {
    "algbw_gbps": "algbw_GBps",
    "busbw_gbps": "busbw_GBps",
    "bandwidth_gbps": "bandwidth_GiBps",
    "local_mem_bw_gbps": "local_mem_bw_GBps",
    "memory_bw_gbps": "memory_bw_GBps",
}

# The "units" entry of a results JSON: what every number means.
UNITS = {
    "times": "ns (every *_ns; integers)",
    "sizes": "bytes (every *bytes*; integers)",
    "collectives[].algbw_GBps": REPORTED_GB,
    "collectives[].busbw_GBps": REPORTED_GB,
    "config.network.bandwidth_GiBps": NETWORK_GB + ": the network file's 'bandwidth' as written",
    "config.system.local_mem_bw_GBps": LOCAL_GB + " (the system file's 'local-mem-bw', as ASTRA-sim reads it)",
    "config.system.peak_perf_tflops": "TFLOP/s (10^12 FLOP/s)",
    "config.compute.memory_bw_GBps": LOCAL_GB,
    "config.compute.peak_tflops": "TFLOP/s (10^12 FLOP/s)",
    "config.memory.bandwidth_bytes_per_ns": "bytes per ns (the memory file's 'remote-mem-bw')",
    "hardware profile *_GBps": REPORTED_GB,
    "hardware profile *_Gbps": "gigabits per second (10^9 bit/s)",
    "renamed": "in results of earlier versions: " + ", ".join(f"{old} -> {new}" for old, new in LEGACY_KEYS.items()),
}

# Sweep settings that hold a bandwidth (the key after 'SECTION.', without [i]) and their unit.
_SETTING_UNITS = {
    "network": {key: "GB/s, GB = 2^30 B" for key in
                ("bandwidth", "uplink_bandwidth", "nvlink_bandwidth", "nic_bandwidth", "spine_bandwidth")},
    "system": {"local-mem-bw": "GB/s, GB = 10^9 B", "peak-perf": "TFLOP/s"},
    "memory": {"remote-mem-bw": "bytes/ns"},
}


def current_key(name: str) -> str:
    """A key's current name (an earlier version's ``*_gbps`` name maps to the name with its unit)."""
    return LEGACY_KEYS.get(name, name)


def with_current_keys(mapping: dict[str, Any]) -> dict[str, Any]:
    """The mapping with earlier versions' key names replaced (shallow; order kept)."""
    return {current_key(k): v for k, v in mapping.items()}


def upgrade_results(doc: Any) -> Any:
    """A results JSON as this version writes it: earlier versions' key names replaced where the report reads them.
    Anything not shaped like a results file is returned unchanged (the reader's checks then say what is wrong)."""
    if not isinstance(doc, dict):
        return doc
    doc = dict(doc)
    if isinstance(doc.get("collectives"), list):
        doc["collectives"] = [with_current_keys(c) if isinstance(c, dict) else c for c in doc["collectives"]]
    config = doc.get("config")
    if isinstance(config, dict):
        doc["config"] = {k: with_current_keys(v) if isinstance(v, dict) else v for k, v in config.items()}
    return doc


def setting_unit(setting: str) -> str | None:
    """The unit of a swept setting such as ``network.bandwidth[1]`` (None when it is not a rate)."""
    section, _, key = setting.partition(".")
    return _SETTING_UNITS.get(section, {}).get(key.partition("[")[0])


def column_units(names: list[str]) -> dict[str, str]:
    """{column: unit} for the columns of a sweep database (or CSV) that hold a time or a rate."""
    units = {}
    for name in map(current_key, names):
        if name.endswith("_ns") or "_ns_" in name:
            units[name] = "ns"
        elif name.endswith("_GBps"):
            units[name] = REPORTED_GB
        elif name == "device_memory_bytes":
            units[name] = "B"
        elif setting_unit(name):
            units[name] = str(setting_unit(name))
    return units


def labelled(name: str) -> str:
    """An axis or column label: the setting or metric name with its unit where it holds a rate."""
    name = current_key(name)
    if name.endswith("_GBps"):
        return f"{name.removesuffix('_GBps')} (GB/s, GB = 10^9 B)"
    unit = setting_unit(name)
    return f"{name} ({unit})" if unit else name
