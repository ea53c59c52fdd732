"""Low-precision GEMMs as Transformer Engine runs them: the quantization kernels of each operand per recipe, the
weight's cast once per iteration, FP4 (NVFP4) GEMMs, and the recipe a published row's precision names."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compute.devices import device
from compute.kernels import KernelModel
from compute.shapes import GemmShape, OpShape
from tests.workload.test_llm import SMALL, SMALL_MOE
from tests.workload.test_llm_step import traces
from workload.errors import InputError
from workload.llm import quantize
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan

GEMMS = ("qkv", "attn_out", "mlp_in", "mlp_out")
TOKENS = 2 * SMALL.seq_len  # micro-batch 2


def casts(t: object, micro_batch: int, phase: str) -> list:
    return [n for n in t.compute() if n.name.startswith(f"mb{micro_batch}.{phase}.")  # type: ignore[attr-defined]
            and n.attrs.get("op_class") == "quantize"]


def test_bf16_traces_have_no_quantization(tmp_path: Path) -> None:
    plan = ParallelPlan(dp=2, micro_batch_size=2, num_micro_batches=2)
    assert not any(n.attrs.get("op_class") == "quantize" for n in traces(tmp_path, SMALL, plan)[0].compute())


@pytest.mark.parametrize(("recipe", "passes"), [("delayed", 1), ("tensorwise", 2), ("mxfp8", 1)])
def test_fp8_recipes_quantize_every_operand(tmp_path: Path, recipe: str, passes: int) -> None:
    """Per layer and micro-batch: each GEMM's input (forward) and output gradient (backward); the weights only in
    the first micro-batch's forward; nothing for the output layer."""
    plan = ParallelPlan(dp=2, micro_batch_size=2, num_micro_batches=2)
    t = traces(tmp_path, SMALL, plan, precision="fp8", fp8_recipe=recipe)[0]
    layers, h, f = SMALL.num_layers, SMALL.hidden_size, SMALL.ffn_hidden_size
    first, later = casts(t, 0, "fwd"), casts(t, 1, "fwd")
    assert len(later) == layers * len(GEMMS) * passes  # inputs only
    assert len(first) == 2 * len(later)  # inputs and weights
    assert len(casts(t, 1, "bwd")) == layers * len(GEMMS) * passes
    assert not any("lm_head" in n.name for n in first)
    x = TOKENS * (3 * h + f)  # the inputs of qkv, attn_out, mlp_in (all h wide) and mlp_out (f wide)
    per_element = sum(p.read + p.written for p in quantize.PASSES[recipe])
    assert sum(n.attrs["tensor_size"] for n in later) == pytest.approx(layers * x * per_element, rel=1e-3)
    gemms = [n for n in t.compute() if n.attrs.get("op_class") == "gemm" and "lm_head" not in n.name]
    assert {n.attrs["dtype"] for n in gemms} == {"mxfp8" if recipe == "mxfp8" else "fp8"}  # block-scaled: its own


def test_nvfp4_gemms_and_their_kernels(tmp_path: Path) -> None:
    plan = ParallelPlan(dp=2, micro_batch_size=2, num_micro_batches=2)
    t = traces(tmp_path, SMALL, plan, precision="fp4")[0]
    gemms = [n for n in t.compute() if n.attrs.get("op_class") == "gemm"]
    assert {n.attrs["dtype"] for n in gemms if "lm_head" not in n.name} == {"fp4"}
    assert {n.attrs["dtype"] for n in gemms if "lm_head" in n.name} == {"bf16"}
    labels = {n.name.rsplit("_", 1)[1] for n in casts(t, 1, "bwd")}
    assert labels == {"amax", "quantize"}


def test_moe_expert_gemms_are_quantized_too(tmp_path: Path) -> None:
    plan = ParallelPlan(dp=2, ep=2, micro_batch_size=2, num_micro_batches=1)
    t = traces(tmp_path, SMALL_MOE, plan, precision="fp8", fp8_recipe="mxfp8")[0]
    names = {n.name.split(".")[-1] for n in casts(t, 0, "fwd") + casts(t, 0, "bwd")}
    assert {"expert_in_input_quantize", "expert_out_weight_quantize", "expert_out_grad_quantize"} <= names
    assert not any(n.startswith("router") for n in names)


@pytest.mark.parametrize(("recipe", "activations"), [("mxfp8", 4), ("tensorwise", 4), ("delayed", 1)])
def test_grouped_gemm_operands_are_quantized_expert_by_expert(tmp_path: Path, recipe: str, activations: int) -> None:
    """Transformer Engine's split_quantize runs a recipe's kernels once per local expert (delayed scaling: one fused
    multi-tensor cast-transpose); the weights are separate tensors, one kernel each under every recipe. The bytes
    stay the whole operand's; each extra kernel adds a launch."""
    model = replace(SMALL_MOE, num_experts=8)
    plan = ParallelPlan(dp=2, ep=2, micro_batch_size=2, num_micro_batches=1)
    t = traces(tmp_path, model, plan, precision="fp8", fp8_recipe=recipe)[0]
    counts = {n.name.split(".")[-1]: n.attrs.get("kernel_count", 1) for n in casts(t, 0, "fwd") + casts(t, 0, "bwd")}
    assert {v for k, v in counts.items() if k.startswith(("expert_in_input", "expert_out_grad"))
            and not k.endswith("_amax")} == {activations}
    # current scaling: the amax and the scale computed from it, two kernels per expert
    assert {v for k, v in counts.items() if k.endswith("_input_amax")} <= {2, 2 * activations}
    assert {v for k, v in counts.items() if k.startswith("expert_in_weight") and not k.endswith("_amax")} == {4}
    assert {v for k, v in counts.items() if k.startswith("qkv_") and not k.endswith("_amax")} == {1}  # dense: one
    h100 = KernelModel(device("H100"))
    one, four = (h100.seconds(OpShape("quantize", "fp8", kernels=k), 0, 1 << 24) for k in (1, 4))
    launch_us, _ = h100.params.memory.of("quantize")
    assert four - one == pytest.approx(3 * (launch_us + h100.params.launch_overhead_us) * 1e-6)


def test_bad_recipe_is_one_line() -> None:
    with pytest.raises(InputError, match="fp8_recipe must be one of delayed, tensorwise, mxfp8"):
        TrainingOptions(precision="fp8", fp8_recipe="blockwise").validate(0, False, 1)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["B200", "B300", "GB200", "GB300"]), st.integers(128, 16384), st.integers(128, 16384),
       st.integers(128, 16384))
def test_fp4_gemms_are_faster_than_fp8_where_the_device_has_fp4(name: str, m: int, n: int, k: int) -> None:
    model = KernelModel(device(name))
    fp8 = model.seconds(OpShape("gemm", "fp8", gemm=GemmShape(m, n, k)), 0, 0)
    assert model.seconds(OpShape("gemm", "fp4", gemm=GemmShape(m, n, k)), 0, 0) <= fp8
    eff = model.efficiency(OpShape("gemm", "fp4", gemm=GemmShape(m, n, k)), 0, 0)
    assert 0 < eff <= 1


def test_quantization_time_grows_with_the_tensor() -> None:
    model = KernelModel(device("H100"))
    small, big = (quantize.operand_kernels("x", e, "tensorwise") for e in (1 << 20, 1 << 24))
    assert sum(model.seconds(k.shape, k.flops, k.size_bytes) for k in small) < \
        sum(model.seconds(k.shape, k.flops, k.size_bytes) for k in big)
