"""validate-training's framework recipes (configs/recipes/*.yml, simulator/tools/training_recipes.py): what a
release's own code ran and its table leaves unstated fills the blank, a stated value wins, and the host CPU comes
from the hardware profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.tools.training_layout import READY, RowPlan, plan_row
from simulator.tools.training_recipes import RECIPES_DIR, _recipes, recipe_for
from simulator.tools.training_table import read_tables
from simulator.tools.validate_training import format_row, row_json
from tests.conftest import run_cli
from tests.tools.test_validate_training import row
from workload.errors import ConfigError
from workload.files import read_yaml

SHARED = Path(__file__).resolve().parents[3] / "shared" / "reference" / "hardware" / "training"
HOLD_OUT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "unseen_training"
BASE = {"source_id": "megatron_bridge_perf", "source_section": "26.02.01 NeMo container / Pre-Training Performance",
        "model": "LLAMA3_70B", "seq_len": "8192", "TP": "1", "PP": "4", "CP": "1", "DP": "16",
        "global_batch": "256", "micro_batch": "1", "n_gpus": "64", "gpu": "GB300", "precision": "MXFP8",
        "tokens_per_s_per_gpu": "4798"}


def test_a_blank_vp_takes_the_releases_recipe_and_a_stated_one_wins() -> None:
    blank = plan_row(row({**BASE, "row_id": "blank"}))
    assert blank.status == READY, blank.reason
    assert blank.spec["vp"] == 5 and "VP5" in blank.layout
    assert any(d.startswith("VP 5 (Megatron-Bridge 26.02.01 recipe (v0.3.1 @9c9dd848)") for d in blank.defaults_used)
    stated = plan_row(row({**BASE, "row_id": "stated", "VP": "2"}))
    assert stated.spec["vp"] == 2 and not any(d.startswith("VP ") for d in stated.defaults_used)
    other = plan_row(row({**BASE, "row_id": "other", "source_section": "27.01 NeMo container"}))
    assert "vp" not in other.spec  # no recipe for that release: the framework's default (no interleaving)


def test_moe_rows_take_graph_scopes_and_the_host_cpu() -> None:
    qwen = {**BASE, "model": "Qwen3_30B_a3B", "seq_len": "4096", "PP": "1", "EP": "8", "DP": "8",
            "global_batch": "512", "micro_batch": "8", "n_gpus": "8"}
    grace = plan_row(row({**qwen, "row_id": "gb300"}))
    assert grace.status == READY, grace.reason
    assert grace.spec["cuda_graph_scope"] == "moe_router,moe_preprocess" and grace.spec["host_cpu"] == "grace"
    assert grace.spec["moe_host_sync"] is True
    x86 = plan_row(row({**qwen, "row_id": "b200", "gpu": "B200", "micro_batch": "4"}))
    assert x86.spec["cuda_graph_scope"] == "attn,moe_router,moe_preprocess" and x86.spec["host_cpu"] == "x86"
    drop = plan_row(row({**qwen, "row_id": "drop", "source_section": "25.09 NeMo container", "precision": "",
                         "model": "Qwen3_30B_a3B (tokendrop)", "gpu": "GB200", "micro_batch": "4"}))
    assert drop.spec["cuda_graph_scope"] == "full" and "moe_host_sync" not in drop.spec
    # the dispatcher: HybridEP on GB300 (flex), NCCL all-to-all in 25.09's token-drop recipe
    assert grace.spec["moe_dispatcher"] == "flex" and "moe_dispatcher" not in drop.spec
    assert any(d.startswith("MoE dispatcher flex (hybridep) (Megatron-Bridge 26.02.01") for d in grace.defaults_used)
    assert grace.spec["moe_flex_backend"] == "hybridep"
    assert any(d.startswith("MoE dispatcher alltoall (Megatron-Bridge 25.09") for d in drop.defaults_used)
    # the flex dispatcher's NVLink domain is the profile's: a GB300 NVL72 rack; an alltoall row needs none
    assert grace.spec["nvlink_domain"] == 72 and "nvlink_domain" not in drop.spec


def test_every_recipe_names_its_release_and_a_published_row() -> None:
    """Every recipe is a row of the shared calibration table or of a hold-out table (the same source), once, and
    every release a recipe names has its commit."""
    data = read_yaml(str(RECIPES_DIR / "megatron_bridge.yml"), "framework recipes")
    assert all(r["release"] in data["releases"] for r in data["recipes"])
    tables = [SHARED / "megatron_bridge_perf.tsv", *sorted(HOLD_OUT.glob("megatron_bridge*.tsv"))]
    assert len(tables) >= 3 and all(t.is_file() for t in tables)
    rows = [r for r in read_tables([str(t) for t in tables]) if r.source_id == "megatron_bridge_perf"]
    published = {(r.text("source_section").split()[0], r.text("model"), r.text("gpu"), r.text("precision"))
                 for r in rows}
    assert set(_recipes("megatron_bridge.yml")) <= published
    assert len(_recipes("megatron_bridge.yml")) == len(data["recipes"])  # one entry per published key
    assert recipe_for("nemo_2407", "24.07", "LLAMA2-7B", "H100", "FP8") is None


def test_whole_iteration_graphs_have_no_host_sync_and_bridge_reduces_in_bf16() -> None:
    """Megatron-Bridge 26.06's sync-free MoE recipe (whole-iteration CUDA graphs over HybridEP's fixed buffers):
    no dropless host wait, no host nodes; its recipes reduce gradients in the parameters' precision."""
    qwen = {**BASE, "source_section": "26.06 NeMo container", "model": "Qwen3_30B_a3B", "seq_len": "4096",
            "PP": "1", "EP": "8", "DP": "8", "global_batch": "512", "micro_batch": "8", "n_gpus": "8"}
    plan = plan_row(row({**qwen, "row_id": "sync_free"}))
    assert plan.status == READY, plan.reason
    assert plan.spec["cuda_graph_scope"] == "full_iteration" and "moe_host_sync" not in plan.spec
    assert any(d.startswith("MoE dispatch without a host sync") for d in plan.defaults_used)
    assert "grad_reduce_in_fp32" not in plan.spec
    assert any(d.startswith("gradient reduction in the parameters' precision") for d in plan.defaults_used)
    # the same recipe overlaps the expert-parallel all-to-alls with the next backward (EP A2A overlap)
    assert plan.spec["moe_a2a_overlap"] is True and plan.spec["moe_dispatcher"] == "flex"
    assert any(d.startswith("EP A2A overlap (Megatron-Bridge 26.06 recipe") for d in plan.defaults_used)


