"""Megatron-Core's unfused pieces around the experts' fused kernels (TEGroupedMLP), as GPT-OSS runs them: the clamped
GLU's clamp and the blocking copy of its linear offset, and the experts' second-layer biases scaled by the routing
probabilities."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.tools.training_recipes import recipe_for
from tests.workload.test_llm import SMALL_MOE
from tests.workload.test_llm_host import MOE_SPEC
from tests.workload.test_llm_step import finish, traces
from workload.errors import InputError
from workload.llm import cli, costs, host
from workload.llm.host import HostModel
from workload.llm.model import model_from_dict
from workload.llm.plan import ParallelPlan

CLAMPED = replace(SMALL_MOE, name="clamped", clamped_glu=True)
BIASED = replace(SMALL_MOE, name="biased", bias=True)
PLAN = ParallelPlan(dp=2, ep=2, num_micro_batches=2)


def kernels(rank, suffix: str) -> list:
    return [n for n in rank.compute() if n.name.endswith(suffix) and not n.attrs.get("is_cpu_op")]


def test_the_clamp_runs_before_the_activation_and_after_its_gradient(tmp_path: Path) -> None:
    """Forward: fc1, the clamp (4 passes over fc1's output), the activation; backward: the activation's gradient,
    then the clamp's (3 passes). Selective moe_act recompute repeats the clamp with the activation."""
    rank = traces(tmp_path, CLAMPED, replace(PLAN, recompute="selective", recompute_modules=("moe_act",)))[0]
    order = [n.name.rsplit(".", 1)[-1] for n in rank.compute() if n.name.startswith("mb0.fwd.layer0.")
             and not n.attrs.get("is_cpu_op")]
    assert order.index("expert_in") + 1 == order.index("activation_clamp") == order.index("activation") - 1
    local_tokens = 64 * SMALL_MOE.top_k  # one micro-batch of 64 tokens, top-2
    elements = local_tokens * 2 * SMALL_MOE.ffn_hidden_size  # fc1's gated output
    forward = kernels(rank, "fwd.layer0.activation_clamp")
    assert {n.attrs["tensor_size"] for n in forward} == {elements * costs.CLAMP_PASSES[0] * 2}
    backward = kernels(rank, "bwd.layer0.activation_clamp")
    assert {n.attrs["tensor_size"] for n in backward} == {elements * costs.CLAMP_PASSES[1] * 2}
    bwd = [n.name.rsplit(".", 1)[-1] for n in rank.compute() if n.name.startswith("mb0.bwd.layer0.")]
    assert bwd.index("activation") + 1 == bwd.index("activation_clamp") == bwd.index("expert_in_dgrad") - 1
    recomputed = [n.name for n in rank.compute() if ".recompute." in n.name]
    assert sum(n.endswith(".activation_clamp") for n in recomputed) == SMALL_MOE.num_layers * 2
    plain = traces(tmp_path / "plain", SMALL_MOE, PLAN)[0]
    assert not [n for n in plain.nodes if "clamp" in n.name or "expert_bias" in n.name]


@pytest.mark.parametrize("recompute", [(), ("moe_act",)])
def test_the_offset_copy_makes_the_host_wait_for_the_gpu(tmp_path: Path, recompute: tuple[str, ...]) -> None:
    """With the host model each activation (and its recompute) follows a host node that waits for the clamp, the
    GPU's last queued kernel, and lasts the copy's round trip; the activation waits for it. Without the host model
    there is no host node."""
    plan = replace(PLAN, recompute="selective" if recompute else "none", recompute_modules=recompute)
    rank = traces(tmp_path, CLAMPED, plan, host_cpu="x86")[0]
    copies = [n for n in rank.nodes if n.name.endswith(".activation_offset_copy")]
    assert len(copies) == SMALL_MOE.num_layers * 2 * (2 if recompute else 1)
    by_id = {n.id: n for n in rank.nodes}
    for copy in copies:
        assert copy.attrs.get("is_cpu_op") and copy.duration_us == HostModel().copy_wait()
        assert any(by_id[d].name == copy.name.replace("activation_offset_copy", "activation_clamp")
                   for d in copy.deps)
        waiting = [n for n in rank.nodes if copy.id in n.deps and not n.attrs.get("is_cpu_op")]
        assert [n.name for n in waiting] == [copy.name.replace("activation_offset_copy", "activation")]
    assert not [n for n in traces(tmp_path / "gpu", CLAMPED, plan)[0].nodes if n.attrs.get("is_cpu_op")]


def test_scaled_expert_biases_follow_the_second_gemm(tmp_path: Path) -> None:
    """A MoE model with biases: the second layer's bias, scaled by the probabilities, after fc2 (5 passes over its
    output) and first in the experts' backward (6 passes)."""
    rank = traces(tmp_path, BIASED, PLAN)[0]
    elements = 64 * SMALL_MOE.top_k * SMALL_MOE.hidden_size
    fwd = [n.name.rsplit(".", 1)[-1] for n in rank.compute() if n.name.startswith("mb0.fwd.layer0.")]
    assert fwd.index("expert_out") + 1 == fwd.index("expert_bias")
    assert {n.attrs["tensor_size"] for n in kernels(rank, "fwd.layer0.expert_bias")} == \
        {elements * costs.SCALED_BIAS_PASSES[0] * 2}
    bwd = [n.name.rsplit(".", 1)[-1] for n in rank.compute() if n.name.startswith("mb0.bwd.layer0.")]
    assert bwd.index("expert_bias") + 1 == bwd.index("expert_out_dgrad")
    assert {n.attrs["tensor_size"] for n in kernels(rank, "bwd.layer0.expert_bias")} == \
        {elements * costs.SCALED_BIAS_PASSES[1] * 2}


def test_host_calls_of_the_extras() -> None:
    """The clamp's 4 calls, the scaled biases' 5 plus 2 per local expert, twice as long backward."""
    c, e = host.CALL_SCALE, host.EXPERT_SCALE
    m = HostModel()
    assert m.experts(16, False, True, False) == round(c * (2 * 36 + (8 + 4) * 7) + e * 2 * 16 * 10)
    assert m.experts(16, True, False, True) == round(c * 2 * (2 * 36 + (8 + 5 + 2 * 16) * 7) + e * 2 * 16 * 27)
    assert m.copy_wait() == round(c * (30 + 7))
    assert m.experts(4, False) < m.experts(4, False, True, True) < m.experts(5, False, True, True)


@pytest.mark.parametrize("extra", [{"clamped_glu": True}, {"bias": True}])
def test_the_extras_never_shorten_the_step(tmp_path: Path, extra: dict) -> None:
    spec = {**MOE_SPEC, "num_experts": 4, "host_cpu": "x86"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert finish(tmp_path / "a", spec, 2, 100.0) < finish(tmp_path / "b", {**spec, **extra}, 2, 100.0)


def test_clamped_glu_needs_gated_experts() -> None:
    base = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 64, "vocab_size": 100,
            "seq_len": 16, "clamped_glu": True}
    with pytest.raises(InputError, match="clamped_glu describes the experts' gated activation"):
        model_from_dict({**base, "gated_ffn": True}, "m.yaml")
    with pytest.raises(InputError, match="clamped_glu describes the experts' gated activation"):
        model_from_dict({**base, "num_experts": 4, "top_k": 2}, "m.yaml")
    assert model_from_dict({**base, "num_experts": 4, "top_k": 2, "gated_ffn": True}, "m.yaml").clamped_glu
    with pytest.raises(InputError, match="clamped_glu must be true or false"):
        model_from_dict({**base, "clamped_glu": 1}, "m.yaml")


def test_transformer_engines_fused_mlp_runs_them_inside_its_kernels(tmp_path: Path) -> None:
    """--moe-fused-mlp (Megatron-Core's op fuser): no clamp, scaled-bias or copy nodes of their own; the CLI flag
    and the recipes' key reach the option."""
    both = replace(CLAMPED, bias=True)
    rank = traces(tmp_path, both, PLAN, host_cpu="x86", moe_fused_mlp=True)[0]
    assert not [n for n in rank.nodes if "clamp" in n.name or "expert_bias" in n.name or "offset_copy" in n.name]
    assert [n for n in traces(tmp_path / "u", both, PLAN)[0].nodes if n.name.endswith(".expert_bias")]
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["--preset", "gpt3-125m", "--moe-fused-mlp"])
    assert cli.options_from_args(args, cli.plan_from_args(args)).moe_fused_mlp
    recipe = recipe_for("megatron_bridge_perf", "26.08 NeMo container / Pre-Training Performance", "GPT OSS 120B",
                        "GB300", "MXFP8")
    assert recipe is not None and recipe.moe_fused_mlp
    newer = recipe_for("megatron_bridge_perf", "26.06 NeMo container / Pre-Training Performance", "GPT OSS 120B",
                       "GB300", "MXFP8")  # its perf scripts' cutedsl_fused_grouped_mlp
    assert newer is not None and newer.moe_fused_mlp and newer.fp8_attention
    older = recipe_for("megatron_bridge_perf", "26.04.01 NeMo container / Pre-Training Performance", "GPT OSS 120B",
                       "GB300", "BF16")
    assert older is not None and not older.moe_fused_mlp and not older.fp8_attention
