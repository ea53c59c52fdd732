"""The kernel model over whole generated training steps: a rank's compute time never falls as the model grows
(layers, hidden size, FFN width) or as it sees more tokens (sequence, micro-batch), and never rises on a device
with higher peaks and bandwidth."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from compute.devices import device
from compute.kernels import KernelModel
from workload.llm.build import build_programs
from workload.llm.model import ModelConfig
from workload.llm.plan import ParallelPlan
from workload.schema import NodeType

BASE = ModelConfig(name="p", num_layers=2, hidden_size=512, num_heads=8, num_kv_heads=4, ffn_hidden_size=1536,
                   vocab_size=8000, seq_len=512, gated_ffn=True)


def step_ns(model: ModelConfig, plan: ParallelPlan, kernels: KernelModel) -> int:
    """Compute time of the first stage's first rank: the sum of its kernels."""
    program = build_programs(model, plan)[0]
    return sum(kernels.time_ns(op.kernel.shape, op.kernel.flops, op.kernel.size_bytes)
               for op in program.ops if op.node_type == NodeType.COMP_NODE)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["A100", "H100", "B200", "MI300X"]), st.sampled_from([1, 2]),
       st.sampled_from(["num_layers", "hidden_size", "ffn_hidden_size", "seq_len", "micro_batch_size"]),
       st.integers(1, 3))
def test_step_compute_grows_with_model_and_tokens(name: str, tp: int, what: str, factor: int) -> None:
    kernels = KernelModel(device(name))
    plan = ParallelPlan(dp=1, tp=tp, pp=1, micro_batch_size=1, num_micro_batches=2)
    model = BASE
    base = step_ns(model, plan, kernels)
    if what == "micro_batch_size":
        plan = replace(plan, micro_batch_size=1 + factor)
    else:
        model = replace(model, **{what: getattr(model, what) * (1 + factor)})
    assert step_ns(model, plan, kernels) >= base > 0


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["A100", "H100", "MI300X"]), st.floats(1.0, 4.0), st.floats(1.0, 4.0))
def test_step_compute_never_rises_on_a_faster_device(name: str, peak: float, bandwidth: float) -> None:
    d = device(name)
    faster = replace(d, peaks_tflops={k: v * peak for k, v in d.peaks_tflops.items()},
                     memory_bw_GBps=d.memory_bw_GBps * bandwidth)
    plan = ParallelPlan(dp=1, tp=2, pp=1, micro_batch_size=1, num_micro_batches=2)
    assert step_ns(BASE, plan, KernelModel(faster)) <= step_ns(BASE, plan, KernelModel(d))