def test_ep_overlap_needs_virtual_stages_with_a_pipeline() -> None:
    """Megatron-Core runs the EP A2A overlap with pp > 1 only over virtual stages: a row whose printed layout has a
    pipeline and no VP runs without it, and says so."""
    qwen = {**BASE, "source_section": "26.02 NeMo container", "model": "Qwen3_30B_a3B", "gpu": "H100",
            "precision": "FP8", "seq_len": "4096", "PP": "2", "EP": "8", "DP": "8", "global_batch": "1024",
            "micro_batch": "1", "n_gpus": "16"}
    with_vp = plan_row(row({**qwen, "row_id": "vp", "VP": "12"}))
    assert with_vp.status == READY and with_vp.spec["moe_a2a_overlap"] is True
    without = plan_row(row({**qwen, "row_id": "no_vp", "VP": "1"}))
    assert "moe_a2a_overlap" not in without.spec
    assert any("EP A2A overlap" in n and "runs without" in n for n in without.notes)


def test_code_states_are_what_the_rows_print_otherwise_and_the_printed_values_run() -> None:
    """A recipe's code_states name values its release's code sets where its rows print others (never a stale
    entry): the row's printed values are simulated and its report carries a note and the code's values."""
    tables = [SHARED / "megatron_bridge_perf.tsv", *sorted(HOLD_OUT.glob("megatron_bridge*.tsv"))]
    rows = read_tables([str(t) for t in tables])
    stating = {key: r for key, r in _recipes("megatron_bridge.yml").items() if r.code_states}
    assert len(stating) >= 10
    for key, recipe in stating.items():
        matched = [r for r in rows if (r.text("source_section").split()[0], r.text("model"), r.text("gpu"),
                                       r.text("precision")) == key]
        assert matched, key
        for r in matched:
            plan = plan_row(r)
            assert plan.code_states == dict(recipe.code_states), r.row_id  # every value the row prints otherwise
            assert [n for n in plan.notes if n.startswith(f"{recipe.where} states ")], r.row_id
    b200 = plan_row(next(r for r in rows if r.row_id.endswith("DGX-B200_GPT_OSS_120B_64_BF16_252")))
    assert b200.code_states == {"EP": "64"} and b200.spec["ep"] == 8  # the printed EP8 runs
    assert any(n.startswith("Megatron-Bridge 25.11 recipe (v0.2.0 @7af9601c) states EP 64 where the table prints EP 8")
               for n in b200.notes)
    shown = row_json(b200, "planned", "", None)
    assert shown["code_states"] == {"EP": "64"}  # in the JSON, and in the report without -v
    assert "its release's code states EP 64, not the printed values (-v: the note)" in "\n".join(
        format_row(shown, False, 40))
    # a row that prints what the code states (the 26.02.01 GB300 MXFP8 recipe's micro-batch 1) gets no note
    same = plan_row(row({**BASE, "row_id": "same"}))
    assert not same.code_states and not any(" states " in n for n in same.notes)
    assert plan_row(row({**BASE, "row_id": "two", "micro_batch": "2"})).code_states == {"micro_batch": "1"}
    b300 = {**BASE, "model": "Qwen3_235B_a22B", "gpu": "B300", "PP": "8", "EP": "8", "DP": "32", "n_gpus": "256"}
    assert plan_row(row({**b300, "row_id": "vp4", "VP": "4"})).code_states == {"VP": "none"}
    assert not plan_row(row({**b300, "row_id": "vp1", "VP": "1"})).code_states  # no virtual stages either way


