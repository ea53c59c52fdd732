"""The predicted step of ``trace generate llm --summary --device NAME``: one simulated iteration (NCCL-like
collectives on a hardware profile, the best compute model available), its throughput next to the 6PT estimate,
and where the slowest rank's time went.

Without ``--hw-profile`` the profile is the reference system of the device (H100 -> hgx-h100, ...), said so in
the output. MFU counts 6 x active parameters x tokens (the usual model-FLOPs convention); the trace's own FLOP
count (recompute, attention scores, elementwise and optimizer work included) gives the hardware-FLOPs figure.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from compute.devices import device as device_preset
from simulator.collectives.hardware import load_profile
from simulator.tools.step_breakdown import PP
from simulator.tools.step_run import Iteration, simulate_iteration
from simulator.tools.training_hardware import gpu_model, network_for
from workload.errors import InputError

# the hardware profile a device's summary uses unless --hw-profile names one (the vendor's reference system)
DEVICE_PROFILES = {"A100": "dgx-a100", "H100": "hgx-h100", "H200": "hgx-h200", "B200": "dgx-b200",
                   "GB200": "gb200-nvl72", "GB300": "gb300-nvl72", "MI300X": "mi300x"}


def _s(ns: float) -> str:
    return f"{ns / 1e9:.3f} s" if ns >= 1e8 else f"{ns / 1e6:.2f} ms"


def profile_device(hw_profile: str) -> str | None:
    """The compute device of the GPU hardware profile ``hw_profile`` names (None: no device model for that GPU; an
    unknown profile is an error)."""
    gpu = load_profile(hw_profile).gpu
    try:
        return device_preset(gpu_model(gpu)).name
    except InputError:
        return None


def predict(spec: dict[str, Any], npus: int, device_name: str, hw_profile: str | None,
            warn: Callable[[str], None] | None = None) -> tuple[Iteration, str, str]:
    """(the simulated iteration, the profile name, why that profile) for a ``generate: llm`` mapping."""
    device = device_preset(device_name)
    why = "--hw-profile"
    if hw_profile is None:
        hw_profile = DEVICE_PROFILES.get(device.name)
        if hw_profile is None:
            raise InputError(f"no reference hardware profile for device {device.name}: give one with --hw-profile")
        why = f"the {device.name} reference system; choose with --hw-profile"
    profile = load_profile(hw_profile)
    network = network_for(profile, npus, "trace generate llm --summary")
    print(f"simulating one iteration of {npus:,} ranks for the predicted step", file=sys.stderr)
    it = simulate_iteration(spec, network, hw_profile, device.name, warn, "trace generate llm", progress=True)
    return it, profile.name, why


def format_prediction(it: Iteration, summary: dict[str, Any], device_name: str, profile: str, why: str) -> str:
    """The prediction lines of the summary."""
    device = device_preset(device_name)
    npus = summary["plan"]["world_size"]
    step_s = it.step_time_ns / 1e9
    peak = device.peak_tflops * 1e12
    six_pt = summary["flops_6pt"]
    model_tflops = six_pt / (step_s * npus) / 1e12
    trace_tflops = summary["flops"]["total"] / (step_s * npus) / 1e12
    b = it.breakdown
    classes = ", ".join(f"{k} {_s(v)}" for k, v in b["compute_ns_by_class"].items())
    comm = ", ".join(f"{k} {_s(v)}" for k, v in b["exposed_comm_ns_by_kind"].items() if k != PP)
    return "\n".join([
        f"predicted step (one simulated iteration) on {npus} x {device.name}, hardware profile {profile} ({why}), "
        f"NCCL-like collectives, {it.compute_model} compute: {_s(it.step_time_ns)}",
        f"  6PT estimate: {six_pt / 1e15:.3f} PFLOP = {six_pt / (peak * npus):.3f} s at {device.peak_tflops:g} TFLOP/s "
        f"per GPU (100% MFU)",
        f"  throughput: {model_tflops:.1f} TFLOP/s per GPU counting 6PT (MFU {model_tflops * 1e12 / peak:.1%}); "
        f"{trace_tflops:.1f} TFLOP/s per GPU counting every FLOP of the trace (HFU {trace_tflops * 1e12 / peak:.1%}); "
        f"{summary['tokens'] / (step_s * npus):,.0f} tokens/s per GPU",
        f"  slowest rank {b['rank']}: compute {_s(b['compute_busy_ns'])} ({classes}); exposed communication "
        f"{_s(b['exposed_collectives_ns'])}" + (f" (by group: {comm})" if comm else "")
        + f"; pipeline bubble and pipeline send/receive waits {_s(b['bubble_ns'])}",
        f"  engine: {it.simulated_ranks} of {npus} rank(s) simulated ({it.engine_reason})",
    ])
