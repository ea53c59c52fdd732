"""benchmarks/moe_gap.py's split of a simulated step into the experts' part and the rest, as the breakdown of a
validation run keeps it (simulator/tools/step_breakdown.py): the experts' grouped GEMMs, permutations and
activations are theirs, a dense layer's activation and the attention are not; every committed MoE row has it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from simulator.collectives.hardware import load_profile
from simulator.tools.step_breakdown import expert_node_names
from simulator.tools.step_run import simulate_iteration
from simulator.tools.training_hardware import network_for
from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("moe_gap", REPO / "benchmarks" / "moe_gap.py")
assert _spec is not None and _spec.loader is not None
moe_gap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(moe_gap)

# three layers, the first dense (its own FFN), four experts over two expert-parallel ranks
SPEC = {"generate": "llm", "num_layers": 3, "hidden_size": 256, "num_heads": 8, "ffn_hidden_size": 256,
        "vocab_size": 1000, "seq_len": 64, "num_experts": 4, "top_k": 2, "dense_layers": 1,
        "dense_ffn_hidden_size": 512, "dp": 2, "ep": 2, "global_batch": 4}


def test_the_experts_part_holds_the_expert_nodes_and_is_part_of_the_compute() -> None:
    got: dict = {}
    network = network_for(load_profile("hgx-h100"), 2, "test")
    iteration = simulate_iteration(SPEC, network, "hgx-h100", "H100", warn=lambda _: None,
                                   inspect=lambda s, r, p: got.update(programs=p))
    names = expert_node_names(got["programs"])
    shorts = {n.rsplit(".", 1)[-1] for n in names}
    assert {"expert_in", "expert_out", "expert_in_dgrad", "expert_in_wgrad", "activation"} <= shorts
    dense_activation = [op.name for p in got["programs"] for op in p.ops
                        if ".layer0." in op.name and op.name.endswith(".activation")]
    assert dense_activation and not any(".layer0." in n for n in names)  # the dense layer's is not the experts'
    assert not any(s.startswith(("attention", "router", "qkv")) for s in shorts)
    total, experts = iteration.breakdown["compute_ns_by_class"], iteration.breakdown["expert_compute_ns_by_class"]
    assert experts["matmul"] > 0 and experts["elementwise"] > 0 and "attention" not in experts
    assert all(0 < experts[k] < total[k] for k in experts)  # the dense layer's GEMMs and activation are the rest's


def test_a_dense_steps_breakdown_has_no_experts_part() -> None:
    dense = {k: v for k, v in SPEC.items() if k not in ("num_experts", "top_k", "dense_layers", "dense_ffn_hidden_size",
                                                         "ep")}
    network = network_for(load_profile("hgx-h100"), 2, "test")
    iteration = simulate_iteration(dense, network, "hgx-h100", "H100", warn=lambda _: None)
    assert "expert_compute_ns_by_class" not in iteration.breakdown


def test_a_factor_on_a_part_moves_the_step_by_that_parts_time() -> None:
    rec = {"step_ns": 1000, "published_step_time_s": 1e-6,
           "breakdown": {"compute_busy_ns": 800, "bubble_ns": 200, "exposed_comm_ns_by_kind": {"ep": 50, "dp": 9},
                         "compute_ns_by_class": {"matmul": 400, "elementwise": 40},
                         "expert_compute_ns_by_class": {"matmul": 100, "elementwise": 40}}}
    assert moe_gap.error(rec, {}) == 0
    # the experts' 100 ns of GEMMs amplified by the bubble (1000 / 800); the exposed exchange as it is
    assert moe_gap.error(rec, {"experts_matmul": 2.0}) == pytest.approx(0.125)
    assert moe_gap.error(rec, {"ep_exchange": 3.0}) == pytest.approx(0.1)
    assert moe_gap.fit([rec], "experts_memory") == pytest.approx(1.0, abs=1e-3)


def test_every_committed_moe_row_has_its_experts_part() -> None:
    rows = [r for path in moe_gap.RUNS.values() for r in json.loads(path.read_text())["rows"]
            if r["status"] == "simulated" and moe_gap.moe(r)]
    assert len(rows) > 150
    for r in rows:
        b = r["breakdown"]
        assert set(b["expert_compute_ns_by_class"]) <= set(b["compute_ns_by_class"]), r["row_id"]


def test_a_row_saved_without_the_split_is_a_one_line_error_naming_it(tmp_path: Path, monkeypatch) -> None:
    row = {"row_id": "moe_row", "status": "simulated", "generator": {"num_experts": 8, "ep": 2}, "device": "H100",
           "predicted_step_time_s": 1.0, "published_step_time_s": 1.0, "breakdown": {"compute_ns_by_class": {}}}
    for name in ("shared", "hold-out"):
        (tmp_path / name).write_text(json.dumps({"rows": [row] if name == "shared" else []}))
    monkeypatch.setattr(moe_gap, "RUNS", {name: tmp_path / name for name in ("shared", "hold-out")})
    assert moe_gap.main([]) == ("moe_gap.py: error: 1 MoE rows were saved without their experts' compute (first: "
                                "moe_row); run benchmarks/training_validation.py on them again")


def test_generation_pairs_compare_one_published_run_on_two_gpus() -> None:
    def row(row_id: str, device: str, published: float, predicted: float, experts: int = 1) -> dict:
        return {"row_id": row_id, "device": device, "published_step_time_s": published,
                "predicted_step_time_s": predicted, "generator": {"num_experts": experts}}
    assert moe_gap.same_run("mbridge_26.04_Pre-Training_DGX-GB300_Qwen3_30B_a3B_8_MXFP8_142") == \
        moe_gap.same_run("mbridge_26.04_Pre-Training_DGX-GB200_Qwen3_30B_a3B_8_MXFP8_143")
    rows = [row("mbridge_26.04_Pre-Training_DGX-GB300_M_8_FP8_1", "GB300", 8.0, 6.0, 128),
            row("mbridge_26.04_Pre-Training_DGX-GB200_M_8_FP8_2", "GB200", 10.0, 10.0, 128),
            row("mbridge_26.04_Pre-Training_DGX-GB300_D_8_FP8_3", "GB300", 8.0, 8.0),
            row("mbridge_26.04_Pre-Training_DGX-GB200_D_8_FP8_4", "GB200", 10.0, 10.0),
            row("mbridge_26.04_Pre-Training_DGX-GB200_D_16_FP8_5", "GB200", 5.0, 9.0),  # no GB300 run of it
            row("zoo_m_gb300", "GB300", 1.0, 2.0, 128)]  # another source: not paired
    lines = moe_gap.generation_pairs(rows)
    # MoE: simulated ratio 0.6 against published 0.8, 25% too fast on GB300 relative to GB200; dense exact
    assert [line.split() for line in lines[2:]] == [
        ["GB300", "over", "GB200", "dense", "1", "pairs", "0.0%", "(", "+0.0%)"],
        ["GB300", "over", "GB200", "MoE", "1", "pairs", "25.0%", "(-25.0%)"]]
