"""Which shipped hardware profile and compute device a published run used, and the network its nodes imply.

A table describes its machine in prose ("A100-SXM4-80GB", "NVLink3 + NVSwitch (DGX A100)", "8x Mellanox HDR 200
Gb/s IB HCAs per node ..."). The GPU model picks the candidate profiles; everything else the row states (memory
size, NVLink generation, NIC count, speed and transport, GPUs per node) must agree with the profile, so a
machine we have no profile for is reported as such instead of being run on a look-alike. What the row does not
state is taken from the profile and listed among the defaults used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from compute.devices import device as device_preset
from network.config import NetworkConfig
from simulator.collectives.hardware import HardwareProfile, load_profile, profile_names
from workload.errors import InputError

# the GPU model as tables and profiles write it; the order matters (GB200 before B200)
_GPU = re.compile(r"(GB300|GB200|B300|B200|H200|H100|A100|MI355X|MI325X|MI300X|Gaudi ?\d*|TPU[- ]?[A-Za-z0-9]+)",
                  re.IGNORECASE)
_MEMORY = re.compile(r"(\d+)\s*GB\b", re.IGNORECASE)
_NICS = re.compile(r"(\d+)\s*x\s[^,;]*?(\d+)\s*Gb/?s", re.IGNORECASE)
NVLINK_ARCH = {"3": "ampere", "4": "hopper", "5": "blackwell"}  # NVLink generation -> the GPU architecture
# shipped profiles in the order a row that leaves its network unstated prefers them (NVIDIA's reference systems)
PREFERRED = ("dgx-a100", "hgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "gb300-nvl72", "mi300x", "mi325x", "mi355x")


def gpu_model(text: str) -> str:
    """"NVIDIA H100-SXM5-80GB" -> "H100"; "" when no known GPU model is named."""
    found = _GPU.search(text)
    return found.group(1).upper().replace(" ", "") if found else ""


@dataclass(frozen=True, slots=True)
class StatedMachine:
    """What a row says about its machine (None where it says nothing)."""

    gpu: str
    memory_GB: int | None
    nvlink_arch: str | None
    nics_per_node: int | None
    nic_Gbps: float | None
    transport: str | None
    gpus_per_node: int | None


def stated_machine(gpu: str, intra_node: str, inter_node: str, gpus_per_node: int | None) -> StatedMachine:
    memory = _MEMORY.search(gpu)
    nvlink = re.search(r"NVLink\s*(?:Gen\s*)?(\d)", intra_node, re.IGNORECASE)
    nics = speed = None
    parts = re.split(r"[,;]", inter_node)
    compute = [p for p in parts if "compute" in p.lower()] or parts
    for part in compute:
        found = _NICS.search(part)
        if found:
            nics, speed = int(found.group(1)), float(found.group(2))
            break
    low = inter_node.lower()
    transport = ("ib" if re.search(r"\bib\b|infiniband", low) else "efa" if "efa" in low else
                 "roce" if "roce" in low or "ethernet" in low else "tcp" if "tcp" in low else None)
    return StatedMachine(gpu_model(gpu), int(memory.group(1)) if memory else None,
                         NVLINK_ARCH.get(nvlink.group(1)) if nvlink else None, nics, speed, transport, gpus_per_node)


def disagreements(machine: StatedMachine, profile: HardwareProfile) -> list[str]:
    """What the row states that the profile contradicts ([] = it matches)."""
    out = []
    if gpu_model(profile.gpu) != machine.gpu:
        out.append(f"GPU {machine.gpu or '?'} vs {profile.gpu}")
    memory = _MEMORY.search(profile.gpu)
    if machine.memory_GB is not None and memory and int(memory.group(1)) != machine.memory_GB:
        out.append(f"{machine.memory_GB} GB vs {profile.gpu}")
    if machine.nvlink_arch is not None and machine.nvlink_arch != profile.arch:
        out.append(f"NVLink of {machine.nvlink_arch} GPUs vs {profile.arch}")
    if machine.gpus_per_node is not None and machine.gpus_per_node not in (profile.gpus_per_node,
                                                                           profile.gpus_per_host):
        out.append(f"{machine.gpus_per_node} GPUs per node vs {profile.gpus_per_node}")
    out_ = profile.scale_out
    if machine.nics_per_node is not None and (out_ is None or out_.nics_per_node != machine.nics_per_node
                                              or out_.nic_bandwidth_Gbps != machine.nic_Gbps):
        have = f"{out_.nics_per_node}x {out_.nic_bandwidth_Gbps:g} Gb/s" if out_ else "no NICs"
        out.append(f"NICs {machine.nics_per_node}x {machine.nic_Gbps:g} Gb/s vs {have}")
    if machine.transport is not None and out_ is not None and machine.transport != out_.transport:
        out.append(f"{machine.transport} vs {out_.transport}")
    return out


@lru_cache(maxsize=1)
def shipped_profiles() -> tuple[HardwareProfile, ...]:
    return tuple(load_profile(n) for n in profile_names())


@dataclass(frozen=True, slots=True)
class HardwareChoice:
    profile: HardwareProfile | None
    device: str | None  # the compute model's device name
    defaults_used: tuple[str, ...] = ()
    problem: str = ""


def choose_hardware(machine: StatedMachine, override: str | None = None) -> HardwareChoice:
    """The shipped profile matching ``machine`` (or the ``override`` profile), and its compute device."""
    defaults: list[str] = []
    if override is not None:
        profile = load_profile(override)
        differs = disagreements(machine, profile)
        if machine.gpus_per_node is not None and machine.gpus_per_node not in (profile.gpus_per_node,
                                                                               profile.gpus_per_host):
            return HardwareChoice(None, None, problem=f"the row has {machine.gpus_per_node} GPUs per node, profile "
                                                      f"{profile.name} {profile.gpus_per_node}")
        if differs:
            defaults.append(f"hardware profile {profile.name} (--hw-profile; the row states "
                            f"{'; '.join(differs)})")
    else:
        if not machine.gpu:
            return HardwareChoice(None, None, problem="the row names no GPU model we know")
        candidates = shipped_profiles()
        same_gpu = [p for p in candidates if gpu_model(p.gpu) == machine.gpu]
        matching = [p for p in same_gpu if not disagreements(machine, p)]
        if not matching:
            why = "; ".join(f"{p.name}: {', '.join(disagreements(machine, p))}" for p in same_gpu)
            return HardwareChoice(None, None, problem=f"no shipped hardware profile for {machine.gpu}"
                                  + (f" as the row describes it ({why})" if why else "")
                                  + "; give one with --hw-profile")
        rank = {name: i for i, name in enumerate(PREFERRED)}
        matching.sort(key=lambda p: (rank.get(p.name, len(PREFERRED)), p.name))
        profile = matching[0]
        unstated = [what for what, value in (("NICs", machine.nics_per_node), ("NVLink", machine.nvlink_arch),
                                              ("GPUs per node", machine.gpus_per_node)) if value is None]
        if unstated:
            defaults.append(f"hardware profile {profile.name} ({', '.join(unstated)} not stated: the profile's; "
                            f"{len(matching)} shipped profile(s) fit)")
    name = gpu_model(profile.gpu)
    try:
        device = device_preset(name).name
    except InputError:
        return HardwareChoice(profile, None, tuple(defaults), problem=f"no compute device model for {profile.gpu}")
    return HardwareChoice(profile, device, tuple(defaults))


def network_for(profile: HardwareProfile, npus: int, label: str) -> NetworkConfig:
    """Nodes of ``profile.gpus_per_node`` GPUs on one switch each, the nodes on a second switch level, with the
    profile's scale-up and per-GPU share of scale-out bandwidth (the collective model reads the profile itself;
    the network sets the NPU count and the two levels). A node is the profile's NVLink domain: 8 GPUs of an HGX
    board, or the 72 of an NVL72 rack (a run of up to 72 GPUs is one domain; a larger one lies in equal slices of
    whole trays, HardwareProfile.for_job)."""
    profile = profile.for_job(npus)
    per_node = min(profile.gpus_per_node, npus)
    nodes = -(-npus // per_node)
    if per_node * nodes != npus:
        raise InputError(f"{label}: {npus} GPUs do not fill whole nodes of {per_node} ({profile.name}; how the run "
                         f"spread them over its nodes is not stated: give a profile file whose gpus_per_node divides "
                         f"{npus} with --hw-profile)")
    to_gib = 1e9 / 2**30  # profiles use GB = 10^9 B, network files GB = 2^30 B
    up = profile.scale_up
    topology, counts, bandwidth, latency = ["Switch"], [per_node], [up.bandwidth_GBps * to_gib], [up.latency_us * 1e3]
    if nodes > 1:
        out = profile.scale_out
        if out is None:
            raise InputError(f"{label}: {nodes} nodes, but hardware profile {profile.name} has no scale-out NICs")
        topology.append("Switch")
        counts.append(nodes)
        bandwidth.append(out.nics_per_node * out.nic_GBps / per_node * to_gib)
        latency.append(out.latency_us * 1e3)
    return NetworkConfig(tuple(topology), tuple(counts), tuple(bandwidth), tuple(latency), path=f"<{label}>")
