"""Device presets for the roofline model: peak dense FLOP/s and HBM bandwidth of common accelerators.

Figures are the vendors' published peak numbers for dense (non-sparse) BF16/FP16 tensor math and the
memory bandwidth of the named memory configuration:
- A100 SXM4 80GB: 312 TFLOP/s BF16 dense, 2,039 GB/s HBM2e (NVIDIA A100 datasheet, 2021).
- H100 SXM5: 989.4 TFLOP/s BF16 dense, 3,350 GB/s HBM3 (NVIDIA H100 datasheet, 2023).
- H200 SXM: 989.4 TFLOP/s BF16 dense, 4,800 GB/s HBM3e (NVIDIA H200 datasheet, 2024).
- B200 (HGX B200): 2,250 TFLOP/s BF16 dense, 8,000 GB/s HBM3e (NVIDIA Blackwell datasheet, 2024).
- MI300X: 1,307.4 TFLOP/s BF16 dense, 5,300 GB/s HBM3 (AMD Instinct MI300X datasheet, 2023).
- TPU v4: 275 TFLOP/s BF16, 1,200 GB/s HBM2 (Google Cloud TPU v4 documentation).
- TPU v5p: 459 TFLOP/s BF16, 2,765 GB/s HBM2e (Google Cloud TPU v5p documentation).
"""

from __future__ import annotations

from dataclasses import dataclass

from workload.errors import InputError


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    peak_tflops: float  # dense BF16/FP16, TFLOP/s (1e12)
    memory_bw_gbps: float  # GB/s (1e9 bytes), as ASTRA-sim's local-mem-bw
    source: str


DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("A100", 312.0, 2039.0, "NVIDIA A100 SXM4 80GB datasheet"),
    Device("H100", 989.4, 3350.0, "NVIDIA H100 SXM5 datasheet"),
    Device("H200", 989.4, 4800.0, "NVIDIA H200 SXM datasheet"),
    Device("B200", 2250.0, 8000.0, "NVIDIA HGX B200 datasheet"),
    Device("MI300X", 1307.4, 5300.0, "AMD Instinct MI300X datasheet"),
    Device("TPUv4", 275.0, 1200.0, "Google Cloud TPU v4 documentation"),
    Device("TPUv5p", 459.0, 2765.0, "Google Cloud TPU v5p documentation"),
)}


def device(name: str) -> Device:
    """The preset named ``name`` (case and punctuation insensitive: "h100", "TPU v5p", "tpu-v4")."""
    key = "".join(ch for ch in name.lower() if ch.isalnum())
    for preset in DEVICES.values():
        if preset.name.lower() == key:
            return preset
    raise InputError(f"unknown device {name!r}; valid: {', '.join(DEVICES)}")