def test_code_values_run_the_layout_and_batch_the_release_states() -> None:
    """validate-training --code-values: where a row prints another layout or batch than its release's code, the
    code's is simulated (DP from the GPUs), the published throughput turned into a step of the code's batch, and a
    note says so; other columns (FSDP, recompute) stay noted, and rows without code_states plan as before."""
    rows = {r.row_id: r for r in read_tables([str(SHARED / "megatron_bridge_perf.tsv")])}

    def one(suffix: str, code_values: bool = True) -> RowPlan:
        return plan_row(next(r for i, r in rows.items() if i.endswith(suffix)), code_values=code_values)

    b200 = one("DGX-B200_GPT_OSS_120B_64_BF16_252")
    assert b200.status == READY and b200.spec["ep"] == 64 and b200.code_values == {"EP": "64"}
    assert not b200.code_states and "simulated with its release's code values EP 64 instead of the printed EP 8" in \
        b200.notes
    h100 = one("DGX-H100_Qwen3_30B_a3B_16_FP8_190")
    assert (h100.spec.get("pp", 1), h100.spec.get("vp", 1), h100.spec["ep"], h100.spec["dp"]) == (1, 1, 16, 16)
    assert "DP = GPUs / (TP x PP x CP) = 16" in h100.defaults_used
    gb300 = one("DGX-GB300_GPT_OSS_120B_64_BF16_238")
    printed = one("DGX-GB300_GPT_OSS_120B_64_BF16_238", code_values=False)
    assert (gb300.spec["seq_len"], gb300.spec["global_batch"], gb300.spec["micro_batch_size"]) == (4096, 512, 4)
    tokens_per_s = float(gb300.row.text("tokens_per_s_per_gpu"))
    assert gb300.metric.published_step_time_s == pytest.approx(512 * 4096 / (tokens_per_s * 64))  # type: ignore[union-attr]
    assert printed.metric.published_step_time_s == pytest.approx(1280 * 8192 / (tokens_per_s * 64))  # type: ignore[union-attr]
    fsdp = one("DGX-H100_LLAMA3_8B_8_FP8-CS_255")  # no layout or batch to take: only noted
    assert not fsdp.code_values and set(fsdp.code_states) == {"zero_or_dist_opt", "recompute"}
    plain = one("DGX-GB200_LLAMA3_70B_64_MXFP8_167")
    assert plain.spec == one("DGX-GB200_LLAMA3_70B_64_MXFP8_167", code_values=False).spec and not plain.code_values
    out = run_cli("validate-training", "--tables", str(SHARED / "megatron_bridge_perf.tsv"), "--rows",
                  "GPT_OSS_120B_64_BF16_252", "--plan-only", "--code-values", "-v")
    assert out.returncode == 0, out.stderr
    assert "TP1 PP1 EP64 DP64" in out.stdout and "code values EP 64 instead of the printed EP 8" in out.stdout
    short = run_cli("validate-training", "--tables", str(SHARED / "megatron_bridge_perf.tsv"), "--rows",
                    "GPT_OSS_120B_64_BF16_252", "--plan-only", "--code-values")
    assert "simulated with its release's code values EP 64 (-v: the printed ones)" in short.stdout


