"""Hardware profiles for the NCCL/RCCL-like collective model: a node's GPUs, its scale-up and scale-out fabrics,
the collective library and its calibration (``configs/hardware/*.yml``).

Bandwidths carry their unit in the key: ``_GBps`` is gigabytes per second per direction with GB = 10^9 bytes
(as nccl-tests' busbw), ``_Gbps`` gigabits per second (NIC speeds as vendors state them).

    name: hgx-h200
    gpu: H200-SXM
    gpus_per_node: 8            # a node is one NVLink domain (8 on an HGX board, 72 on an NVL72 rack)
    gpus_per_host: 4            # optional: a domain of several hosts (NVL72: 4-GPU compute trays); see for_job
    host_cpu: grace             # optional: the CPU issuing the kernels, x86 (default) or grace (workload/llm/host.py)
    library: nccl               # nccl | rccl
    library_version: "2.27.7"
    arch: hopper                # the library's tuning constants: volta, ampere, hopper, blackwell, cdna3, cdna4
    scale_up: {fabric: nvswitch, links_per_gpu: 18, link_bandwidth_GBps: 25, latency_us: 0.6, nvls: true}
    scale_out: {nics_per_node: 8, nic_bandwidth_Gbps: 400, transport: ib, latency_us: 2.5, sharp: false,
                efficiency: 0.94,       # optional: fraction of line rate NCCL streams reach (else the transport's)
                path_efficiency: 1.0,   # optional: what the machine's GPU-NIC path lets through (1: bare metal)
                buffsize_bytes: 4194304, nvls_chunk_bytes: 131072}  # optional: NCCL_BUFFSIZE, NCCL_NVLS_CHUNKSIZE
    tuner: aws-ofi-nccl/p6-b200  # a tuner plugin the library loads, which overrides its choice (optional)
    algorithms: [ring, tree]    # NCCL_ALGO / NCCL_PROTO as the platform's recommended environment sets them
    protocols: [Simple, LL128]  # (optional; all-to-all and send/recv are not restricted by NCCL_ALGO)
    msccl:                      # RCCL: MSCCL programs it loads, chosen before its tuning model (optional)
    - {collective: all_reduce, gpus: 8, protocol: LL, min_bytes: 0, max_bytes: 65536, chunks_per_loop: 256,
       channels: 4}
    assumptions: ["..."]        # figures no source states
    sources: ["..."]
    calibration: {...}          # written by `astrasim-py calibrate`; see simulator/collectives/nccl.py
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from network.values import choice, flag, key_names, number, texts, whole
from simulator.collectives.network import DEFAULT_BUFFSIZE_BYTES, DEFAULT_NVLS_CHUNK_BYTES, TRANSPORT_DEFAULTS
from simulator.collectives.tuner import TUNERS
from workload.errors import ConfigError, InputError, shown
from workload.files import read_yaml, shown_path
from workload.llm.host import HOST_CPUS

PROFILES_DIR = Path(__file__).resolve().parents[2] / "configs" / "hardware"
FABRICS = ("nvswitch", "xgmi-mesh", "pcie")
TRANSPORTS = ("ib", "roce", "efa", "tcp")
LIBRARIES = ("nccl", "rccl")
ARCHS = ("volta", "ampere", "hopper", "blackwell", "cdna3", "cdna4")
MAX_GBPS = 1e6


@dataclass(frozen=True, slots=True)
class ScaleUp:
    fabric: str
    links_per_gpu: int
    link_bandwidth_GBps: float  # per link and direction
    latency_us: float
    nvls: bool  # in-switch reduction (NVLink SHARP)

    @property
    def bandwidth_GBps(self) -> float:
        """One GPU's scale-up bandwidth per direction, all links together."""
        return self.links_per_gpu * self.link_bandwidth_GBps


@dataclass(frozen=True, slots=True)
class ScaleOut:
    nics_per_node: int
    nic_bandwidth_Gbps: float
    transport: str
    latency_us: float  # one-way latency a network message adds beyond the library's per-step constants
    sharp: bool  # in-network reduction (CollNet)
    efficiency: float | None = None  # fraction of line rate long NCCL streams reach; None: the transport's default
    path_efficiency: float = 1.0  # the machine's: fraction of line rate its GPU-NIC PCIe path lets through
    buffsize_bytes: int = DEFAULT_BUFFSIZE_BYTES  # NCCL_BUFFSIZE (a network slot is 1/8 of it)
    nvls_chunk_bytes: int = DEFAULT_NVLS_CHUNK_BYTES  # NCCL_NVLS_CHUNKSIZE

    @property
    def nic_GBps(self) -> float:
        return self.nic_bandwidth_Gbps / 8

    @property
    def stream_efficiency(self) -> float:
        return self.efficiency if self.efficiency is not None else TRANSPORT_DEFAULTS[self.transport].efficiency


