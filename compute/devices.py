"""Accelerator device files (``configs/devices/<name>.yml``): peak FLOP/s per precision, HBM bandwidth, compute
units, and the kernel compute model's fitted curve parameters with their provenance.

One file per device is the single home of its figures: the roofline model (``--device``, ASTRA-sim's
``peak-perf``/``local-mem-bw`` replaced) reads its dense BF16 peak and its bandwidth, ``--compute-model kernels``
everything. A device is named case- and punctuation-insensitively ("h100", "TPU v5p") or given as a file
(``--device my_gpu.yml``). Values are checked on loading: a bad one is a ConfigError naming file and key.

    name: H100
    description: NVIDIA H100 SXM5 80GB
    aliases: [H100-SXM5-80GB]
    peak_tflops: {fp32: 66.9, tf32: 494.7, bf16: 989.4, fp16: 989.4, fp8: 1978.9}   # dense, 10^12 FLOP/s
    memory_bw_GBps: 3350                  # HBM, 10^9 B/s
    memory_GiB: 80                        # HBM capacity (the datasheets' HBM "GB" are 2^30 B; optional)
    compute_units: 132                    # SMs (NVIDIA) or CUs (AMD)
    block_scaled: []                      # block-scaled formats its tensor cores run ([mxfp8, mxfp4, nvfp4] on
                                          # Blackwell); optional, none by default
    kernels: {...}                        # compute/kernel_params.py
    calibration: {...}                    # data sets, fitted values, residuals (benchmarks/fit_kernel_model.py)
    training_calibration: {...}           # kernels.efficiency_scale fitted on training steps, where any
                                          # (benchmarks/training_calibration.py)
    sources: ["..."]
    assumptions: ["..."]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from compute.kernel_params import SCALES, KernelParams, parse_kernel_params
from compute.shapes import MATH_DTYPES, math_precision
from network.values import MAX_RATE, key_names, number, texts, whole
from workload.errors import ConfigError, InputError, shown
from workload.files import read_yaml, shown_path

DEVICES_DIR = Path(__file__).resolve().parents[1] / "configs" / "devices"
_TOP = {"name", "description", "aliases", "peak_tflops", "memory_bw_GBps", "memory_GiB", "compute_units",
        "block_scaled", "kernels", "calibration", "training_calibration", "sources", "assumptions"}
_REQUIRED = ("name", "peak_tflops", "memory_bw_GBps", "compute_units", "kernels")
ROOFLINE_DTYPE = "bf16"  # the roofline model's peak: dense BF16/FP16 tensor math
# Keys device files of earlier versions used -> their current names (as simulator/units.py LEGACY_KEYS for results):
# "gbps" reads as gigabits; the figure is GB/s with GB = 10^9 B.
RENAMED_KEYS = {"memory_bw_gbps": "memory_bw_GBps"}
BLOCK_SCALED = ("mxfp8", "mxfp4", "nvfp4")  # OCP microscaling formats and NVIDIA's FP4 with FP8 block scales


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator: its peaks, its memory, and the kernel model's parameters for it."""

    name: str
    peaks_tflops: dict[str, float]  # dense, by precision (shapes.py MATH_DTYPES); a precision absent: unsupported
    memory_bw_GBps: float  # GB/s (1e9 bytes), as ASTRA-sim's local-mem-bw
    compute_units: int
    kernels: KernelParams
    block_scaled: tuple[str, ...] = ()  # block-scaled formats (BLOCK_SCALED) the hardware runs; none: not one
    description: str = ""
    aliases: tuple[str, ...] = ()
    calibration: dict[str, Any] = field(default_factory=dict)
    training_calibration: dict[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    path: str = ""
    memory_GiB: float = 0.0  # HBM capacity; 0: unknown

    @property
    def memory_bytes(self) -> int:
        """The capacity the memory estimate (workload/llm/memory.py) is held against; 0: unknown."""
        return int(self.memory_GiB * 2**30)

    def memory_shortfall(self, need_bytes: int) -> str:
        """How ``need_bytes`` per GPU (the memory estimate's) exceeds this device's memory, as a phrase ("needs 95.5
        GiB per GPU by the memory estimate, more than the H100's 80 GiB"); "" when it fits or the size is unknown."""
        if not self.memory_bytes or need_bytes <= self.memory_bytes:
            return ""
        return (f"needs {need_bytes / 2**30:.1f} GiB per GPU by the memory estimate, more than the {self.name}'s "
                f"{self.memory_GiB:g} GiB")

    @property
    def peak_tflops(self) -> float:
        """Dense BF16 (else FP16) TFLOP/s: the roofline model's peak-perf."""
        return self.peaks_tflops.get(ROOFLINE_DTYPE) or self.peaks_tflops["fp16"]

    @property
    def source(self) -> str:
        return self.description or (self.sources[0] if self.sources else self.name)

    def peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s of math in ``dtype``; a precision the device lacks runs at its BF16 rate (FP8 on an A100
        runs as BF16 there), FP32 without tensor cores at its FP32 rate; a block-scaled format at its element
        precision's rate."""
        tflops = self.peaks_tflops.get(math_precision(dtype)) or self.peak_tflops
        return tflops * 1e12

    def has(self, dtype: str) -> bool:
        """Whether the hardware runs ``dtype`` math (a block-scaled format: listed in ``block_scaled`` too)."""
        return math_precision(dtype) in self.peaks_tflops and (dtype in self.peaks_tflops or dtype in self.block_scaled)

    def math_dtype(self, dtype: str) -> str:
        """The precision ``dtype`` math runs in here: itself, else (a block-scaled format the device lacks) its
        element precision, else BF16 (else FP16)."""
        for candidate in (dtype, math_precision(dtype)):
            if self.has(candidate):
                return candidate
        return "bf16" if "bf16" in self.peaks_tflops else "fp16"

    def with_knobs(self, launch_overhead_us: float | None = None,
                   efficiency_scale: Mapping[str, float] | None = None) -> Device:
        """This device with the kernel model's device-level knobs set (a calibration against whole training steps
        sets them): a gap added to every kernel, and factors on the fitted efficiencies of gemm, attention and
        memory-bound kernels (families not named keep theirs)."""
        k = self.kernels
        scale = dict(k.efficiency_scale)
        for family, factor in (efficiency_scale or {}).items():
            if family not in SCALES or not 0 < factor <= 100:
                raise InputError(f"efficiency scale {family}={factor!r}: families {', '.join(SCALES)}, factors in "
                                 "(0, 100]")
            scale[family] = float(factor)
        if launch_overhead_us is not None and not 0 <= launch_overhead_us <= 1e6:
            raise InputError(f"launch overhead {launch_overhead_us!r} us must be from 0 to 1e6")
        knobs = replace(k, efficiency_scale=tuple(scale.items()),
                        launch_overhead_us=k.launch_overhead_us if launch_overhead_us is None else launch_overhead_us)
        return replace(self, kernels=knobs)

    def kernel_fit(self) -> Device:
        """This device as its kernel data fit it: the device-level knobs a training-step calibration sets
        (``training_calibration``) neutral, for comparing with kernel measurements."""
        return replace(self, kernels=replace(self.kernels, efficiency_scale=(), launch_overhead_us=0.0))

    @property
    def calibrated(self) -> str:
        """How the kernel parameters were obtained: fitted (on this device's data), derived (from another
        device's fit and this one's measured peaks), or assumed."""
        return str(self.calibration.get("status", "assumed"))


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def same_gpu(device: Device, gpu: str) -> bool:
    """Whether the GPU a hardware profile names (``gpu``: "H100-SXM5-80GB", "A100-SXM4-40GB") is ``device``: one
    of its names or aliases, or a variant of its name (another memory size of the same chip)."""
    key = _key(gpu)
    names = [_key(n) for n in (device.name, *device.aliases)]
    return key in names or key.startswith(_key(device.name))


def device_names() -> list[str]:
    return [d.name for d in _shipped()]


# Listing order: NVIDIA by generation, AMD, Google (files not listed here follow, by name).
ORDER = ("A100", "H100", "H200", "H200NVL", "B200", "B300", "GB200", "GB300", "MI300X", "MI325X", "MI355X", "TPUv4",
         "TPUv5p")


@cache
def _shipped() -> tuple[Device, ...]:
    found = [load_device_file(str(p)) for p in sorted(DEVICES_DIR.glob("*.yml"))]
    return tuple(sorted(found, key=lambda d: (ORDER.index(d.name) if d.name in ORDER else len(ORDER), d.name)))


class _Shipped(Mapping[str, Device]):
    """The shipped devices by name, read from their files on first use (not at import)."""

    def __getitem__(self, key: str) -> Device:
        for d in _shipped():
            if d.name == key:
                return d
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(device_names())

    def __len__(self) -> int:
        return len(_shipped())


DEVICES: Mapping[str, Device] = _Shipped()


def device(name: str) -> Device:
    """The shipped device named ``name`` (case and punctuation insensitive: "h100", "TPU v5p", "mi300x"; aliases
    too), or the device file ``name`` (``*.yml``/``*.yaml``)."""
    if not isinstance(name, str) or not name:
        raise InputError(f"a device must be a name or a device file (.yml), not {shown(name)}")
    if name.endswith((".yml", ".yaml")):
        return load_device_file(name)
    key = _key(name)
    own = DEVICES_DIR / f"{key}.yml"  # the usual case: a shipped name, read without reading the others
    if own.is_file():
        d = load_device_file(str(own))
        if _key(d.name) == key:
            return d
    for d in _shipped():
        if _key(d.name) == key or key in (_key(a) for a in d.aliases):
            return d
    raise InputError(f"unknown device {name!r}; valid: {', '.join(device_names())} or a device file (.yml)")


@cache
def load_device_file(path: str) -> Device:
    """The device described by the YAML file ``path``."""
    if not Path(path).is_file():
        raise InputError(f"{shown_path(path)}: no such device file; shipped devices: {', '.join(device_names())}")
    return parse_device(read_yaml(path, "device file"), shown_path(path), path)


def parse_device(data: Any, where: str, path: str = "") -> Device:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a device file must be a mapping of {', '.join(_REQUIRED)}, ...")
    data = _current_keys(data, where)
    unknown = set(data) - _TOP
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {key_names(unknown)}; valid: {', '.join(sorted(_TOP))}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ConfigError(f"{where}: the device file misses {', '.join(missing)}")
    name = data["name"]
    if not isinstance(name, str) or not _key(name) or len(name) > 64:
        raise ConfigError(f"{where}: 'name' must be a short name with letters or digits (got {shown(name)})")
    peaks = data["peak_tflops"]
    if not isinstance(peaks, dict) or not peaks:
        raise ConfigError(f"{where}: 'peak_tflops' must map precisions ({', '.join(MATH_DTYPES)}) to TFLOP/s")
    bad = set(peaks) - set(MATH_DTYPES)
    if bad:
        raise ConfigError(f"{where}: unknown precision(s) in 'peak_tflops': {key_names(bad)}; valid: "
                          f"{', '.join(MATH_DTYPES)}")
    checked = {k: number(v, f"peak_tflops.{k}", where, high=MAX_RATE, positive=True) for k, v in peaks.items()}
    if "bf16" not in checked and "fp16" not in checked:
        raise ConfigError(f"{where}: 'peak_tflops' needs bf16 or fp16 (the roofline model's peak)")
    return Device(
        name=name, peaks_tflops=checked,
        memory_bw_GBps=number(data["memory_bw_GBps"], "memory_bw_GBps", where, high=MAX_RATE, positive=True),
        compute_units=whole(data["compute_units"], "compute_units", where, high=1 << 20),
        memory_GiB=number(data["memory_GiB"], "memory_GiB", where, high=1e6, positive=True) if "memory_GiB" in data
        else 0.0,
        block_scaled=_formats(data.get("block_scaled"), where),
        kernels=parse_kernel_params(data["kernels"], where),
        description=_text(data.get("description", ""), "description", where),
        aliases=texts(data.get("aliases"), "aliases", where),
        calibration=_mapping(data.get("calibration"), "calibration", where),
        training_calibration=_mapping(data.get("training_calibration"), "training_calibration", where),
        sources=texts(data.get("sources"), "sources", where),
        assumptions=texts(data.get("assumptions"), "assumptions", where),
        path=path)


def _current_keys(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The device mapping with an earlier version's key names read as the current ones (a file holding both is
    refused: which one it means is not ours to guess)."""
    for old, new in RENAMED_KEYS.items():
        if old in data:
            if new in data:
                raise ConfigError(f"{where}: both '{old}' (its earlier name) and '{new}'; keep '{new}'")
            data = {(new if k == old else k): v for k, v in data.items()}
    return data


def _formats(value: Any, where: str) -> tuple[str, ...]:
    formats = texts(value, "block_scaled", where)
    bad = set(formats) - set(BLOCK_SCALED)
    if bad:
        raise ConfigError(f"{where}: unknown format(s) in 'block_scaled': {key_names(bad)}; valid: "
                          f"{', '.join(BLOCK_SCALED)}")
    return formats


def _text(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or len(value) > 200:
        raise ConfigError(f"{where}: '{key}' must be a short text (got {shown(value)})")
    return value


def _mapping(value: Any, key: str, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: '{key}' must be a mapping (got {shown(value)})")
    return value
