"""Whole simulated training steps (kernel compute model, NCCL-like collectives, two nodes): the step never gets
shorter as the model grows or sees more tokens, never longer on a GPU with higher peaks and memory bandwidth or
on links and NICs with more bandwidth, and the throughput it implies never exceeds the device's peak."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compute.devices import DEVICES_DIR
from simulator.collectives.hardware import load_profile
from simulator.tools.step_run import simulate_iteration
from simulator.tools.training_hardware import network_for
from workload.generated import llm_programs
from workload.llm.summary import stage_flops

HW = Path(__file__).resolve().parents[2] / "configs" / "hardware"
SPEC: dict[str, Any] = {"generate": "llm", "model_name": "prop", "num_layers": 2, "hidden_size": 256, "num_heads": 8,
                        "num_kv_heads": 4, "ffn_hidden_size": 768, "vocab_size": 4000, "seq_len": 256,
                        "gated_ffn": True, "tp": 2, "pp": 1, "dp": 2, "global_batch": 4, "micro_batch_size": 1,
                        "sequence_parallel": True}
SLOW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def profile_file(folder: Path, bandwidth: float) -> str:
    """dgx-a100 as nodes of two GPUs, scale-up links and NICs ``bandwidth`` times as fast."""
    data = yaml.safe_load((HW / "dgx-a100.yml").read_text())
    data["gpus_per_node"] = 2
    data["scale_up"]["link_bandwidth_GBps"] *= bandwidth
    data["scale_out"]["nic_bandwidth_Gbps"] *= bandwidth
    path = folder / f"a100x{bandwidth:.6g}.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def device_file(folder: Path, peak: float, memory: float) -> str:
    data = yaml.safe_load((DEVICES_DIR / "a100.yml").read_text())
    data["peak_tflops"] = {k: v * peak for k, v in data["peak_tflops"].items()}
    data["memory_bw_GBps"] *= memory
    path = folder / f"a100p{peak:.6g}m{memory:.6g}.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def step_ns(spec: dict[str, Any], folder: Path, bandwidth: float = 1.0, peak: float = 1.0,
            memory: float = 1.0) -> int:
    profile = profile_file(folder, bandwidth)
    network = network_for(load_profile(profile), spec["tp"] * spec["dp"], "prop")
    return simulate_iteration(spec, network, profile, device_file(folder, peak, memory)).step_time_ns


@SLOW
@given(st.sampled_from(["num_layers", "hidden_size", "ffn_hidden_size", "seq_len", "global_batch"]),
       st.integers(1, 2))
def test_step_never_shrinks_as_the_model_or_the_tokens_grow(tmp_path: Path, what: str, factor: int) -> None:
    grown = dict(SPEC, **{what: SPEC[what] * (1 + factor)})
    assert step_ns(grown, tmp_path) >= step_ns(SPEC, tmp_path) > 0


@SLOW
@given(st.floats(1.0, 4.0), st.floats(1.0, 4.0), st.floats(1.0, 4.0))
def test_step_never_grows_on_faster_gpus_or_links(tmp_path: Path, peak: float, memory: float,
                                                  bandwidth: float) -> None:
    base = step_ns(SPEC, tmp_path)
    assert step_ns(SPEC, tmp_path, peak=peak, memory=memory) <= base
    assert step_ns(SPEC, tmp_path, bandwidth=bandwidth) <= base


def test_implied_throughput_stays_under_the_peak(tmp_path: Path) -> None:
    """FLOPs of the whole step over (step x GPUs) is below the A100's BF16 peak, by a margin the kernels lose."""
    _, plan, programs = llm_programs(SPEC, "prop")
    flops = sum(sum(stage_flops(p).values()) for p in programs) * (plan.world_size // plan.pp)
    per_gpu = flops / (step_ns(SPEC, tmp_path) * 1e-9 * plan.world_size)
    assert 0 < per_gpu < 0.9 * 312e12
