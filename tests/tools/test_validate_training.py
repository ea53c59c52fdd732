"""validate-training end to end on a small table, and its pieces: table reading, defaults, profile matching, the
sources' FLOP formulas, the generator-option table."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from simulator.collectives.hardware import load_profile
from simulator.tools import training_features
from simulator.tools.training_hardware import choose_hardware, network_for, stated_machine
from simulator.tools.training_layout import NEEDS, READY, UNSUPPORTED, plan_row
from simulator.tools.training_metrics import FLOP_FORMULAS, megatron_core_flops, sc21_flops
from simulator.tools.training_table import COLUMNS, TrainingRow, leading_number, read_tables
from tests.conftest import REPO, SHARED, run_cli
from workload.errors import InputError

A100 = {"gpu": "A100-SXM4-80GB", "gpus_per_node": "8", "intra_node": "NVLink3 + NVSwitch (DGX A100)",
        "inter_node": "8x Mellanox HDR 200 Gb/s IB HCAs per node"}
TINY = {"layers": "2", "hidden": "256", "heads": "8", "seq_len": "128", "vocab": "1024"}
ROWS: list[dict[str, str]] = [
    # every dimension given: simulated as stated
    {"source_id": "korthikanti22_t5", "row_id": "tiny_tp2", "model": "GPT tiny", **TINY, "ffn_hidden": "1024",
     "TP": "2", "PP": "1", "DP": "4", "recompute": "full", "global_batch": "8", "micro_batch": "1", "n_gpus": "8",
     **A100, "step_time_s": "0.01"},
    # blanks (FFN, vocabulary, DP, micro-batch, recompute) take the framework's defaults; a tokens/s metric
    {"source_id": "megatron_sc21_t1", "row_id": "tiny_defaults", "model": "GPT tiny", "layers": "2",
     "hidden": "256", "heads": "8", "seq_len": "128", "TP": "1", "PP": "2", "global_batch": "16", "n_gpus": "8",
     **A100, "tokens_per_s_per_gpu": "50000"},
    # a hybrid Mamba-2 / attention / MoE model, from its card (one micro-batch per rank: a quick run)
    {"source_id": "megatron_bridge_perf", "row_id": "mamba", "model": "Nemotron_3_Nano", "seq_len": "8192",
     "TP": "1", "PP": "1", "EP": "8", "global_batch": "32", "micro_batch": "4", "n_gpus": "8", "gpu": "B200",
     "gpus_per_node": "8", "tokens_per_s_per_gpu": "30000"},
    # a machine without a shipped profile
    {"source_id": "megatron_bridge_perf", "row_id": "gaudi2", "model": "LLAMA3_8B", "seq_len": "8192", "TP": "1",
     "PP": "1", "global_batch": "128", "micro_batch": "2", "n_gpus": "8", "gpu": "Gaudi2", "precision": "BF16",
     "tokens_per_s_per_gpu": "30000"},
]


def write_table(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, delimiter="\t")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})
    return path


def row(fields: dict[str, str], line: int = 2) -> TrainingRow:
    return TrainingRow("t.tsv", line, {c: fields.get(c, "") for c in COLUMNS})


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("vt")
    table = write_table(tmp / "small.tsv", ROWS)
    out = run_cli("validate-training", "--tables", str(table), "--json", str(tmp / "r.json"), "--quiet")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp / "r.json").read_text())
    doc["stdout"] = out.stdout
    return doc


def test_cli_simulates_the_rows_it_can_and_says_why_not_for_the_others(report: dict[str, Any]) -> None:
    by_id = {r["row_id"]: r for r in report["rows"]}
    assert [r["row_id"] for r in report["rows"]] == [r["row_id"] for r in ROWS]
    tp2 = by_id["tiny_tp2"]
    assert tp2["status"] == "simulated" and tp2["hw_profile"] == "dgx-a100" and tp2["device"] == "A100"
    assert tp2["predicted_step_time_s"] > 0 and tp2["metric"] == "step_time_s"
    assert tp2["error"] == pytest.approx(tp2["predicted_step_time_s"] / 0.01 - 1, abs=1e-5)
    gen = tp2["generator"]
    assert gen["tp"] == 2 and (gen.get("recompute") == "full" or gen.get("activation_recompute") is True)
    b = tp2["breakdown"]
    assert b["compute_busy_ns"] + b["exposed_collectives_ns"] + b["exposed_host_ns"] + b["bubble_ns"] == b["step_ns"]
    assert set(b["compute_ns_by_class"]) == {"matmul", "attention", "elementwise", "optimizer"}
    assert b["exposed_comm_ns_by_kind"]["tp"] > 0
    hybrid = by_id["mamba"]
    assert hybrid["status"] == "simulated" and hybrid["generator"]["layer_pattern"].count("M") == 23
    assert hybrid["breakdown"]["compute_ns_by_class"]["scan"] > 0
    assert by_id["gaudi2"]["status"] == UNSUPPORTED and "no shipped hardware profile for GAUDI2" in \
        by_id["gaudi2"]["reason"]
    assert "unsupported: no shipped hardware profile" in report["stdout"]


def test_blank_fields_take_documented_defaults_and_are_listed(report: dict[str, Any]) -> None:
    r = next(r for r in report["rows"] if r["row_id"] == "tiny_defaults")
    assert r["status"] == "simulated", r["reason"]
    defaults = "\n".join(r["defaults_used"])
    for expected in ("ffn_hidden_size = 4 x hidden = 1024", "vocab_size = 50304", "DP = GPUs / (TP x PP x CP) = 4",
                     "micro-batch size 1", "recompute none", "num_kv_heads = num_heads"):
        assert expected in defaults
    assert r["generator"]["ffn_hidden_size"] == 1024 and r["generator"]["dp"] == 4
    # tokens/s per GPU: the row's metric, and the step time it implies
    assert r["metric"] == "tokens_per_s_per_gpu"
    assert r["published_step_time_s"] == pytest.approx(16 * 128 / (50000 * 8), rel=1e-6)
    assert r["predicted"] == pytest.approx(16 * 128 / (r["predicted_step_time_s"] * 8), rel=1e-4)
    assert r["breakdown"]["bubble_ns"] > 0  # two pipeline stages


def test_json_schema(report: dict[str, Any]) -> None:
    required = {"row_id": str, "table": str, "status": str, "reason": str, "defaults_used": list, "needs": list,
                "n_gpus": int, "layout": str, "notes": list, "code_states": dict,
                "code_values": dict}
    numbers = ("published_step_time_s", "predicted_step_time_s", "error", "step_time_error", "published",
               "predicted")
    for r in report["rows"]:
        for key, kind in required.items():
            assert isinstance(r[key], kind), key
        for key in numbers:
            assert key in r and (r[key] is None or isinstance(r[key], float))
        assert (r["predicted_step_time_s"] is None) == (r["status"] != "simulated")
        if r["status"] == "simulated":  # what the run cost, beside how it was folded
            assert r["run"]["cpu_time_s"] > 0 and r["run"]["peak_rss_MB"] > 10 and r["run"]["engine_reason"]
    (table,) = report["tables"]
    assert table["table"] == "small.tsv" and table["rows"] == 4
    assert table["by_status"] == {"simulated": 3, "unsupported": 1}
    errors = [abs(r["error"]) for r in report["rows"] if r["status"] == "simulated"]
    assert table["error"]["max_abs"] == pytest.approx(max(errors), abs=1e-6)
    assert table["error"]["mean_abs"] == pytest.approx(sum(errors) / 3, abs=1e-6)


def test_runs_are_deterministic(tmp_path: Path, report: dict[str, Any]) -> None:
    table = write_table(tmp_path / "small.tsv", ROWS[:2])
    out = run_cli("validate-training", "--tables", str(table), "--json", str(tmp_path / "again.json"), "--quiet")
    assert out.returncode == 0, out.stderr
    again = json.loads((tmp_path / "again.json").read_text())["rows"]
    for first, second in zip(report["rows"][:2], again, strict=True):
        first, second = dict(first), dict(second)
        first.pop("run"), second.pop("run")
        assert first == second


def test_plot_and_plan_only(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    table = write_table(tmp_path / "small.tsv", ROWS[:1] + ROWS[2:])
    out = run_cli("validate-training", "--tables", str(table), "--plan-only", "--plot", str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "p.png").stat().st_size > 1000
    # a planned row says so without an empty reason after it
    assert not [line for line in out.stdout.splitlines() if line.rstrip().endswith("planned:")], out.stdout
    assert any(line.rstrip().endswith("planned") for line in out.stdout.splitlines()), out.stdout


def test_bad_tables_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("row_id\tmodel\nx\ty\n")
    out = run_cli("validate-training", "--tables", str(bad))
    assert out.returncode == 1 and "not a training table" in out.stderr and "Traceback" not in out.stderr
    twice = write_table(tmp_path / "twice.tsv", [ROWS[0], ROWS[0]])
    out = run_cli("validate-training", "--tables", str(twice))
    assert out.returncode == 1 and "appears twice" in out.stderr and len(out.stderr.splitlines()) == 1


def test_a_feature_the_generator_lacks_is_needed_not_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    stated = {"source_id": "korthikanti22_t5", "row_id": "vp", "model": "GPT tiny", **TINY, "layers": "4", "TP": "1",
              "PP": "2", "VP": "2", "global_batch": "8", "micro_batch": "1", "n_gpus": "8", **A100,
              "step_time_s": "1"}
    options = dict(training_features.generator_options())
    options.pop("vp", None)
    options.pop("virtual_pipeline", None)
    monkeypatch.setattr(training_features, "generator_options", lambda: options)
    plan = plan_row(row(stated))
    assert plan.status == NEEDS and plan.approximable
    assert plan.reason == "interleaved pipeline schedule (generator option vp or virtual_pipeline)"
    assert "vp" not in plan.spec and plan.spec["pp"] == 2
    options["vp"] = options["pp"]  # once the generator has the option, the row uses it
    plan = plan_row(row(stated))
    assert plan.status == READY and plan.spec["vp"] == 2


def test_feature_alternatives_take_the_first_the_generator_has() -> None:
    assert training_features.resolve("full_recompute", True) in (("recompute", "full"),
                                                                 ("activation_recompute", True))
    assert training_features.resolve("tp", 4) == ("tp", 4)
    assert training_features.resolve("distributed_optimizer", True) in (("use_distributed_optimizer", True),
                                                                        ("zero", 1))


def test_hardware_matching() -> None:
    def match(gpu: str, inter: str = "", per_node: int | None = None, override: str | None = None) -> str:
        choice = choose_hardware(stated_machine(gpu, "", inter, per_node), override)
        return choice.profile.name if choice.profile and not choice.problem else choice.problem

    assert match("A100-SXM4-80GB", A100["inter_node"], 8) == "dgx-a100"
    assert match("A100-SXM4-40GB", "8x 200 Gb/s HDR InfiniBand") == "azure-ndv4-a100"
    assert choose_hardware(stated_machine("A100-SXM4-40GB", "", "", None)).profile.gpu == "A100-SXM4-40GB"  # type: ignore[union-attr]
    assert match("NVIDIA H100-SXM5-80GB", "Storage: 2x ConnectX-7 IB NDR 400Gb/s, Compute: 8x ConnectX-7 IB NDR "
                                          "400Gb/s") == "hgx-h100"
    assert match("H100", "8x 200 Gb/s TCP") == "gcp-a3-mega"
    assert "no shipped hardware profile for H100" in match("H100", "2x 100Gb/s Ethernet")
    assert "4 GPUs per node" in match("TPU-v5p", per_node=4, override="hgx-h100")
    assert match("GB200", override="dgx-b200") == "dgx-b200"
    # NVL72 racks: a node is the 72-GPU NVLink domain, one NIC per GPU
    assert match("GB200") == "gb200-nvl72" and match("GB300") == "gb300-nvl72"
    assert match("NVIDIA GB300", "72x ConnectX-8 800 Gb/s InfiniBand", 72) == "gb300-nvl72"
    assert "gb200-nvl72: NICs 8x 400 Gb/s vs 72x 400 Gb/s" in match("GB200", "8x 400 Gb/s InfiniBand")
    choice = choose_hardware(stated_machine("GB200", "NVLink5", "", None))
    assert choice.device == "GB200" and "gb200-nvl72" in choice.defaults_used[0]


def test_nvl72_networks_are_racks_joined_by_their_nics() -> None:
    gb200 = load_profile("gb200-nvl72")
    one = network_for(gb200, 64, "row")  # a run of up to 72 GPUs is one NVLink domain
    assert (one.topology, one.npus_count) == (("Switch",), (64,))
    two = network_for(load_profile("gb300-nvl72"), 144, "row")
    assert (two.topology, two.npus_count) == (("Switch", "Switch"), (72, 2))
    assert two.bandwidth_GiBps[1] == pytest.approx(100e9 / 2**30)  # one 800 Gb/s NIC per GPU, in GiB/s
    # beyond one rack: equal slices of whole 4-GPU trays (Megatron-Bridge's Slurm --segment), each with its NICs
    sliced = network_for(gb200, 128, "row")
    assert (sliced.npus_count, sliced.bandwidth_GiBps[1]) == ((64, 2), pytest.approx(50e9 / 2**30))
    with pytest.raises(InputError, match=r"130 GPUs do not fill whole nodes of 72 .*gb200-nvl72.*--hw-profile"):
        network_for(gb200, 130, "row")  # not whole trays
    # a table that counts the 4-GPU tray as its node still means the rack
    assert choose_hardware(stated_machine("GB200", "", "", 4)).profile.name == "gb200-nvl72"  # type: ignore[union-attr]


def test_table_fields_keep_the_sources_text() -> None:
    assert leading_number("12 (custom.yaml default)") == (12.0, "(custom.yaml default)")
    assert leading_number("44% (of 312 TF peak)") == (0.44, "(of 312 TF peak)")
    assert leading_number("interleaved schedule") is None
    plan = plan_row(row({**ROWS[0], "TP": "2 (4)"}))
    assert any("the value in parentheses (4)" in n for n in plan.notes) and plan.spec["tp"] == 2
    plan = plan_row(row({**ROWS[0], "VP": "interleaved schedule (number of chunks not stated)", "PP": "2",
                         "DP": "2"}))
    assert plan.status == UNSUPPORTED and "without its number of virtual stages" in plan.reason
    plan = plan_row(row({**ROWS[0], "DP": "3"}))
    assert plan.status == UNSUPPORTED and "not the row's 8 GPUs" in plan.reason


MODELZOO = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "unseen_training" / "megatron_moe_modelzoo.tsv"


def test_megatron_flops_with_causal_attention_reproduce_the_modelzoo_rows_printing_both() -> None:
    """Megatron-LM's FLOP count (attention scores over half the matrix since 2025) turns the ModelZoo rows that
    print a step time into the TFLOP/s they print, so the rows printing TFLOP/s alone get a step time from it."""
    both = [r for r in read_tables([str(MODELZOO)]) if r.text("step_time_s") and r.text("tflops_per_gpu")]
    assert len(both) >= 5
    for r in both:
        plan = plan_row(r)
        got = FLOP_FORMULAS[r.source_id][1](plan.model, int(r.text("global_batch")))
        tflops = got / (float(r.text("step_time_s")) * plan.n_gpus) / 1e12
        assert tflops == pytest.approx(float(r.text("tflops_per_gpu")), rel=6e-3), r.row_id
        assert megatron_core_flops(plan.model, 2048) > got  # the whole matrix counts more


def test_a_rows_stated_megatron_arguments_set_what_it_ran() -> None:
    base = {"source_id": "megatron_moe_modelzoo", "row_id": "moe", "model": "Qwen3_30B_a3B", "seq_len": "4096",
            "TP": "1", "PP": "1", "EP": "8", "global_batch": "64", "micro_batch": "1", "n_gpus": "8", "gpu": "B200",
            "gpus_per_node": "8", "precision": "BF16", "tokens_per_s_per_gpu": "10000"}
    args = ("Megatron-LM arguments: --moe-token-dispatcher-type flex --moe-enable-deepep --recompute-granularity "
            "selective --recompute-modules moe_act layernorm --combined-1f1b --combined-1f1b-recipe ep_a2a "
            "--cuda-graph-scope moe_router moe_preprocess --cross-entropy-loss-fusion --made-up-flag 3; other notes")
    plan = plan_row(row({**base, "notes": args}))
    assert plan.status == READY, plan.reason
    spec = plan.spec
    assert (spec["moe_dispatcher"], spec["moe_flex_backend"], spec["recompute"]) == ("flex", "deepep", "selective")
    assert spec["recompute_modules"] == "moe_act,layernorm" and spec["moe_a2a_overlap"]
    assert spec["cuda_graph_scope"] == "moe_router,moe_preprocess" and "cross_entropy" not in spec
    assert any("--made-up-flag" in x for x in plan.left_out)
    assert any("the row's Megatron-LM arguments" in d for d in plan.defaults_used)
    plain = plan_row(row({**base, "notes": "other notes"}))
    assert "moe_a2a_overlap" not in plain.spec and plain.spec.get("moe_dispatcher", "alltoall") == "alltoall"
    wrong = plan_row(row({**base, "notes": "Megatron-LM arguments: --moe-token-dispatcher-type nccl"}))
    assert wrong.status == UNSUPPORTED and "nccl" in wrong.reason


def test_a_figure_its_source_reports_as_a_regression_is_not_simulated() -> None:
    assert plan_row(row(ROWS[0])).status == READY
    flagged = plan_row(row({**ROWS[0], "notes": "source footnote: a known performance regression of the release"}))
    assert flagged.status == UNSUPPORTED and "regression" in flagged.reason and flagged.layout


def test_missing_table_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no rows"):
        read_tables([str(write_table(tmp_path / "empty.tsv", []))])


SHARED_TABLES = SHARED / "reference" / "hardware" / "training"


@pytest.mark.skipif(not SHARED_TABLES.is_dir(), reason="needs ../shared/reference/hardware/training")
def test_flop_formulas_reproduce_the_tables_derived_step_times() -> None:
    rows = read_tables([str(SHARED_TABLES / "megatron_sc21_t1.tsv"), str(SHARED_TABLES / "megatron_readme_h100.tsv")])
    checked = 0
    for r in rows:
        plan = plan_row(r)
        if plan.metric is None:
            continue
        formula = sc21_flops if r.source_id == "megatron_sc21_t1" else megatron_core_flops
        flops = formula(plan.model, int(r.text("global_batch")))
        step = flops / (float(r.text("tflops_per_gpu")) * 1e12 * plan.n_gpus)
        assert step == pytest.approx(float(r.text("derived_step_time_s")), rel=2e-3), r.row_id
        assert plan.metric.published_step_time_s == pytest.approx(step)
        checked += 1
    assert checked == 8


def test_rows_over_the_limits_say_so(tmp_path: Path) -> None:
    # its 64 ranks fold to one class of equal ranks: enough work to pass the limit takes 32 layers and 64
    # micro-batches per data-parallel replica
    big = {**ROWS[0], "row_id": "big", "TP": "2", "DP": "32", "n_gpus": "64", "global_batch": "2048", "layers": "32"}
    table = write_table(tmp_path / "big.tsv", [big])
    out = run_cli("validate-training", "--tables", str(table), "--time-limit", "0.5", "--json",
                  str(tmp_path / "r.json"), "--quiet")
    assert out.returncode == 0, out.stderr
    (r,) = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert r["status"] == "not finished" and r["predicted_step_time_s"] is None
    per_stage = r["trace_nodes"] // 64  # pp 1: one rank per stage is one rank
    assert r["reason"] == (f"over the CPU-time limit of 0.5 s (64 ranks, {r['trace_nodes']:,} trace nodes, "
                           f"{per_stage:,} of them in one rank per pipeline stage: beyond what one run simulates "
                           "here)")
    assert r["trace_nodes"] > 64 * 8 * 2 * 10  # ranks x micro-batches x layers x nodes per layer, at least
    out = run_cli("validate-training", "--tables", str(table), "--memory-limit", "0.05", "--quiet")
    assert out.returncode == 0 and ("not finished: over the memory limit of 0.05 GiB" in out.stdout
                                    or "ended without a result" in out.stdout)


def test_approximation_never_drops_a_dimension_of_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    stated = {**ROWS[0], "TP": "2", "CP": "2", "DP": "2"}
    options = dict(training_features.generator_options())
    options.pop("cp", None)
    monkeypatch.setattr(training_features, "generator_options", lambda: options)
    plan = plan_row(row(stated))
    assert plan.status == NEEDS and "context parallelism" in plan.reason and not plan.approximable


def test_a_layout_the_generator_refuses_is_reported_not_fatal(tmp_path: Path) -> None:
    refused = {**ROWS[0], "row_id": "heads", "hidden": "384", "heads": "6", "TP": "4", "DP": "2"}  # 6 heads, tp=4
    table = write_table(tmp_path / "t.tsv", [refused, ROWS[0]])
    out = run_cli("validate-training", "--tables", str(table), "--plan-only", "--json", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr
    first, second = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert first["status"] == UNSUPPORTED and "not divisible by tp=4" in first["reason"]
    assert second["status"] == "planned"


def test_gpt_oss_windows_and_old_megatron_attention_are_generator_options() -> None:
    """GPT-OSS rows run with their sliding windows (128 tokens, every other layer); the 2021-2022 Megatron-LM rows
    with the unfused attention core of their time, and the report says it took that default."""
    oss = plan_row(row({"source_id": "megatron_bridge_perf", "row_id": "oss", "model": "GPT OSS 120B",
                        "seq_len": "4096", "TP": "1", "PP": "1", "EP": "8", "global_batch": "64", "micro_batch": "1",
                        "n_gpus": "8", "gpu": "H100", "gpus_per_node": "8", "precision": "BF16",
                        "tokens_per_s_per_gpu": "5000"}))
    assert oss.status == READY, oss.reason
    assert oss.spec["window_size"] == 128 and oss.spec["window_attn_skip_freq"] == 2
    old = plan_row(row(ROWS[0]))
    assert old.status == READY and old.spec["attention_backend"] == "unfused"
    assert any(d.startswith("attention unfused (Megatron-LM before FlashAttention") for d in old.defaults_used)
    assert old.spec["cross_entropy"] == "unfused"  # Megatron-LM without --cross-entropy-loss-fusion
    bridge = plan_row(row(ROWS[3] | {"gpu": "B200", "gpus_per_node": "8"}))
    assert "attention_backend" not in bridge.spec and "cross_entropy" not in bridge.spec  # NeMo: fused


@pytest.mark.parametrize(("source", "precision", "expected", "default"), [
    ("megatron_bridge_perf", "FP8-CS (FP8-MX)", ("fp8", "tensorwise"), False),
    ("megatron_bridge_perf", "MXFP8", ("fp8", "mxfp8"), False),
    ("megatron_bridge_perf", "FP8-MX", ("fp8", "mxfp8"), False),
    ("megatron_bridge_perf", "FP8", ("fp8", "tensorwise"), True),  # the Bridge's recipes: fp8_cs, no delayed
    ("megatron_bridge_perf", "NVFP4", ("fp4", None), False),
    ("nemo_2407", "FP8", ("fp8", "delayed"), True),  # Transformer Engine's default
    ("nemo_2407", "BF16", (None, None), False),
])
def test_a_rows_precision_names_the_quantization_recipe(source: str, precision: str, expected: tuple, default: bool
                                                        ) -> None:
    plan = plan_row(row({"source_id": source, "row_id": "r", "model": "LLAMA3_8B", "seq_len": "8192", "TP": "1",
                         "PP": "1", "global_batch": "16", "micro_batch": "1", "n_gpus": "8", "gpu": "B200",
                         "gpus_per_node": "8", "precision": precision, "tokens_per_s_per_gpu": "30000"}))
    assert plan.status == READY, plan.reason
    assert (plan.spec.get("precision"), plan.spec.get("fp8_recipe")) == expected
    assert any(d.startswith("FP8 recipe") for d in plan.defaults_used) == default


def test_the_default_memory_limit_is_three_quarters_of_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's simulation may use three quarters of physical memory by default (the help says how much here); a
    platform that does not tell falls back to 4 GiB."""
    from simulator.tools import step_run

    sizes = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 16 * 2**30 // 4096}
    monkeypatch.setattr(step_run.os, "sysconf", lambda name: sizes[name])
    assert step_run.default_memory_gib() == 12.0

    def unknown(name: str) -> int:
        raise ValueError(name)

    monkeypatch.setattr(step_run.os, "sysconf", unknown)
    assert step_run.default_memory_gib() == 4.0
    monkeypatch.undo()
    help_text = run_cli("validate-training", "--help").stdout
    assert f"here {step_run.default_memory_gib():g}" in " ".join(help_text.split())


