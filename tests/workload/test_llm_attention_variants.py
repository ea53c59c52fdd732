"""Attention and loss variants of the LLM generator: sliding-window layers (GPT-OSS, Mistral), the unfused attention
core Megatron-LM ran before FlashAttention, and the unfused fp32 cross entropy; pair counts, kernel shapes, FLOPs,
bytes and the refusals."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compute.devices import device
from compute.kernels import KernelModel, _key_blocks
from compute.shapes import AttentionShape, OpShape, shape_from_attributes
from tests.workload.test_llm import SMALL, SMALL_GPT
from workload.errors import InputError
from workload.llm import costs
from workload.llm.build import build_programs
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan

WINDOWED = replace(SMALL, name="windowed", seq_len=256, window_size=32, window_attn_skip_freq=2)


def brute_pairs(seq_q: int, seq_kv: int, window: int) -> int:
    offset = seq_kv - seq_q
    return sum(min(offset + j + 1, window or seq_kv) for j in range(seq_q))


@given(st.integers(1, 200), st.integers(0, 100), st.integers(0, 300))
def test_windowed_pairs_count_each_querys_last_keys(seq_q: int, extra: int, window: int) -> None:
    shape = AttentionShape(1, 1, 1, 64, seq_q, seq_q + extra, window=window)
    assert shape.pairs == brute_pairs(seq_q, seq_q + extra, window)
    assert shape.pairs <= AttentionShape(1, 1, 1, 64, seq_q, seq_q + extra).pairs


@given(st.integers(1, 700), st.integers(0, 300), st.integers(0, 800), st.sampled_from([16, 64, 128]),
       st.sampled_from([16, 64, 128]))
def test_key_blocks_visit_the_blocks_holding_a_tiles_visible_keys(seq_q: int, extra: int, window: int,
                                                                   block_q: int, block_kv: int) -> None:
    seq_kv, offset = seq_q + extra, extra
    want = 0
    for start in range(0, seq_q, block_q):
        end = min(start + block_q, seq_q) + offset  # one past the tile's last query position
        first = max(start + offset + 1 - window, 0) if window else 0  # the first key its first query sees
        want += -(-end // block_kv) - first // block_kv
    assert _key_blocks(seq_q, seq_kv, True, block_q, block_kv, window) == want


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["a100", "h100", "b200"]), st.integers(1, 1 << 14), st.integers(1, 1 << 14), st.booleans(),
       st.booleans())
def test_a_window_never_costs_more_and_a_wide_one_costs_the_same(name: str, seq: int, window: int, backward: bool,
                                                                 flash: bool) -> None:
    model = KernelModel(device(name))

    def seconds(w: int) -> float:
        return model.seconds(OpShape("attention", "bf16", attention=AttentionShape(2, 16, 4, 128, seq, seq, True,
                                                                                   backward, flash, w)), 0, 0)
    assert 0 < seconds(window) <= seconds(0) < math.inf
    assert seconds(seq + window) == seconds(0)


def test_window_reads_back_from_the_trace_attributes() -> None:
    fwd, bwd = costs.attention(2, 512, 8, 2, 64, 2, window=128)
    assert dict(fwd.attributes())["attn_window"] == 128
    for kernel in (fwd, bwd):
        assert shape_from_attributes(dict(kernel.attributes())) == (kernel.shape, "")
    assert "attn_window" not in dict(costs.attention(2, 512, 8, 2, 64, 2)[0].attributes())
    assert fwd.flops == 4 * 64 * 8 * 2 * (128 * 129 // 2 + (512 - 128) * 128)
    assert bwd.flops == costs.BACKWARD_FACTOR * fwd.flops


def attention_kernels(model, plan: ParallelPlan, options: TrainingOptions | None = None) -> dict[str, costs.Kernel]:
    plan.validate(model)
    return {op.name: op.kernel for p in build_programs(model, plan, options) for op in p.ops
            if op.kernel is not None and op.kernel.category == "attention"}


def test_every_other_layer_attends_through_the_window() -> None:
    """window_attn_skip_freq 2: layers 0 and 2 windowed, 1 and 3 full (GPT-OSS alternates them); the recompute
    of the attention core repeats each layer's own kernel."""
    kernels = attention_kernels(WINDOWED, ParallelPlan(pp=2, num_micro_batches=2, recompute="selective"))
    windows = {name: k.shape.attention.window for name, k in kernels.items()}
    assert {windows[f"mb1.{phase}.layer{i}.attention"] for phase in ("fwd", "bwd", "recompute") for i in (0, 2)} \
        == {32}
    assert {windows[f"mb1.{phase}.layer{i}.attention"] for phase in ("fwd", "bwd", "recompute") for i in (1, 3)} \
        == {0}
    full, win = kernels["mb0.fwd.layer1.attention"], kernels["mb0.fwd.layer0.attention"]
    assert win.flops == full.flops * brute_pairs(256, 256, 32) // brute_pairs(256, 256, 0)
    every = attention_kernels(replace(WINDOWED, window_attn_skip_freq=0), ParallelPlan(num_micro_batches=1))
    assert {k.shape.attention.window for k in every.values()} == {32}