@pytest.mark.parametrize(("good", "typo", "message"), [
    ("moe_a2a_overlap: true", "moe_a2a_overlpa: true", "moe_a2a_overlpa"),
    ("code_states: {EP: 64}", "code_states: {ep: 64}", r"code_states column\(s\) ep unknown; valid are TP, PP"),
])
def test_a_misspelled_recipe_key_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, good: str, typo: str,
                                             message: str) -> None:
    """A typo in the recipes file must not silently turn a setting off (or a note into nothing)."""
    import simulator.tools.training_recipes as recipes

    text = (RECIPES_DIR / "megatron_bridge.yml").read_text()
    assert good in text
    (tmp_path / "megatron_bridge.yml").write_text(text.replace(good, typo, 1))
    monkeypatch.setattr(recipes, "RECIPES_DIR", tmp_path)
    _recipes.cache_clear()
    try:
        with pytest.raises(ConfigError, match=message):
            _recipes("megatron_bridge.yml")
    finally:
        _recipes.cache_clear()


def test_gpt_oss_recipes_recompute_their_norms_and_expert_activation() -> None:
    """GPT-OSS's 26.02-26.04.01 recipes on GB200, B200 and H100 recompute layernorm and moe_act (selective); 25.11's
    scripts named the modules without the granularity, so nothing; GB300 none; a stated recompute wins."""
    oss = {**BASE, "model": "GPT OSS 120B", "seq_len": "4096", "PP": "1", "EP": "64", "DP": "64",
           "global_batch": "1280", "micro_batch": "4", "n_gpus": "64", "precision": "BF16",
           "source_section": "26.02 NeMo container / Pre-Training Performance"}
    gb200 = plan_row(row({**oss, "row_id": "gb200", "gpu": "GB200"}))
    assert gb200.status == READY, gb200.reason
    assert gb200.spec["recompute"] == "selective" and gb200.spec["recompute_modules"] == "layernorm,moe_act"
    gb300 = plan_row(row({**oss, "row_id": "gb300", "gpu": "GB300"}))
    assert "recompute_modules" not in gb300.spec and gb300.spec.get("recompute", "none") == "none"
    older = plan_row(row({**oss, "row_id": "older", "gpu": "GB200",
                          "source_section": "25.11 NeMo container / Pre-Training Performance"}))
    assert "recompute_modules" not in older.spec
    stated = plan_row(row({**oss, "row_id": "stated", "gpu": "GB200", "recompute": "full"}))
    assert stated.spec["recompute"] == "full" and "recompute_modules" not in stated.spec