def _without_run(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "run"} for r in rows]


def test_rows_run_at_once_give_the_same_report_in_the_tables_order(tmp_path: Path, report: dict[str, Any]) -> None:
    """--jobs 2 simulates two rows at a time in their own processes; the report is the one --jobs 1 writes."""
    table = write_table(tmp_path / "small.tsv", ROWS)
    out = run_cli("validate-training", "--tables", str(table), "--json", str(tmp_path / "j2.json"), "--jobs", "2",
                  "--quiet")
    assert out.returncode == 0, out.stderr
    again = json.loads((tmp_path / "j2.json").read_text())
    assert _without_run(again["rows"]) == _without_run(report["rows"])
    assert again["tables"] == report["tables"]
    assert out.stdout == report["stdout"]
    bad = run_cli("validate-training", "--tables", str(table), "--jobs", "0")
    assert bad.returncode != 0 and "--jobs must be at least 1" in bad.stderr and "Traceback" not in bad.stderr


def test_an_interrupted_run_keeps_its_finished_rows_and_resume_reuses_them(tmp_path: Path,
                                                                          report: dict[str, Any]) -> None:
    """The --json report is rewritten as each simulated row finishes: a run killed during a long row keeps the
    rows before it, and --resume keeps those (as saved) while simulating the rows it lacks or that would now run
    differently."""
    long = {**ROWS[0], "row_id": "long", "TP": "2", "DP": "32", "n_gpus": "64", "global_batch": "4096",
            "layers": "64"}
    table = write_table(tmp_path / "small.tsv", [ROWS[0], long])
    path = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.Popen([sys.executable, "-m", "simulator", "validate-training", "--tables", str(table),
                            "--json", str(path), "--quiet"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not path.exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.2)
        assert run.poll() is None, "the long row finished before it could be interrupted"
        run.kill()  # however it ends (SIGINT may be ignored where the tests run in the background)
        run.communicate(timeout=60)
    finally:
        run.kill()
    saved = json.loads(path.read_text())
    (first,) = saved["rows"]  # the long row was not finished: not in the report
    assert _without_run([first]) == _without_run(report["rows"][:1])
    # resume: the saved row is kept as saved (its prediction marked to show it), a changed layout is simulated
    first["predicted_step_time_s"] = 1234.5
    kept, changed = dict(first), dict(report["rows"][1])
    changed["generator"] = {**changed["generator"], "micro_batch_size": 2}
    changed["predicted_step_time_s"] = 1234.5
    path.write_text(json.dumps({"rows": [kept, changed]}))
    table = write_table(tmp_path / "small.tsv", ROWS[:2])
    out = run_cli("validate-training", "--tables", str(table), "--resume", str(path), "--json",
                  str(tmp_path / "again.json"), "--quiet")
    assert out.returncode == 0, out.stderr
    again = {r["row_id"]: r for r in json.loads((tmp_path / "again.json").read_text())["rows"]}
    assert again["tiny_tp2"]["predicted_step_time_s"] == 1234.5
    assert again["tiny_defaults"]["predicted_step_time_s"] == report["rows"][1]["predicted_step_time_s"]
    path.write_text("{}")
    bad = run_cli("validate-training", "--tables", str(table), "--resume", str(path))
    assert bad.returncode != 0 and "not a validate-training --json report" in bad.stderr


def test_a_row_over_its_share_of_the_default_memory_runs_again_alone(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With --jobs 2 each row may use half the default limit; a row over it is not reported as beyond what one run
    simulates: once the others are done it runs again alone, with the whole limit. (The limits are scaled down so
    that the share really fails here and the whole does not.)"""
    from simulator.tools import validate_training

    monkeypatch.setattr(validate_training, "default_memory_gib", lambda: 8.0)
    asked: list[float] = []
    real_start = validate_training.start_limited

    def start(*args: Any) -> Any:
        asked.append(args[-1] / 2**30)
        return real_start(*args[:-1], int(0.05 * 2**30) if args[-1] < 8 * 2**30 else 0)

    monkeypatch.setattr(validate_training, "start_limited", start)
    rows = read_tables([str(write_table(tmp_path / "two.tsv", ROWS[:2]))])
    got = validate_training.evaluate_rows(rows, jobs=2)
    assert [r["status"] for r in got] == ["simulated", "simulated"]
    assert asked == [4.0, 4.0, 8.0, 8.0]
    # a limit the user gives is each row's and final
    asked.clear()
    got = validate_training.evaluate_rows(rows, jobs=2, memory_gib=4.0)
    assert asked == [4.0, 4.0] and all(r["status"] == "not finished" for r in got)
    assert all("over the memory limit of 0.05 GiB" in r["reason"] for r in got)


def test_megatron_lm_without_a_pipeline_takes_the_largest_micro_batch_that_fits() -> None:
    # Megatron-LM has no default micro-batch size: with PP 1 the largest dividing a data-parallel rank's sequences
    # whose memory estimate fits the GPU (80 GiB), with a pipeline 1 (smaller micro-batches shrink the bubble)
    base = {"source_id": "megatron_sc21_t1", "model": "GPT", "layers": "24", "hidden": "2048", "heads": "16",
            "seq_len": "2048", "TP": "1", "n_gpus": "8", **A100, "step_time_s": "1"}
    small = plan_row(row(base | {"row_id": "fits", "PP": "1", "global_batch": "64"}))
    assert small.status == READY, small.reason
    assert small.spec["micro_batch_size"] == 8  # all 8 sequences of each data-parallel rank at once
    assert any("micro-batch size 8" in d and "fits in the A100's 80 GiB" in d for d in small.defaults_used)
    # 64 sequences per rank do not fit at once: the largest divisor that does
    many = plan_row(row(base | {"row_id": "many", "PP": "1", "global_batch": "512"}))
    from workload.generated import llm_peak_memory

    size = many.spec["micro_batch_size"]
    assert 1 < size < 64 and 64 % size == 0
    capacity = 80 * 2**30
    assert llm_peak_memory(many.spec, "many").total_bytes <= capacity
    assert llm_peak_memory(many.spec | {"micro_batch_size": 2 * size}, "many").total_bytes > capacity
    piped = plan_row(row(base | {"row_id": "piped", "PP": "2", "n_gpus": "16", "global_batch": "64"}))
    assert piped.spec["micro_batch_size"] == 1
    assert any(d.startswith("micro-batch size 1 (Megatron-LM requires --micro-batch-size") for d in piped.defaults_used)
    # a stated micro-batch size is kept, and a run that would not fit says so (every published run fitted)
    stated = plan_row(row(base | {"row_id": "stated", "PP": "1", "global_batch": "64", "micro_batch": "2"}))
    assert stated.spec["micro_batch_size"] == 2 and not [n for n in stated.notes if "memory estimate" in n]
    huge = plan_row(row(base | {"row_id": "huge", "PP": "1", "global_batch": "512", "micro_batch": "64"}))
    assert huge.status == READY
    assert [n for n in huge.notes if "by the memory estimate, more than the A100's 80 GiB" in n]
