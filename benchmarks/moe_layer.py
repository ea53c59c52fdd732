"""One MoE layer's forward and backward on H100 against Megatron-LM's own MoE-layer benchmark.

    python benchmarks/moe_layer.py

Megatron-LM times one MoELayer (TE spec, grouped GEMM, permute and router fusion, forced load balance, alltoall
dispatcher, BF16) on 8 H100 with EP 8, sequence 4096, micro-batch 1: CUDA events around the layer's forward and
its backward, mean of 20 iterations (NVIDIA/Megatron-LM tests/functional_tests/test_cases/common/moe_perf/
baseline.json, BSD-3-Clause, added 2025-12-16; the flex rows from its later baseline, @d98e8a64dd: the flex dispatcher
with HybridEP and with DeepEP, whose own kernels the model does not have). This script builds the same layer shapes
with the LLM generator (one layer, data parallel 8, expert parallel 8), simulates it with the kernel compute model
and the NCCL-like collectives on the hgx-h100 profile, and prints the span from the router to the unpermutation
(forward; from the shared expert when there is one) and from the unpermutation's gradient to the router's weight
gradient (backward; to the shared expert's). The DeepSeek-like case
routes as the benchmark's proxy does (8 groups, the best 4; with EP 8 a token reaches at most 4 ranks) and has its
shared expert (FFN 2048, no shared-expert overlap, the proxy's settings).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from simulator.collectives.hardware import load_profile
from simulator.config import MemoryConfig, default_system
from simulator.node_table import COMMUNICATOR_STREAMS
from simulator.simulation import RunOptions, Simulation
from simulator.tools.training_hardware import network_for
from workload.generated import llm_workload

BASE = {"generate": "llm", "num_layers": 1, "num_heads": 32, "num_kv_heads": 8, "seq_len": 4096,
        "vocab_size": 32000, "gated_ffn": True, "dp": 8, "ep": 8, "global_batch": 8, "micro_batch_size": 1}
MIXTRAL = {"hidden_size": 4096, "ffn_hidden_size": 14336, "num_experts": 8, "top_k": 2}
DEEPSEEK = {"hidden_size": 7168, "ffn_hidden_size": 2048, "num_experts": 32, "top_k": 8, "router_groups": 8,
            "router_group_topk": 4, "shared_expert_ffn": 2048}
HYBRIDEP = {"moe_dispatcher": "flex", "moe_flex_backend": "hybridep"}
DEEPEP = {"moe_dispatcher": "flex", "moe_flex_backend": "deepep"}
CASES = (  # name, model fields, measured forward and backward ms (Megatron-LM's baseline, BF16)
    ("Mixtral-like (h 4096, ffn 14336, 8 experts, top-2), a2a", MIXTRAL, 4.33, 7.68),
    ("Mixtral-like, flex (HybridEP)", {**MIXTRAL, **HYBRIDEP}, 4.34, 7.74),
    ("Mixtral-like, flex (DeepEP)", {**MIXTRAL, **DEEPEP}, 4.64, 7.85),
    ("DeepSeek-like (h 7168, ffn 2048, 32 experts, top-8), a2a", DEEPSEEK, 7.12, 10.48),
    ("DeepSeek-like, flex (HybridEP)", {**DEEPSEEK, **HYBRIDEP}, 5.39, 8.80),
    ("DeepSeek-like, flex (DeepEP)", {**DEEPSEEK, **DEEPEP}, 5.68, 9.06),
)


def rank0_spans(spec: dict, profile_name: str, device: str, npus: int) -> dict[str, tuple[int, int]]:
    """Simulate the ``generate: llm`` mapping ``spec`` on ``npus`` GPUs of the shipped profile ``profile_name`` (as
    validate-training runs a step: kernel compute model, NCCL-like collectives, SM sharing) and return rank 0's
    (start, end) ns per node name."""
    profile = load_profile(profile_name)
    network = network_for(profile, npus, "moe benchmark")
    traces, _, _ = llm_workload(spec, npus, "moe benchmark")
    options = RunOptions(collective_model="nccl", hw_profile=profile_name, device=device, compute_model="kernels",
                         comm_streams=COMMUNICATOR_STREAMS, sm_sharing=True, timeline=True)
    sim = Simulation(traces, network, default_system(network.num_dims), MemoryConfig(), options=options)
    sim.run()
    rank0 = next(w for w in sim.workloads if w.rank == 0)
    return {rank0.graph.name(i) or "": (start, end) for i, start, end in rank0.timeline.spans}


def span_ns(spans: dict[str, tuple[int, int]], prefix: str, first: tuple[str, ...], last: tuple[str, ...]) -> int:
    """From the first node named ``prefix``...(one of ``first``) to start to the last named ``prefix``...(one of
    ``last``) to end."""
    start = min(s for k, (s, _) in spans.items() if k.startswith(prefix) and k.endswith(first))
    end = max(e for k, (_, e) in spans.items() if k.startswith(prefix) and k.endswith(last))
    return end - start


def layer_spans_ms(spec: dict) -> tuple[float, float]:
    """(forward, backward) of the MoE block on rank 0, in ms (the shared expert runs before the router and its
    backward last)."""
    spans = rank0_spans(spec, "hgx-h100", "H100", 8)
    combine = tuple(f".combine{g}_alltoall{part}" for g in ("", "_grad") for part in ("", "_across", "_within"))
    # the block ends with the unpermutation (alltoall dispatcher) or the combine (flex: none after it)
    return (span_ns(spans, "mb0.fwd.layer0.", (".router", ".shared_in"), (".unpermute", *combine)) / 1e6,
            span_ns(spans, "mb0.bwd.layer0.", (".unpermute", *combine), (".router_wgrad", ".shared_in_wgrad")) / 1e6)


def main() -> int:
    print(f"{'case':58} {'fwd ms':>8} {'measured':>9} {'bwd ms':>8} {'measured':>9}")
    for name, fields, fwd, bwd in CASES:
        f, b = layer_spans_ms({**BASE, **fields})
        print(f"{name:58} {f:8.2f} {fwd:9.2f} {b:8.2f} {bwd:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