def test_deepseek_v3_rows_take_the_recipes_pipeline_layout_and_mtp() -> None:
    """DeepSeek-V3 rows: the model card (latent attention, 3 dense layers, shared expert), the release's pipeline
    layout with its multi-token-prediction depth on the last virtual stage, the recipe's recompute; a row whose
    printed layout no code ran is refused before any run."""
    rows = {r.row_id: r for r in read_tables([str(p) for p in sorted(HOLD_OUT.glob("megatron_bridge*.tsv"))])}
    gb300 = plan_row(rows["mbridge_26.02_Pre-Training_DGX-GB300_DeepSeekV3_256_MXFP8_214"])
    assert gb300.status == READY, gb300.reason
    spec = gb300.spec
    assert spec["pipeline_layout"] == "Et*4|(t*4|)*14tmL" and spec["mtp_layers"] == 1
    assert spec["kv_lora_rank"] == 512 and spec["dense_layers"] == 3 and spec["shared_expert_ffn"] == 2048
    assert spec["recompute_modules"] == "mla_up_proj" and spec["moe_dispatcher"] == "flex"
    assert any(d.startswith("pipeline layout Et*4|(t*4|)*14tmL (Megatron-Bridge 26.02 recipe") for d in
               gb300.defaults_used)
    kimi = plan_row(rows["mbridge_26.04_Pre-Training_DGX-GB300_Kimi_K2_256_MXFP8_163"])
    assert kimi.status == READY and kimi.spec["mtp_layers"] == 0 and kimi.spec["num_experts"] == 384
    printed = plan_row(rows["mbridge_25.11_Pre-Training_DGX-GB300_DeepSeekV3_(w/o_MTP)_256_BF16_236"])
    assert printed.status == "unsupported" and printed.reason.startswith("the layout as printed does not run")


def test_a_recipe_that_turns_an_overlap_off_wins_over_the_framework_default() -> None:
    """Megatron-Bridge's H100 Qwen3 235B recipes set CommOverlapConfig(tp_comm_overlap=False): their TP2 rows run
    without the TP overlap the tool otherwise assumes; 25.09's DeepSeek-V3 on H100 also reduces its gradients after
    the backward (and so gathers no parameters early)."""
    rows = {r.row_id: r for r in read_tables([str(p) for p in sorted(HOLD_OUT.glob("megatron_bridge*.tsv"))])}
    qwen = plan_row(next(r for i, r in rows.items() if "26.02_" in i and "H100_Qwen3_235B" in i))
    assert qwen.status == READY, qwen.reason
    assert qwen.spec["tp"] == 2 and "tp_comm_overlap" not in qwen.spec and qwen.spec["overlap_grad_reduce"]
    assert any(d.startswith("no tp_comm_overlap (Megatron-Bridge 26.02 recipe") for d in qwen.defaults_used)
    deepseek = plan_row(next(r for i, r in rows.items() if "25.09_" in i and "H100_DeepSeekV3" in i))
    assert deepseek.status == READY, deepseek.reason
    assert deepseek.spec["overlap_grad_reduce"] is False  # after the whole backward
    assert not {"tp_comm_overlap", "overlap_param_gather"} & set(deepseek.spec)
    llama = plan_row(row({**BASE, "row_id": "llama", "TP": "2", "DP": "8"}))  # no recipe turns anything off
    assert llama.spec["tp_comm_overlap"] and llama.spec["overlap_param_gather"]


