"""Transformer Engine's fused grouped MLP (Megatron-Core's use_transformer_engine_op_fuser; --moe-fused-mlp) and FP8
attention (--fp8-attention), as the whole-iteration-graph MXFP8 MoE recipes of Megatron-Bridge 26.06+ run them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from simulator.tools.training_recipes import recipe_for
from tests.workload.test_llm import SMALL_MOE
from tests.workload.test_llm_step import traces
from workload.errors import InputError
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan

PLAN = ParallelPlan(dp=2, ep=2, num_micro_batches=2, recompute="selective", recompute_modules=("moe_act",))
MXFP8 = {"precision": "fp8", "fp8_recipe": "mxfp8"}


def expert_kernels(rank, phase: str) -> list[str]:
    prefix = f"mb1.{phase}.layer0."
    return [n.name[len(prefix):] for n in rank.compute() if n.name.startswith(prefix)
            and not n.attrs.get("is_cpu_op") and ("expert" in n.name or "activation" in n.name)]


def test_fused_grouped_mlp_runs_each_grouped_gemm_as_one_kernel_with_the_activation_inside(tmp_path: Path) -> None:
    """Unfused: a GEMM per local expert on four streams, the activation and the casts between the GEMMs as kernels of
    their own, each operand quantized expert by expert, the activation recomputed. Fused: one kernel per grouped GEMM,
    the activation and the second GEMM's input cast inside the first GEMM, the activation's backward and the first
    GEMM's gradient cast inside the second GEMM's input gradient, the other casts one kernel for all experts, and
    nothing separate to recompute."""
    unfused = traces(tmp_path / "u", SMALL_MOE, PLAN, **MXFP8)[0]
    fused = traces(tmp_path / "f", SMALL_MOE, PLAN, moe_fused_mlp=True, **MXFP8)[0]
    assert expert_kernels(unfused, "fwd") == ["expert_in_input_quantize", "expert_in", "activation",
                                              "expert_out_input_quantize", "expert_out"]
    assert expert_kernels(fused, "fwd") == ["expert_in_input_quantize", "expert_in", "expert_out"]
    assert expert_kernels(unfused, "bwd") == ["expert_out_grad_quantize", "expert_out_dgrad", "expert_out_wgrad",
                                              "activation", "expert_in_grad_quantize", "expert_in_dgrad",
                                              "expert_in_wgrad"]
    assert expert_kernels(fused, "bwd") == ["expert_out_grad_quantize", "expert_out_dgrad", "expert_out_wgrad",
                                            "expert_in_dgrad", "expert_in_wgrad"]
    assert [n for n in unfused.compute() if ".recompute." in n.name and "activation" in n.name]
    assert not [n for n in fused.compute() if ".recompute." in n.name]
    for rank, streams, launches in ((unfused, {4}, {2}), (fused, {0}, {1})):  # 2 local experts
        gemms = [n for n in rank.compute() if n.attrs.get("op_class") == "gemm" and ".expert_" in n.name]
        assert {n.attrs.get("gemm_streams", 0) for n in gemms} == streams
        assert {n.attrs["gemm_batch"] for n in gemms} == {2}
        casts = [n for n in rank.compute() if ".expert_" in n.name and n.name.endswith("_quantize")]
        assert {n.attrs.get("kernel_count", 1) for n in casts} == launches
    # the same GEMM work either way
    flops = [sum(n.attrs["num_ops"] for n in r.compute() if n.attrs.get("op_class") == "gemm") for r in (unfused,
                                                                                                        fused)]
    assert flops[0] == flops[1]


def test_fp8_attention_times_the_attention_kernels_in_fp8(tmp_path: Path) -> None:
    rank = traces(tmp_path, SMALL_MOE, replace(PLAN, recompute="none", recompute_modules=()), fp8_attention=True,
                  **MXFP8)[0]
    attention = [n for n in rank.compute() if n.attrs.get("op_class") == "attention"]
    assert attention and {n.attrs["dtype"] for n in attention} == {"fp8"}
    plain = traces(tmp_path / "p", SMALL_MOE, replace(PLAN, recompute="none", recompute_modules=()), **MXFP8)[0]
    assert {n.attrs["dtype"] for n in plain.compute() if n.attrs.get("op_class") == "attention"} == {"bf16"}


@pytest.mark.parametrize("options", [{"fp8_attention": True}, {"fp8_attention": True, "precision": "fp4"},
                                     {"fp8_attention": True, "precision": "fp8", "attention_backend": "unfused"}])
def test_fp8_attention_needs_fp8_and_the_fused_kernel(options: dict) -> None:
    with pytest.raises(InputError, match="fp8_attention needs precision fp8 and the fused attention kernel"):
        TrainingOptions(**options).validate(0, False, 1)


@pytest.mark.parametrize("release, model, gpu, fused, fp8_attention", [
    ("26.06", "Qwen3_30B_a3B", "GB300", True, True),
    ("26.06.01", "Qwen3_235B_a22B", "GB200", True, True),
    ("26.08", "DeepSeekV3", "GB300", True, True),
    ("26.06", "DeepSeekV3", "GB200", True, False),  # its recipe leaves fp8_dot_product_attention off
    ("26.04.01", "Qwen3_30B_a3B", "GB300", False, False),  # TE-scoped graphs, before the sync-free recipes
])
def test_recipes_name_the_fused_grouped_mlp_and_fp8_attention(release: str, model: str, gpu: str, fused: bool,
                                                              fp8_attention: bool) -> None:
    recipe = recipe_for("megatron_bridge_perf", f"{release} NeMo container / Pre-Training Performance", model, gpu,
                        "MXFP8")
    assert recipe is not None and (recipe.moe_fused_mlp, recipe.fp8_attention) == (fused, fp8_attention)