def test_a_window_as_long_as_the_sequence_is_full_attention() -> None:
    plan = ParallelPlan(num_micro_batches=1)
    wide = attention_kernels(replace(WINDOWED, window_size=256), plan)
    assert wide == attention_kernels(replace(WINDOWED, window_size=None), plan)


def test_window_refusals() -> None:
    with pytest.raises(InputError, match=r"sliding-window attention .* with context parallelism is not modelled"):
        ParallelPlan(cp=2, num_micro_batches=1).validate(WINDOWED)
    ParallelPlan(cp=2, num_micro_batches=1).validate(replace(WINDOWED, window_size=256))  # no window in effect
    with pytest.raises(InputError, match="window_size must be a whole number >= 1"):
        replace(WINDOWED, window_size=0).validate()
    with pytest.raises(InputError, match="attention_backend must be one of flash, unfused"):
        TrainingOptions(attention_backend="sdpa").validate(0, False, 1)


def test_unfused_backend_marks_every_attention_kernel() -> None:
    """--attention-backend unfused: the same pairs and FLOPs, timed as the unfused kernels (slower on a device)."""
    plan = ParallelPlan(tp=2, num_micro_batches=1)
    fused = attention_kernels(SMALL, plan)
    unfused = attention_kernels(SMALL, plan, TrainingOptions(attention_backend="unfused"))
    assert fused.keys() == unfused.keys()
    for name, kernel in unfused.items():
        assert not kernel.shape.attention.flash and kernel.flops == fused[name].flops
    a100 = KernelModel(device("a100"))
    long = costs.attention(4, 2048, 16, 16, 128, 2)[0].shape
    assert a100.seconds(replace(long, attention=replace(long.attention, flash=False)), 0, 0) > a100.seconds(long, 0, 0)