def test_nemotron_3_super_rows_take_the_latent_moe_and_their_16_bit_gemms() -> None:
    """Nemotron 3 Super: the card's latent MoE and two MTP depths; its NVFP4 recipe keeps the first layer, the last
    14 and the attention, latent and MTP GEMMs in BF16 (Megatron-Bridge's te_quant.cfg); MXFP8 keeps none."""
    rows = {r.row_id: r for r in read_tables([str(p) for p in sorted(HOLD_OUT.glob("megatron_bridge*.tsv"))])}
    nvfp4 = plan_row(rows["mbridge_26.08_Pre-Training_DGX-GB300_Nemotron_3_Super_64_NVFP4_13"])
    assert nvfp4.status == READY, nvfp4.reason
    spec = nvfp4.spec
    assert spec["moe_latent_size"] == 1024 and spec["mtp_layers"] == 2 and spec["precision"] == "fp4"
    assert (spec["bf16_layers_at_start"], spec["bf16_layers_at_end"]) == (1, 14)
    assert spec["bf16_gemms"] == "qkv,attn_out,latent,mtp" and spec["mxfp8_gemms"] == "mamba_out"
    assert any(d.startswith("the first 1 and last 14 layers and the qkv,attn_out,latent,mtp GEMMs in 16-bit") for d
               in nvfp4.defaults_used)
    mxfp8 = plan_row(rows["mbridge_26.08_Pre-Training_DGX-GB300_Nemotron_3_Super_64_MXFP8_12"])
    assert mxfp8.status == READY and not {"bf16_layers_at_start", "bf16_gemms"} & set(mxfp8.spec)


@pytest.mark.parametrize(("precision", "gathered_in_fp8"), [("FP8-CS", True), ("FP8", True), ("MXFP8", False),
                                                            ("NVFP4", False), ("BF16", False)])
def test_bridge_fp8_cs_runs_gather_their_parameters_in_fp8(precision: str, gathered_in_fp8: bool) -> None:
    """Megatron-Bridge's fp8_cs precision config sets fp8_param_gather (the distributed optimizer gathers FP8
    weights); its MXFP8 config gathers 16-bit values through the gradient buffer; a plain FP8 is fp8_cs there."""
    plan = plan_row(row({**BASE, "row_id": f"gather_{precision}", "precision": precision}))
    assert plan.status == READY, plan.reason
    assert plan.spec.get("fp8_param_gather", False) is gathered_in_fp8
    assert any(d.startswith("parameter all-gathers in FP8") for d in plan.defaults_used) is gathered_in_fp8


def test_fsdp_runs_offload_the_activations_their_recipes_name_and_then_fit() -> None:
    from compute.devices import device
    from workload.generated import llm_peak_memory

    rows = {r.row_id: r for r in read_tables([str(SHARED / "megatron_bridge_perf.tsv")])}
    for row_id, layers, gpu in (("mbridge_26.02.01_Pre-Training_DGX-GB200_LLAMA3_70B_64_FP8_169", 40, "GB200"),
                                ("mbridge_26.02.01_Pre-Training_DGX-GB300_LLAMA3_70B_64_FP8_168", 20, "GB300"),
                                ("mbridge_25.09_Pre-Training_DGX-GB200_LLAMA3.1_405B_128_p_263", 95, "GB200")):
        plan = plan_row(rows[row_id])
        assert plan.spec["activation_offload_layers"] == layers
        assert any("cpu_offloading_num_layers" in d for d in plan.defaults_used)
        need = llm_peak_memory(plan.spec, row_id).total_bytes
        assert need <= device(gpu).memory_bytes < llm_peak_memory(
            {**plan.spec, "activation_offload_layers": 0}, row_id).total_bytes
    # a pipelined layout of the same release offloads nothing (Megatron-Core offloads only without a pipeline)
    piped = plan_row(rows["mbridge_26.02.01_Pre-Training_DGX-GB200_LLAMA3_70B_64_MXFP8_167"])
    assert "activation_offload_layers" not in piped.spec
