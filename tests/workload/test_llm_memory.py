"""The device-memory estimate of a generated iteration (workload/llm/memory.py): Korthikanti et al.'s activation
counts, what each parallelism, recompute and ZeRO stage saves, and the schedules' forward passes in flight."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.workload.test_llm import SMALL, SMALL_GPT, SMALL_MOE
from workload.llm.memory import ADAM_STATE_BYTES, RUNTIME_BYTES, peak_memory, stage_memory
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan

GPT = replace(SMALL_GPT, vocab_size=1024, seq_len=128)  # multi-head attention, GELU MLP, layernorm


def activations(model: ModelConfig, plan: ParallelPlan, options: TrainingOptions | None = None) -> int:
    return stage_memory(model, plan, options or TrainingOptions())[0].activations_bytes


def per_layer(plan: ParallelPlan, options: TrainingOptions | None = None, model: ModelConfig = GPT) -> int:
    """What one more layer adds to the first stage's activations."""
    deeper = replace(model, num_layers=model.num_layers + plan.pp)
    return activations(deeper, plan, options) - activations(model, plan, options)


def test_a_dense_layer_keeps_korthikantis_tensors() -> None:
    # Korthikanti et al. (2023), eq. 2 with sequence parallelism: 34 s b h / t bytes per layer, of which the two
    # dropout masks (2 s b h / t) are not kept here; a fused attention keeps no s x s scores, only its softmax
    # statistics (fp32, one per head and token)
    s, b, h, heads, t = GPT.seq_len, 2, GPT.hidden_size, GPT.num_heads, 4
    plan = ParallelPlan(tp=t, sequence_parallel=True, micro_batch_size=b)
    assert per_layer(plan) == s * b * (32 * h + 4 * heads) // t
    # without sequence parallelism the norms' inputs and outputs are whole on every rank: 8 s b h + 24 s b h / t
    plain = ParallelPlan(tp=t, micro_batch_size=b)
    assert per_layer(plain) == s * b * (8 * h + 24 * h // t + 4 * heads // t)


def test_the_unfused_attention_keeps_its_softmax_unless_recomputed() -> None:
    s, b, heads = GPT.seq_len, 1, GPT.num_heads
    plan = ParallelPlan()
    unfused = TrainingOptions(attention_backend="unfused")
    assert per_layer(plan, unfused) - per_layer(plan) == s * b * heads * s * 2  # Korthikanti's 2 a s^2 b, bf16
    selective = replace(plan, recompute="selective")
    assert per_layer(selective, unfused) == per_layer(plan)


def test_full_recompute_keeps_each_layers_input_and_one_layer_whole() -> None:
    s, b, h = GPT.seq_len, 1, GPT.hidden_size
    plan = ParallelPlan(recompute="full")
    assert per_layer(plan) == 2 * s * b * h
    whole_layer = per_layer(ParallelPlan())
    deep = replace(GPT, num_layers=8)
    assert activations(deep, plan) - activations(deep, replace(plan, recompute="none")) == \
        8 * 2 * s * b * h + whole_layer - 8 * whole_layer


def test_fp8_gemms_keep_their_inputs_quantized() -> None:
    s, b, h = GPT.seq_len, 1, GPT.hidden_size
    saved = per_layer(ParallelPlan()) - per_layer(ParallelPlan(), TrainingOptions(precision="fp8"))
    # four GEMM inputs a layer (QKV, projection, the MLP's two) at one byte instead of two
    assert saved == s * b * (h + h + h + 4 * h)


def test_one_f_one_b_holds_pp_minus_stage_micro_batches() -> None:
    plan = ParallelPlan(pp=4, num_micro_batches=8)
    held = [m.in_flight for m in stage_memory(SMALL, plan, TrainingOptions())]
    assert held == [4, 3, 2, 1]
    few = [m.in_flight for m in stage_memory(SMALL, replace(plan, num_micro_batches=2), TrainingOptions())]
    assert few == [2, 2, 2, 1]


def test_the_interleaved_schedule_holds_its_warm_up_chunks() -> None:
    model = replace(SMALL, num_layers=16)
    pp, vp = 4, 2
    plan = ParallelPlan(pp=pp, vp=vp, num_micro_batches=8)
    first = stage_memory(model, plan, TrainingOptions())[0]
    assert first.in_flight == (pp - 1) * 2 + (vp - 1) * pp + 1  # Megatron's warm-up forwards and one more
    # each chunk holds half the stage's layers: (pp - 1) * 2 + (vp - 1) * pp + 1 = 11 halves, Korthikanti's
    # pp * (1 + (pp - 1) / (pp * vp)) = 5.5 micro-batches of the whole stage
    whole = stage_memory(model, replace(plan, vp=1), TrainingOptions())[0]
    layer_bytes = per_layer(replace(plan, vp=1), model=model)
    assert first.activations_bytes - whole.activations_bytes == (11 * 2 - 4 * 4) * layer_bytes // pp


def test_zero_stages_shard_optimizer_then_gradients_then_weights() -> None:
    dp = 8
    stages = [peak_memory(SMALL, ParallelPlan(dp=dp, zero_stage=z), TrainingOptions()) for z in range(4)]
    params = SMALL.total_params()
    assert stages[0].optimizer_bytes == ADAM_STATE_BYTES * params
    assert stages[1].optimizer_bytes == ADAM_STATE_BYTES * params // dp
    assert stages[1].grads_bytes == stages[0].grads_bytes == 2 * params
    assert stages[2].grads_bytes == 2 * params // dp
    assert stages[3].weights_bytes < stages[2].weights_bytes == 2 * params
    totals = [m.total_bytes for m in stages]
    assert totals == sorted(totals, reverse=True)


def test_gradients_reduced_in_fp32_take_four_bytes() -> None:
    plan = ParallelPlan()
    fp32 = peak_memory(SMALL, plan, TrainingOptions(grad_reduce_in_fp32=True))
    assert fp32.grads_bytes == 4 * SMALL.total_params()
    assert fp32.runtime_bytes == RUNTIME_BYTES


def test_experts_are_held_by_their_expert_parallel_ranks() -> None:
    one = peak_memory(SMALL_MOE, ParallelPlan(dp=4), TrainingOptions())
    split = peak_memory(SMALL_MOE, ParallelPlan(dp=4, ep=4), TrainingOptions())
    experts = SMALL_MOE.num_layers * SMALL_MOE.layer_params().expert
    assert one.weights_bytes - split.weights_bytes == 2 * (experts - experts // 4)


@settings(max_examples=40, deadline=None)
@given(mbs=st.integers(1, 4), tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]),
       recompute=st.sampled_from(["none", "selective", "full"]), sp=st.booleans(), moe=st.booleans())
