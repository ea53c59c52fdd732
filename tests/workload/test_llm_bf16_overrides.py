"""GEMMs kept in 16-bit under FP8/FP4: the first and last layers (Megatron-Core's first_last_layers_bf16) and GEMM
groups by module (Transformer Engine's quantization recipes, Nemotron 3 Super's te_quant.cfg)."""

from __future__ import annotations

import re

import pytest

from workload.errors import InputError
from workload.llm.build import build_programs
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan

MODEL = ModelConfig(name="small", num_layers=4, hidden_size=256, num_heads=8, ffn_hidden_size=512, vocab_size=1024,
                    seq_len=256, gated_ffn=True, mtp_layers=1)
PLAN = ParallelPlan(dp=2, num_micro_batches=1)


def gemm_dtypes(options: TrainingOptions) -> dict[str, str]:
    """mb0's forward GEMMs by name -> their precision ("" = the model's 16-bit dtype)."""
    ops = build_programs(MODEL, PLAN, options)[0].ops
    return {op.name: op.kernel.shape.dtype for op in ops if op.name.startswith("mb0.fwd.") and op.kernel is not None
            and op.kernel.shape is not None and op.kernel.shape.gemm is not None}


def quantized_layers(options: TrainingOptions) -> set[str]:
    ops = build_programs(MODEL, PLAN, options)[0].ops
    return {m.group(1) for op in ops if (m := re.match(r"mb0\.fwd\.(layer\d+|mtp\d+)\.(?!mtp_proj).*_input", op.name))}


def test_the_first_and_last_layers_stay_16_bit() -> None:
    options = TrainingOptions(precision="fp8", bf16_layers_at_start=1, bf16_layers_at_end=2)
    dtypes = gemm_dtypes(options)
    assert {dtypes[f"mb0.fwd.layer{i}.mlp_in"] for i in (0, 2, 3)} == {"bf16"}
    assert dtypes["mb0.fwd.layer1.mlp_in"] == "fp8" and dtypes["mb0.fwd.layer1.qkv"] == "fp8"
    assert dtypes["mb0.fwd.mtp0.mlp_in"] == "fp8"  # the MTP depth is no decoder layer
    # no quantization kernels in the 16-bit layers
    assert quantized_layers(options) == {"layer1", "mtp0"}


def test_gemm_groups_stay_16_bit_in_every_layer() -> None:
    dtypes = gemm_dtypes(TrainingOptions(precision="fp8", bf16_gemms="qkv,attn_out"))
    for layer in range(4):
        assert dtypes[f"mb0.fwd.layer{layer}.qkv"] == dtypes[f"mb0.fwd.layer{layer}.attn_out"] == "bf16"
        assert dtypes[f"mb0.fwd.layer{layer}.mlp_in"] == "fp8"


def test_mtp_keeps_the_depths_and_their_projection_16_bit() -> None:
    dtypes = gemm_dtypes(TrainingOptions(precision="fp4", bf16_gemms="mtp"))
    assert dtypes["mb0.fwd.mtp0.mtp_proj"] == dtypes["mb0.fwd.mtp0.mlp_in"] == "bf16"
    assert dtypes["mb0.fwd.layer3.mlp_in"] == "fp4"


def test_the_16_bit_layers_take_longer_on_a_device_with_a_faster_low_precision() -> None:
    from compute.devices import device
    from compute.kernels import KernelModel

    model = KernelModel(device("B200"))

    def gemm_s(options: TrainingOptions) -> float:
        ops = build_programs(MODEL, PLAN, options)[0].ops
        kernels = [op.kernel for op in ops if op.kernel is not None and op.kernel.shape is not None]
        return sum(model.seconds(k.shape, k.flops, k.size_bytes) for k in kernels if k.shape.gemm is not None)

    fp8 = TrainingOptions(precision="fp8", fp8_recipe="mxfp8")
    assert gemm_s(TrainingOptions(precision="fp8", fp8_recipe="mxfp8", bf16_layers_at_end=2)) > gemm_s(fp8)


def test_without_low_precision_the_settings_change_nothing() -> None:
    plain = build_programs(MODEL, PLAN, TrainingOptions())[0].ops
    kept = build_programs(MODEL, PLAN, TrainingOptions(bf16_layers_at_start=2, bf16_gemms="qkv,mtp"))[0].ops
    assert [(op.name, op.kernel) for op in plain] == [(op.name, op.kernel) for op in kept]


@pytest.mark.parametrize(("change", "message"), [
    ({"bf16_gemms": "qkv,router"}, "unknown bf16_gemms group(s) router; valid: qkv, attn_out"),
    ({"bf16_layers_at_end": -1}, "bf16_layers_at_end must be a whole number of layers >= 0"),
])
def test_bad_settings_are_one_line_errors(change: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as e:
        TrainingOptions(precision="fp8", **change).validate(0, False, 1)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_mxfp8_gemms_of_an_nvfp4_step_take_mxfp8s_kernels() -> None:
    options = TrainingOptions(precision="fp4", mxfp8_gemms="attn_out")
    ops = build_programs(MODEL, PLAN, options)[0].ops
    by_name = {op.name: op for op in ops}
    assert by_name["mb0.fwd.layer0.attn_out"].kernel.shape.dtype == "mxfp8"  # timed at MXFP8's own efficiency
    assert by_name["mb0.fwd.layer0.qkv"].kernel.shape.dtype == "fp4"
    casts = {op.kernel.shape.dtype for op in ops if op.name.startswith("mb0.fwd.layer0.attn_out_input")}
    assert casts == {"fp8"}  # MXFP8's quantization kernels, not NVFP4's
    with pytest.raises(InputError, match="mxfp8_gemms runs GEMMs of an NVFP4 step in MXFP8: it needs precision fp4"):
        TrainingOptions(precision="fp8", mxfp8_gemms="mamba_out").validate(0, False, 1)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_16_bit_gemm_gathers_its_input_in_16_bits(overlap: bool) -> None:
    """Sequence parallelism in an FP8 step gathers GEMM inputs in FP8 (quantized first), but not a GEMM kept 16-bit."""
    plan = ParallelPlan(tp=2, dp=2, sequence_parallel=True, num_micro_batches=1)
    options = TrainingOptions(precision="fp8", bf16_gemms="qkv", tp_comm_overlap=overlap)
    ops = build_programs(MODEL, plan, options)[0].ops

    def gathered(block: str) -> set[int]:  # the all-gather, or the ring exchange's steps, before its first GEMM
        pre = f"mb0.fwd.layer0.{block}_{'ring' if overlap else 'allgather'}"
        return {op.size_bytes for op in ops if op.name.startswith(pre)}

    assert gathered("attn") and gathered("attn") == {2 * size for size in gathered("mlp")}  # 16-bit vs FP8
