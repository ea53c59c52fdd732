"""Every weight gradient the generator writes is added into the weight's main gradient (Megatron's gradient
accumulation fusion): its GEMM carries the buffer's width, fp32 with ``grad_reduce_in_fp32``, else the model's
dtype; no other GEMM does (forward, input gradient)."""

from __future__ import annotations

import pytest

from workload.llm.build import build_programs
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan

MOE = ModelConfig(name="moe", num_layers=2, hidden_size=256, num_heads=8, ffn_hidden_size=128, vocab_size=1024,
                  seq_len=256, num_experts=8, top_k=2, shared_expert_ffn=256, dense_layers=1)
HYBRID = ModelConfig(name="hybrid", num_layers=3, hidden_size=256, num_heads=8, ffn_hidden_size=512, vocab_size=1024,
                     seq_len=256, layer_pattern="M*-", mamba_heads=8, mamba_head_dim=32, mamba_state_dim=16,
                     mamba_groups=1)


def accumulated(model: ModelConfig, plan: ParallelPlan, options: TrainingOptions) -> dict[str, int]:
    """mb0's GEMMs by name (layer numbers dropped) -> the width they add their result into (0: written once)."""
    plan.validate(model)
    out: dict[str, int] = {}
    for op in build_programs(model, plan, options)[0].ops:
        shape = op.kernel.shape if op.kernel is not None else None
        if op.name.startswith("mb0.") and shape is not None and shape.gemm is not None:
            out[op.name.split(".")[-1]] = shape.gemm.accumulate_bytes
    return out


@pytest.mark.parametrize(("fp32", "width"), [(True, 4), (False, 2)])
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_weight_gradients_add_into_the_main_gradient(fp32: bool, width: int, precision: str) -> None:
    gemms = accumulated(MOE, ParallelPlan(ep=2, dp=2, num_micro_batches=2),
                        TrainingOptions(grad_reduce_in_fp32=fp32, precision=precision))
    weights = {name for name in gemms if name.endswith("_wgrad")}
    assert {"qkv_wgrad", "attn_out_wgrad", "mlp_in_wgrad", "expert_in_wgrad", "expert_out_wgrad", "shared_in_wgrad",
            "router_wgrad", "lm_head_wgrad"} <= weights
    assert {gemms[name] for name in weights} == {width}
    assert {v for name, v in gemms.items() if name not in weights} == {0}


def test_a_mamba_mixers_projections_add_into_their_main_gradients() -> None:
    gemms = accumulated(HYBRID, ParallelPlan(dp=2, num_micro_batches=1), TrainingOptions())
    assert gemms["mamba_in_wgrad"] == gemms["mamba_out_wgrad"] == 2