def test_cli_window_and_backend_flags_reach_the_summary(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "simulator", "trace", "generate", "llm", "--layers", "4", "--hidden", "256",
            "--heads", "8", "--ffn-hidden", "512", "--vocab", "1000", "--seq-len", "1024", "--npus", "2",
            "--micro-batches", "1", "--summary", "--device", "h100"]

    def line(start: str, *extra: str) -> str:
        done = subprocess.run([*base, *extra], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        return next(x for x in done.stdout.splitlines() if x.strip().startswith(start))
    flops = "matmuls with parameters"
    full = line(flops)
    assert line(flops, "--window-size", "128", "--window-attn-skip-freq", "2") != full
    assert line(flops, "--window-size", "1024") == full
    assert line(flops, "--attention-backend", "unfused") == full
    assert line("slowest rank", "--attention-backend", "unfused") != line("slowest rank")
    bad = subprocess.run([*base, "--window-size", "0"], capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "window_size must be a whole number >= 1" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_unfused_cross_entropy_reads_the_logits_in_fp32_passes() -> None:
    plan = ParallelPlan(tp=2, num_micro_batches=1)
    plan.validate(SMALL)

    def loss(options: TrainingOptions) -> list[costs.Kernel]:
        return [op.kernel for p in build_programs(SMALL, plan, options) for op in p.ops
                if op.name.endswith(".loss") and op.kernel is not None]
    fused, unfused = loss(TrainingOptions()), loss(TrainingOptions(cross_entropy="unfused"))
    logits = SMALL.seq_len * plan.padded_vocab(SMALL) // 2  # one sequence, half the vocabulary per rank
    assert [k.size_bytes for k in fused] == [logits * 4, logits * 6]  # one read and write of bf16 each way
    assert [k.size_bytes for k in unfused] == [logits * 38, logits * 14]
    assert [k.flops for k in fused] == [k.flops for k in unfused]
    with pytest.raises(InputError, match="cross_entropy must be one of fused, unfused"):
        TrainingOptions(cross_entropy="te").validate(0, False, 1)


def rope_ops(model, plan: ParallelPlan) -> dict[str, costs.Kernel]:
    plan.validate(model)
    return {op.name: op.kernel for p in build_programs(model, plan) for op in p.ops if op.name.endswith(".rope")}


def test_rope_rotates_each_layers_queries_and_keys_forward_and_backward() -> None:
    """A RoPE model rotates its queries and keys after the QKV GEMM and their gradients after attention's backward;
    fused, each element is read and written once (per tensor-parallel rank: its heads, its tokens)."""
    plan = ParallelPlan(tp=2, num_micro_batches=1)
    ops = rope_ops(SMALL, plan)
    assert sorted(ops) == sorted(f"mb0.{phase}.layer{i}.rope" for phase in ("fwd", "bwd") for i in range(4))
    elements = 64 * (8 + 4) // 2 * 32  # tokens x (query + key heads) / tp x head size
    assert {k.size_bytes for k in ops.values()} == {2 * elements * 2}
    assert rope_ops(SMALL_GPT, ParallelPlan(num_micro_batches=1)) == {}  # learned positions: nothing to rotate


def test_unfused_rope_moves_more_bytes_and_full_recompute_repeats_it() -> None:
    """Megatron-Core's unfused RoPE (GPT-OSS's YaRN) moves ROPE_UNFUSED_PASSES / 2 times the fused kernel's
    bytes for the same FLOPs; selective recompute (the attention core) keeps the rotated tensors, full
    recompute rotates them again."""
    plan = ParallelPlan(num_micro_batches=1)
    fused, unfused = rope_ops(SMALL, plan), rope_ops(replace(SMALL, rope_fused=False), plan)
    for name, kernel in fused.items():
        assert unfused[name].size_bytes * 2 == kernel.size_bytes * costs.ROPE_UNFUSED_PASSES
        assert unfused[name].flops == kernel.flops
    assert not any(".recompute." in n for n in rope_ops(SMALL, ParallelPlan(num_micro_batches=1,
                                                                            recompute="selective")))
    full = rope_ops(SMALL, ParallelPlan(num_micro_batches=1, recompute="full"))
    assert sum(".recompute." in n for n in full) == SMALL.num_layers


def test_qk_norms_follow_the_qkv_gemm_and_precede_its_gradient() -> None:
    """Qwen3's query and key norms: after the QKV GEMM (before RoPE), their gradient after RoPE's and before the QKV
    GEMM's; one read and one write of a rank's query and key heads forward, three passes backward; their weights
    (head_dim each) counted once per layer, held whole by every tensor-parallel rank; refused with latent
    attention."""
    plan = ParallelPlan(tp=2, num_micro_batches=1)
    normed = replace(SMALL, qk_norm=True)
    plan.validate(normed)
    ops = [op for p in build_programs(normed, plan) for op in p.ops if op.kernel is not None]
    names = [op.name.rsplit(".", 1)[-1] for op in ops if op.name.startswith("mb0.fwd.layer0.")]
    assert names.index("qkv") + 1 == names.index("qk_norm") == names.index("rope") - 1
    back = [op.name.rsplit(".", 1)[-1] for op in ops if op.name.startswith("mb0.bwd.layer0.")]
    assert back.index("rope") + 1 == back.index("qk_norm") == back.index("qkv_dgrad") - 1
    elements = 64 * (8 + 4) // 2 * 32  # tokens x (query + key heads) / tp x head size
    kernels = {op.name: op.kernel for op in ops if op.name.endswith(".qk_norm")}
    assert len(kernels) == 2 * SMALL.num_layers
    assert {k.size_bytes for n, k in kernels.items() if ".fwd." in n} == {elements * 2 * 2}
    assert {k.size_bytes for n, k in kernels.items() if ".bwd." in n} == {elements * 3 * 2}
    assert normed.total_params() - SMALL.total_params() == 2 * 32 * SMALL.num_layers
    assert not [op for p in build_programs(SMALL, plan) for op in p.ops if op.name.endswith(".qk_norm")]
    with pytest.raises(InputError, match=r"qk_norm .* not latent attention"):
        replace(SMALL, qk_norm=True, kv_lora_rank=64, q_lora_rank=64, num_kv_heads=8).validate()
