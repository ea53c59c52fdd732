"""Latent mixture-of-experts (Megatron-Core's moe_latent_size, Nemotron 3 Super): the routed experts and the dispatcher
work at the latent width, between a projection down after the router and one up after the combine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from workload.errors import InputError
from workload.llm.build import build_programs
from workload.llm.host import HostModel
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan
from workload.llm.sizes import kind_tensors

LATENT = ModelConfig(name="latent", num_layers=2, hidden_size=512, num_heads=8, ffn_hidden_size=128,
                     vocab_size=1024, seq_len=256, num_experts=8, top_k=2, shared_expert_ffn=256,
                     moe_latent_size=128)


def ops_of(model: ModelConfig, plan: ParallelPlan, options: TrainingOptions | None = None) -> dict[str, object]:
    plan.validate(model)
    return {op.name: op for op in build_programs(model, plan, options or TrainingOptions())[0].ops}


def test_a_latent_layers_parameters() -> None:
    h, lat, f, e = 512, 128, 128, 8
    dense = replace(LATENT, moe_latent_size=0)
    # the experts shrink from h to the latent width; the two projections are added, held whole by each tp rank
    assert LATENT.kind_params("moe").expert == e * 2 * lat * f
    assert LATENT.kind_params("moe").dense - dense.kind_params("moe").dense == 2 * h * lat
    assert LATENT.kind_params("moe", tp=2).replicated - dense.kind_params("moe", tp=2).replicated == 2 * h * lat
    assert dense.total_params() - LATENT.total_params() == 2 * (e * 2 * (h - lat) * f - 2 * h * lat)
    # one token multiplies the projections and top_k experts at the latent width
    assert dense.matmul_params() - LATENT.matmul_params() == 2 * (2 * 2 * (h - lat) * f - 2 * h * lat)


@pytest.mark.parametrize("tp", [1, 2])
def test_gradient_tensors_add_up_to_the_layers_parameters(tp: int) -> None:
    plan = ParallelPlan(tp=tp, ep=2, dp=2, sequence_parallel=tp > 1)
    layer = LATENT.kind_params("moe", plan.tp, plan.ep, plan.expert_tp)
    tensors = kind_tensors(LATENT, plan, "moe")
    assert sum(n for buf, n in tensors.values() if buf == "dense") == layer.dense
    assert sum(n for buf, n in tensors.values() if buf == "expert") == layer.expert
    # backward order: the projection up is ready first, the projection down after the experts
    names = list(tensors)
    assert names.index("latent_up") < names.index("expert_out") < names.index("latent_down") < names.index("router")


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_the_experts_and_the_exchanges_run_at_the_latent_width(dispatcher: str) -> None:
    plan = ParallelPlan(ep=2, dp=2, num_micro_batches=1)
    options = TrainingOptions(moe_dispatcher=dispatcher)
    latent, full = ops_of(LATENT, plan, options), ops_of(replace(LATENT, moe_latent_size=0), plan, options)
    pre = "mb0.fwd.layer0."
    for name in ("dispatch_alltoall", "combine_alltoall"):
        assert latent[pre + name].size_bytes * 4 == pytest.approx(full[pre + name].size_bytes, abs=4)  # 128 of 512
    assert latent[pre + "expert_in"].kernel.shape.gemm.k == 128 and full[pre + "expert_in"].kernel.shape.gemm.k == 512
    assert latent[pre + "expert_out"].kernel.shape.gemm.n == 128
    # the projections are full-width GEMMs on the rank's tokens, absent without a latent
    tokens = plan.micro_batch_size * LATENT.seq_len
    down, up = latent[pre + "latent_down"].kernel.shape.gemm, latent[pre + "latent_up"].kernel.shape.gemm
    assert (down.m, down.k, down.n) == (tokens, 512, 128) and (up.m, up.k, up.n) == (tokens, 128, 512)
    assert not any("latent" in name for name in full)


def test_the_projections_sit_between_the_router_and_the_exchanges() -> None:
    ops = build_programs(LATENT, ParallelPlan(ep=2, dp=2, num_micro_batches=1), TrainingOptions())[0].ops
    names = [op.name for op in ops]
    pre, back = "mb0.fwd.layer1.", "mb0.bwd.layer1."
    order = [names.index(pre + n) for n in ("router", "latent_down", "dispatch_alltoall", "expert_in",
                                            "combine_alltoall", "latent_up")]
    assert order == sorted(order)
    order = [names.index(back + n) for n in ("latent_up_dgrad", "combine_grad_alltoall", "expert_in_dgrad",
                                             "dispatch_grad_alltoall", "latent_down_dgrad", "router_dgrad")]
    assert order == sorted(order)


def test_the_host_issues_the_projections_as_te_modules_unless_graphed() -> None:
    """fc1_latent_proj runs in the dispatcher's preprocessing (Megatron-Core's moe_preprocess graph scope, forward and
    backward), fc2_latent_proj in the expert section after the combine."""
    host = HostModel()
    for backward in (False, True):
        assert host.routing(backward, latent=True) > host.routing(backward)
        assert host.experts(8, backward, latent=True) > host.experts(8, backward)
    graphed = HostModel(graph_scopes=frozenset({"moe_router", "moe_preprocess"}))
    assert graphed.routing(False, latent=True) == graphed.routing(False)  # one graph launch either way


def test_fp8_quantizes_the_projections_like_any_layer_gemm() -> None:
    plan = ParallelPlan(ep=2, dp=2, num_micro_batches=1)
    ops = ops_of(LATENT, plan, TrainingOptions(precision="fp8"))
    assert ops["mb0.fwd.layer0.latent_down"].kernel.shape.dtype == "fp8"
    assert any(name.startswith("mb0.fwd.layer0.latent_down_input") for name in ops)
    assert any(name.startswith("mb0.bwd.layer0.latent_up_grad") for name in ops)


@pytest.mark.parametrize(("change", "message"), [
    ({"moe_latent_size": -1}, "moe_latent_size must be a whole number >= 0"),
    ({"num_experts": 1, "top_k": 1, "shared_expert_ffn": 0}, "moe_latent_size 128 describes the routed experts"),
])
def test_bad_latent_models_are_one_line_errors(change: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as e:
        replace(LATENT, **change).validate()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_super_preset_has_its_published_parameters() -> None:
    from workload.llm.presets import preset

    super_ = preset("nemotron-3-super")
    assert [super_.layer_pattern.count(s) for s in "M*E-"] == [40, 8, 40, 0]
    assert super_.total_params() == pytest.approx(120.6e9, rel=0.002)
    assert super_.active_params() == pytest.approx(12.7e9, rel=0.01)
    # with its one multi-token-prediction block (attention and latent MoE, the 2h -> h projection, three norms): the
    # published checkpoint's 123,611,033,088 elements less the routers' expert biases (41 x 512, load-balancing
    # state updated outside the optimizer, no gradient to synchronise)
    mtp = replace(super_, mtp_layers=1)
    assert mtp.total_params() == 123_611_033_088 - 41 * 512
    # as Megatron-Bridge trains it: two depths running that one block (mtp_use_repeated_layer)
    assert replace(super_, mtp_layers=2, mtp_repeated_layer=True).total_params() == mtp.total_params()