def test_memory_grows_with_the_micro_batch_and_shrinks_with_model_parallelism(mbs: int, tp: int, pp: int,
                                                                              recompute: str, sp: bool,
                                                                              moe: bool) -> None:
    model = SMALL_MOE if moe else SMALL
    plan = ParallelPlan(tp=tp, pp=pp, micro_batch_size=mbs, num_micro_batches=8, recompute=recompute,
                        sequence_parallel=sp and tp > 1)
    options = TrainingOptions()
    need = peak_memory(model, plan, options).total_bytes
    assert peak_memory(model, replace(plan, micro_batch_size=mbs + 1), options).total_bytes > need
    if recompute == "none":
        assert peak_memory(model, replace(plan, recompute="full"), options).total_bytes <= need
    if tp > 1 and not plan.sequence_parallel:
        assert peak_memory(model, replace(plan, sequence_parallel=True), options).total_bytes <= need
    assert peak_memory(model, replace(plan, tp=tp * 2, sequence_parallel=plan.sequence_parallel), options
                       ).total_bytes <= need


def test_offloaded_layers_leave_one_layer_on_the_device() -> None:
    model = replace(SMALL, num_layers=8)
    plan = ParallelPlan()
    kept = stage_memory(model, plan, TrainingOptions())[0].activations_bytes
    layer = per_layer(plan, model=model)
    offloaded = stage_memory(model, plan, TrainingOptions(activation_offload_layers=5))[0].activations_bytes
    assert kept - offloaded == 4 * layer  # five layers on the host, one of them back on the device at a time


def test_activation_offloading_is_megatrons_pp1_only_and_not_in_the_traces() -> None:
    from workload.errors import InputError
    from workload.generated import llm_peak_memory, llm_programs

    spec = {"generate": "llm", "num_layers": 4, "hidden_size": 256, "num_heads": 8, "ffn_hidden_size": 512,
            "vocab_size": 1000, "seq_len": 64, "dp": 2, "global_batch": 4}
    with pytest.raises(InputError, match="needs --pp 1"):
        llm_peak_memory(spec | {"pp": 2, "dp": 1, "activation_offload_layers": 2}, "t")
    with pytest.raises(InputError, match="needs --pp 1"):  # the options' own check, not only the CLI's
        TrainingOptions(activation_offload_layers=2).validate(0, False, 1, pp=2)
    with pytest.raises(InputError, match="activation_offload_layers must be a whole number"):
        llm_peak_memory(spec | {"activation_offload_layers": -1}, "t")
    plain, offloaded = (llm_programs(spec | extra, "t")[2] for extra in ({}, {"activation_offload_layers": 2}))
    assert [[(op.name, op.size_bytes) for op in p.ops] for p in plain] == \
        [[(op.name, op.size_bytes) for op in p.ops] for p in offloaded]
    assert llm_peak_memory(spec | {"activation_offload_layers": 2}, "t").total_bytes < \
        llm_peak_memory(spec, "t").total_bytes