@dataclass(frozen=True, slots=True)
class MscclProgram:
    """One MSCCL program the library loads (RCCL's ``tools/msccl-algorithms``): it runs a single-node collective of
    exactly ``gpus`` ranks whose size lies in [min_bytes, max_bytes] and whose element count (4-byte elements, as
    nccl-tests/rccl-tests use by default) divides into ``chunks_per_loop`` chunks; the library then uses it instead
    of its own algorithms."""

    collective: str
    gpus: int
    protocol: str
    min_bytes: int
    max_bytes: int
    chunks_per_loop: int
    channels: int

    def runs(self, kind: str, size_bytes: int, ranks: int, nodes: int) -> bool:
        return (kind == self.collective and nodes == 1 and ranks == self.gpus
                and self.min_bytes <= size_bytes <= self.max_bytes
                and size_bytes % 4 == 0 and (size_bytes // 4) % self.chunks_per_loop == 0)


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    gpu: str
    gpus_per_node: int
    library: str
    library_version: str
    arch: str
    scale_up: ScaleUp
    scale_out: ScaleOut | None
    msccl: tuple[MscclProgram, ...] = ()
    tuner: str | None = None  # a tuner plugin the library loads (simulator/collectives/tuner.py)
    algorithms: tuple[str, ...] | None = None  # NCCL_ALGO as the platform's environment sets it (None: all)
    protocols: tuple[str, ...] | None = None  # NCCL_PROTO likewise
    assumptions: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    calibration: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    gpus_per_host: int | None = None  # hosts (schedulable machines) of a multi-host NVLink domain; None: one host
    host_cpu: str = "x86"  # the CPU issuing the kernels (workload/llm/host.py): x86 or grace

    @property
    def nics_per_node(self) -> int:
        """NICs a node's traffic leaves by (1 for a profile without scale-out NICs)."""
        return self.scale_out.nics_per_node if self.scale_out is not None else 1

    def nic_of(self, ranks: Any) -> Any:
        """The NIC rank(s) ``ranks`` leave their node by, numbered across nodes (node x NICs per node + index):
        a node's NICs split its GPUs into equal blocks of consecutive ranks. An int or an array of ranks."""
        gpn, nics = self.gpus_per_node, self.nics_per_node
        return (ranks // gpn) * nics + (ranks % gpn) * nics // gpn

    def for_job(self, npus: int) -> HardwareProfile:
        """The profile as a job of ``npus`` GPUs sees it. On a domain of several hosts a job beyond one domain is
        placed in equal slices of whole hosts, as Slurm's ``--segment`` places it (Megatron-Bridge's launcher asks
        for the largest number of hosts per domain that divides the job's): 128 GPUs on NVL72 racks of 18 4-GPU
        trays are two slices of 64. A node of the returned profile is such a slice, with its share of the NICs."""
        host = self.gpus_per_host
        if host is None or npus <= self.gpus_per_node or npus % host:
            return self
        hosts = npus // host
        per_slice = next(d for d in range(self.gpus_per_node // host, 0, -1) if hosts % d == 0) * host
        if per_slice == self.gpus_per_node:
            return self
        out = self.scale_out
        if out is not None:
            out = replace(out, nics_per_node=max(1, out.nics_per_node * per_slice // self.gpus_per_node))
        return replace(self, gpus_per_node=per_slice, scale_out=out)

    def parameters(self) -> dict[str, dict[str, float]]:
        """Calibrated timing parameters by candidate key ("ring/LL/intra"), as checked on loading."""
        return self.calibration.get("parameters", {})


_TOP = {"name", "description", "gpu", "gpus_per_node", "gpus_per_host", "host_cpu", "library", "library_version",
        "arch", "scale_up", "scale_out", "msccl", "tuner", "algorithms", "protocols", "assumptions", "sources",
        "calibration"}
_UP = {"fabric", "links_per_gpu", "link_bandwidth_GBps", "latency_us", "nvls"}
_OUT = {"nics_per_node", "nic_bandwidth_Gbps", "transport", "latency_us", "sharp", "efficiency", "path_efficiency",
        "buffsize_bytes", "nvls_chunk_bytes"}
_MSCCL = {"collective", "gpus", "protocol", "min_bytes", "max_bytes", "chunks_per_loop", "channels"}
_OPTIONAL = {"description", "gpus_per_host", "host_cpu", "assumptions", "sources", "calibration", "scale_out", "sharp",
             "nvls", "msccl", "tuner", "algorithms", "protocols",
             "efficiency", "path_efficiency", "buffsize_bytes", "nvls_chunk_bytes"}
MSCCL_COLLECTIVES = ("all_reduce", "all_gather", "all_to_all")
MSCCL_PROTOCOLS = ("LL", "LL128", "Simple")
ENV_ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "collnet", "pat")  # what NCCL_ALGO selects among
_KEY = re.compile(r"[a-z_]+/(LL|LL128|Simple)/(intra|inter)(@[1-9][0-9]{0,6})?")
PARAMETER_KEYS = ("latency_us", "hop_latency_us", "efficiency", "fill_us", "fill_MB")


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yml"))


def load_profile(name_or_path: str) -> HardwareProfile:
    """A shipped profile by name ("hgx-h100") or a profile file (``*.yml``/``*.yaml``)."""
    path = Path(name_or_path)
    if path.suffix not in (".yml", ".yaml"):
        path = PROFILES_DIR / f"{name_or_path}.yml"
        if not path.is_file():
            raise InputError(f"unknown hardware profile {shown(name_or_path)}; valid: {', '.join(profile_names())} "
                             "or a profile file (.yml)")
    return parse_profile(read_yaml(str(path), "hardware profile"), shown_path(str(path)), str(path))


def _section(data: Any, key: str, where: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: '{key}' must be a mapping (got {shown(data)})")
    unknown = set(data) - keys
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) in '{key}': {key_names(unknown)}; valid: {', '.join(sorted(keys))}")
    missing = [k for k in sorted(keys) if k not in data and k not in _OPTIONAL]
    if missing:
        raise ConfigError(f"{where}: '{key}' misses {', '.join(missing)}")
    return data


def _text(value: Any, key: str, where: str) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or len(str(value)) > 200:
        raise ConfigError(f"{where}: '{key}' must be a short text (got {shown(value)})")
    return str(value)


def _names(value: Any, key: str, where: str, valid: tuple[str, ...]) -> tuple[str, ...] | None:
    """A non-empty list of names from ``valid`` (a profile's NCCL_ALGO / NCCL_PROTO), None when absent."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or any(v not in valid for v in value):
        raise ConfigError(f"{where}: '{key}' must be a non-empty list of {', '.join(valid)} (got {shown(value)})")
    return tuple(value)


def check_parameters(params: Any, where: str) -> dict[str, dict[str, float]]:
    """The calibration's ``parameters``: {"algo/proto/scope": {latency_us, hop_latency_us, efficiency, fill_us,
    fill_MB}}, every value a finite number in range."""
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: 'calibration.parameters' must be a mapping")
    checked: dict[str, dict[str, float]] = {}
    for key, values in params.items():
        if not isinstance(key, str) or key.count("/") != 2 or not _KEY.fullmatch(key):
            raise ConfigError(f"{where}: calibration key {shown(key)} must read algorithm/protocol/scope "
                              "(optionally @GPUs)")
        if not isinstance(values, dict) or set(values) - set(PARAMETER_KEYS):
            raise ConfigError(f"{where}: calibration '{key}' must map some of {', '.join(PARAMETER_KEYS)} to numbers")
        checked[key] = {
            k: number(v, f"calibration.{key}.{k}", where, high=1.0 if k == "efficiency" else 1e7,
                      positive=k == "efficiency")
            for k, v in values.items()}
    return checked


def _msccl(data: Any, where: str) -> tuple[MscclProgram, ...]:
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ConfigError(f"{where}: 'msccl' must be a list of programs")
    programs = []
    for i, entry in enumerate(data):
        e = _section(entry, f"msccl[{i}]", where, _MSCCL)
        at = f"msccl[{i}]"
        low = whole(e["min_bytes"], f"{at}.min_bytes", where, low=0, high=1 << 50)
        programs.append(MscclProgram(
            collective=choice(e["collective"], f"{at}.collective", where, MSCCL_COLLECTIVES),
            gpus=whole(e["gpus"], f"{at}.gpus", where, low=2, high=1024),
            protocol=choice(e["protocol"], f"{at}.protocol", where, MSCCL_PROTOCOLS),
            min_bytes=low,
            max_bytes=whole(e["max_bytes"], f"{at}.max_bytes", where, low=max(low, 1), high=1 << 50),
            chunks_per_loop=whole(e["chunks_per_loop"], f"{at}.chunks_per_loop", where, high=1 << 20),
            channels=whole(e["channels"], f"{at}.channels", where, high=1024)))
    return tuple(programs)


def parse_profile(data: Any, where: str, path: str = "") -> HardwareProfile:
    top = _section(data, "profile", where, _TOP)
    up = _section(top["scale_up"], "scale_up", where, _UP)
    out = top.get("scale_out")
    gpus = whole(top["gpus_per_node"], "gpus_per_node", where, high=1024)
    host = None if top.get("gpus_per_host") is None else whole(top["gpus_per_host"], "gpus_per_host", where, high=gpus)
    if host is not None and gpus % host:
        raise ConfigError(f"{where}: 'gpus_per_host' ({host}) must divide 'gpus_per_node' ({gpus})")
    scale_out = None
    if out is not None:
        out = _section(out, "scale_out", where, _OUT)
        scale_out = ScaleOut(
            nics_per_node=whole(out["nics_per_node"], "scale_out.nics_per_node", where, high=1024),
            nic_bandwidth_Gbps=number(out["nic_bandwidth_Gbps"], "scale_out.nic_bandwidth_Gbps", where,
                                      high=MAX_GBPS, positive=True),
            transport=choice(out["transport"], "scale_out.transport", where, TRANSPORTS),
            latency_us=number(out["latency_us"], "scale_out.latency_us", where, high=1e6),
            sharp=flag(out.get("sharp", False), "scale_out.sharp", where),
            efficiency=None if out.get("efficiency") is None else number(
                out["efficiency"], "scale_out.efficiency", where, high=1.0, positive=True),
            path_efficiency=number(out.get("path_efficiency", 1.0), "scale_out.path_efficiency", where, high=1.0,
                                   positive=True),
            buffsize_bytes=whole(out.get("buffsize_bytes", DEFAULT_BUFFSIZE_BYTES), "scale_out.buffsize_bytes", where,
                                 low=1 << 12, high=1 << 34),
            nvls_chunk_bytes=whole(out.get("nvls_chunk_bytes", DEFAULT_NVLS_CHUNK_BYTES),
                                   "scale_out.nvls_chunk_bytes", where, low=1 << 10, high=1 << 30))
    calibration = top.get("calibration") or {}
    if not isinstance(calibration, dict):
        raise ConfigError(f"{where}: 'calibration' must be a mapping")
    if "parameters" in calibration:
        calibration = {**calibration, "parameters": check_parameters(calibration["parameters"], where)}
    return HardwareProfile(
        name=_text(top["name"], "name", where),
        gpu=_text(top["gpu"], "gpu", where),
        gpus_per_node=gpus,
        library=choice(top["library"], "library", where, LIBRARIES),
        library_version=_text(top["library_version"], "library_version", where),
        arch=choice(top["arch"], "arch", where, ARCHS),
        scale_up=ScaleUp(
            fabric=choice(up["fabric"], "scale_up.fabric", where, FABRICS),
            links_per_gpu=whole(up["links_per_gpu"], "scale_up.links_per_gpu", where, high=1024),
            link_bandwidth_GBps=number(up["link_bandwidth_GBps"], "scale_up.link_bandwidth_GBps", where,
                                       high=MAX_GBPS, positive=True),
            latency_us=number(up["latency_us"], "scale_up.latency_us", where, high=1e6),
            nvls=flag(up.get("nvls", False), "scale_up.nvls", where)),
        scale_out=scale_out,
        msccl=_msccl(top.get("msccl"), where),
        tuner=None if top.get("tuner") is None else choice(top["tuner"], "tuner", where, tuple(sorted(TUNERS))),
        algorithms=_names(top.get("algorithms"), "algorithms", where, ENV_ALGORITHMS),
        protocols=_names(top.get("protocols"), "protocols", where, MSCCL_PROTOCOLS),
        assumptions=texts(top.get("assumptions"), "assumptions", where),
        sources=texts(top.get("sources"), "sources", where),
        calibration=calibration,
        path=path,
        gpus_per_host=host,
        host_cpu=choice(top.get("host_cpu", "x86"), "host_cpu", where, HOST_CPUS))
