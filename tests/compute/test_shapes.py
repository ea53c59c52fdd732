"""The trace contract of the kernel compute model: the generator's kernels carry their operator shapes, and the
attributes written for them read back to the same shapes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compute.shapes import (
    SHAPE_BOOL_ATTRIBUTES,
    SHAPE_INT_ATTRIBUTES,
    AttentionShape,
    GemmShape,
    OpShape,
    shape_from_attributes,
)
from workload.llm import costs


@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 4096))
def test_matmul_passes_are_gemms_of_the_matmul_flops(tokens: int, k: int, n: int) -> None:
    mm = costs.Matmul("w", tokens, k, n, 2)
    for kernel in (mm.forward(), mm.dgrad(), mm.wgrad()):
        assert kernel.shape is not None and kernel.shape.gemm is not None
        assert kernel.shape.gemm.flops == kernel.flops == 2 * tokens * k * n
        assert kernel.shape.dtype == "bf16"
    assert mm.wgrad().shape.gemm == GemmShape(k, n, tokens)  # reduces over the tokens


def test_grouped_matmul_is_a_batched_gemm_over_the_experts() -> None:
    kernel = costs.Matmul("expert_in", 1024, 64, 128, 2, weights=4, dtype="fp8").forward()
    assert kernel.shape == OpShape("gemm", "fp8", gemm=GemmShape(256, 128, 64, 4))


def test_only_the_weight_gradient_adds_into_the_main_gradient() -> None:
    """Megatron's gradient accumulation fusion: the weight gradient is added into the weight's main gradient (read
    and written at its width); the forward and input gradient write their results once."""
    mm = costs.Matmul("expert_in", 1024, 64, 128, 2, weights=4, dtype="fp8", grad_bytes=4)
    assert mm.wgrad().shape.gemm == GemmShape(64, 128, 256, 4, accumulate_bytes=4)
    assert mm.forward().shape.gemm.accumulate_bytes == mm.dgrad().shape.gemm.accumulate_bytes == 0
    attrs = dict(mm.wgrad().shape.attributes())
    assert shape_from_attributes(attrs) == (mm.wgrad().shape, "")


def test_attention_and_elementwise_classes() -> None:
    fwd, bwd = costs.attention(2, 512, 8, 2, 64, 2, seq_kv=1024)
    assert fwd.shape.attention == AttentionShape(2, 8, 2, 64, 512, 1024, True, False)
    assert bwd.shape.attention.backward
    assert costs.elementwise("norm", 10, 5, 2, 2, 2)[0].shape.op_class == "norm"
    assert costs.elementwise("scale", 10, 1, 1, 1, 2)[1].shape.op_class == "elementwise"
    assert costs.elementwise("x", 10, 1, 1, 1, 2, op_class="softmax")[0].shape.op_class == "softmax"
    assert costs.optimizer(100).shape == OpShape("optimizer", "fp32")


def test_causal_pairs_count_the_lower_triangle() -> None:
    assert AttentionShape(1, 1, 1, 64, 4, 4).pairs == 10
    assert AttentionShape(1, 1, 1, 64, 2, 4).pairs == 2 * 2 + 3  # the last two queries of four keys
    assert AttentionShape(1, 1, 1, 64, 4, 4, causal=False).pairs == 16


@given(st.sampled_from([costs.Matmul("w", 96, 32, 48, 2).dgrad(), *costs.attention(1, 64, 4, 4, 32, 2, causal=False),
                        costs.elementwise("loss", 10, 5, 1, 1, 2)[0], costs.optimizer(7)]))
def test_attributes_read_back_to_the_shape(kernel: costs.Kernel) -> None:
    assert shape_from_attributes(dict(kernel.attributes())) == (kernel.shape, "")


def test_unusable_attributes_say_why() -> None:
    assert shape_from_attributes({}) == (None, "no op_class attribute")
    assert shape_from_attributes({"op_class": "gemm", "gemm_m": 4, "gemm_n": 0})[1] == \
        "gemm without positive gemm_n, gemm_k"
    assert "dtype 'int4'" in shape_from_attributes({"op_class": "norm", "dtype": "int4"})[1]
    assert shape_from_attributes({"op_class": "conv"})[1].startswith("op_class 'conv' is not one of gemm, ")


def test_cross_entropy_counts_megatrons_fp32_passes_over_the_logits() -> None:
    """Forward: cast to fp32, max, subtract, exp, sum, divide (36 + 2 bytes per bf16 logit); backward: scale in
    place and cast back (12 + 2); timed as a loss kernel in fp32."""
    fwd, bwd = costs.cross_entropy(4096, 32000, 2)
    assert fwd.size_bytes == 4096 * 32000 * 38 and bwd.size_bytes == 4096 * 32000 * 14
    assert fwd.shape == bwd.shape == OpShape("loss", "fp32")
    assert bwd.flops == costs.BACKWARD_FACTOR * fwd.flops == costs.BACKWARD_FACTOR * costs.LOSS_FLOPS * 4096 * 32000


def test_every_attribute_a_shape_writes_is_one_a_trace_reader_carries() -> None:
    """The attribute names trace readers pass to the kernel model (compute/trace_timing.py) are the ones shapes
    write, optional ones included: a name missing from the list once dropped the sliding window on its way."""
    shapes = [GemmShape(8, 16, 32, batch=4, streams=2, accumulate_bytes=4),
              AttentionShape(2, 8, 2, 64, 128, 128, causal=True, backward=True, flash=True, window=32),
              OpShape("quantize", "fp8", kernels=4)]
    written = {name: value for shape in shapes for name, value in shape.attributes()
               if name not in ("op_class", "dtype")}  # the two every reader reads by name
    assert set(written) == {*SHAPE_INT_ATTRIBUTES, *SHAPE_BOOL_ATTRIBUTES}
    assert all(isinstance(written[n], bool) for n in SHAPE_BOOL_ATTRIBUTES)
    assert not any(isinstance(written[n], bool) for n in SHAPE_INT_ATTRIBUTES)
