"""``trace generate llm --summary --device``: the predicted step, its throughput next to 6PT, the breakdown."""

from __future__ import annotations

import re

import pytest

from compute.devices import device
from simulator.tools.step_summary import format_prediction, predict
from tests.conftest import run_cli
from workload.generated import llm_programs
from workload.llm.plan import RankMap
from workload.llm.summary import summarize

SMALL = ["--layers", "2", "--hidden", "256", "--heads", "8", "--ffn-hidden", "512", "--vocab", "1000", "--seq-len",
         "64", "--tp", "2", "--pp", "2", "--dp", "2", "--global-batch", "8"]
SPEC = {"generate": "llm", "num_layers": 2, "hidden_size": 256, "num_heads": 8, "ffn_hidden_size": 512,
        "vocab_size": 1000, "seq_len": 64, "tp": 2, "pp": 2, "dp": 2, "global_batch": 8}


def test_summary_with_a_device_predicts_the_step() -> None:
    out = run_cli("trace", "generate", "llm", *SMALL, "--device", "H100", "--summary")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "x 6PT" in text  # the summary as before, then the prediction
    found = re.search(r"predicted step \(one simulated iteration\) on 8 x H100, hardware profile hgx-h100 .*: "
                      r"([0-9.]+) ms", text)
    assert found and float(found.group(1)) > 0
    for expected in ("6PT estimate:", "counting 6PT (MFU", "HFU", "tokens/s per GPU", "slowest rank",
                     "exposed communication", "tp ", "pipeline bubble and pipeline send/receive waits",
                     "of 8 rank(s) simulated", "device memory per rank (estimate):", "on stage 0",
                     "device memory per rank by stage:", "fits in the H100's 80 GiB"):
        assert expected in text


def test_a_layout_over_the_devices_memory_is_warned_about() -> None:
    # two Llama 3 70B layers with 64 sequences of 8,192 tokens in one micro-batch: the activations alone are
    # beyond 80 GiB
    out = run_cli("trace", "generate", "llm", "--preset", "llama3-70b", "--tp", "8", "--npus", "8", "--layers", "2",
                  "--global-batch", "64", "--micro-batch-size", "64", "--device", "H100", "--summary")
    assert out.returncode == 0, out.stderr
    assert "fits in" not in out.stdout
    warned = [line for line in out.stderr.splitlines() if "by the memory estimate" in line]
    assert len(warned) == 1 and "more than the H100's 80 GiB" in warned[0] and "--micro-batch-size" in warned[0]


def test_summary_without_a_device_says_how_to_get_a_prediction() -> None:
    out = run_cli("trace", "generate", "llm", *SMALL, "--summary")
    assert out.returncode == 0 and "predicted step: give --device NAME" in out.stdout


def test_summary_with_a_profile_predicts_on_its_gpu() -> None:
    """--hw-profile alone: the device is the GPU the profile names, as --device would give it."""
    out = run_cli("trace", "generate", "llm", *SMALL, "--hw-profile", "dgx-b200", "--summary")
    assert out.returncode == 0, out.stderr
    assert "predicted step (one simulated iteration) on 8 x B200, hardware profile dgx-b200 (--hw-profile)" in \
        out.stdout
    both = run_cli("trace", "generate", "llm", *SMALL, "--hw-profile", "dgx-b200", "--device", "B200", "--summary")
    assert both.stdout == out.stdout  # the same prediction as naming the device


def test_unknown_profile_is_a_one_line_error() -> None:
    out = run_cli("trace", "generate", "llm", *SMALL, "--device", "H100", "--summary", "--hw-profile", "nope")
    assert out.returncode == 1 and "unknown hardware profile" in out.stderr and "hgx-h100" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_prediction_figures_agree_with_each_other() -> None:
    iteration, profile, why = predict(SPEC, 8, "A100", None)
    assert profile == "dgx-a100" and "reference system" in why
    b = iteration.breakdown
    # kernels of a rank run one at a time: their summed time is the time some kernel runs
    assert sum(b["compute_ns_by_class"].values()) == b["compute_busy_ns"]
    assert b["compute_busy_ns"] + b["exposed_collectives_ns"] + b["bubble_ns"] == b["step_ns"] == \
        iteration.step_time_ns
    assert b["bubble_ns"] > 0 and b["exposed_comm_ns_by_kind"]["tp"] > 0
    model, plan, programs = llm_programs(SPEC, "test")
    summary = summarize(model, plan, programs, RankMap(plan, model))
    assert iteration.flops_total == summary["flops"]["total"]
    text = format_prediction(iteration, summary, "A100", profile, why)
    mfu = float(re.search(r"MFU ([0-9.]+)%", text).group(1)) / 100  # type: ignore[union-attr]
    expected = summary["flops_6pt"] / (iteration.step_time_ns / 1e9 * 8 * device("A100").peak_tflops * 1e12)
    assert mfu == pytest.approx(expected, abs=6e-4)


def test_gb200_predicts_on_its_nvl72_rack_and_no_slower_than_b200() -> None:
    """Same B200 kernel curves and NVLink 5, higher datasheet peaks: the GB200 step is not longer than the B200's."""
    gb200, profile, why = predict(SPEC, 8, "GB200", None)
    b200, _, _ = predict(SPEC, 8, "B200", None)
    assert profile == "gb200-nvl72" and "GB200 reference system" in why
    assert 0 < gb200.step_time_ns <= b200.step_time_ns


def test_an_iteration_keeps_the_simulators_warnings_where_nobody_prints_them() -> None:
    # validate-training simulates each row in a child process without a ``warn``: what the simulator says about the
    # run (here: a device no kernel measurements calibrate) comes back with the result, for the row's notes
    from simulator.collectives.hardware import load_profile
    from simulator.tools.step_run import simulate_iteration
    from simulator.tools.training_hardware import network_for

    network = network_for(load_profile("dgx-a100"), 8, "test")
    iteration = simulate_iteration(SPEC, network, "dgx-a100", "TPUv4")
    assert any("no kernel measurements calibrate" in w for w in iteration.warnings)
    printed: list[str] = []
    assert not simulate_iteration(SPEC, network, "dgx-a100", "TPUv4", warn=printed.append).warnings and printed


def test_ring_steps_count_as_their_groups_communication_not_as_the_pipeline_bubble() -> None:
    # one pipeline stage: nothing of the step is a pipeline bubble; the context-parallel K/V ring and the
    # tensor-parallel overlap ring are sends and receives of the cp and tp groups
    spec = {**SPEC, "pp": 1, "dp": 1, "cp": 2, "seq_len": 256, "global_batch": 2, "sequence_parallel": True,
            "tp_comm_overlap": True}
    b = predict(spec, 4, "H100", None)[0].breakdown
    assert b["exposed_comm_ns_by_kind"]["cp"] > 0 and "tp" in b["exposed_comm_ns_by_kind"]
    assert "pp" not in b["exposed_comm_ns_by_kind"]
    assert b["compute_busy_ns"] + b["exposed_collectives_ns"] + b["exposed_host_ns"] + b["bubble_ns"] == b["step_ns"]
    assert b["bubble_ns"] == 0
