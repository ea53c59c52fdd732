"""The roofline model and device presets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compute.devices import DEVICES, device
from compute.roofline import Roofline
from workload.errors import InputError


def test_memory_and_compute_bound_kernels() -> None:
    r = Roofline(peak_flops=900e12, memory_bytes_per_s=1600e9)
    assert r.time_ns(10**9, 10**6) == 1111  # compute bound
    assert r.time_ns(10**8, 10**8) == 62500  # memory bound
    assert r.time_ns(0, 5) == 0 and r.time_ns(5, 0) == 0


@given(ops=st.integers(1, 10**15), size=st.integers(1, 10**12))
def test_never_faster_than_either_roof(ops: int, size: int) -> None:
    r = Roofline(peak_flops=100e12, memory_bytes_per_s=1e12)
    t = r.time_ns(ops, size)
    assert t + 1 >= ops / 100e12 * 1e9 and t + 1 >= size / 1e12 * 1e9 * 0.999999


def test_device_presets() -> None:
    assert device("h100").peak_tflops == DEVICES["H100"].peak_tflops
    assert device("TPU v5p").name == "TPUv5p"
    for d in DEVICES.values():
        assert d.peak_tflops > 0 and d.memory_bw_GBps > 0 and d.source
    with pytest.raises(InputError, match="unknown device 'H900'; valid: A100"):
        device("H900")
