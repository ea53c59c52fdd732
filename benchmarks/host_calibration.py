"""The host model's calibration (workload/llm/host.py) against published Megatron MoE steps.

Megatron-Bridge's CUDA-graph card (skills/nemo-mbridge-perf-cuda-graphs/card.yaml, Apache-2.0, validated
2026-03/07) measured one host-bound MoE step twice: Qwen3-30B-A3B on 16 H100 (2 nodes), TP2 PP2 EP4, GBS 8 MBS 1,
mock data: 623 ms eager and 484 ms with TE-scoped graphs of attention, router and dispatcher preprocessing. The
saving is the graphed blocks' host time, which fixes ``CALL_SCALE`` (how much more host time Megatron-Core spends
per call than the isolated calls measured); the eager step then fixes ``EXPERT_SCALE`` (the same for the per-expert
work of TE's GroupedLinear). The recipe of that date (recipes/qwen/qwen3_moe.py @749949538) gives the rest:
sequence parallelism, the flex dispatcher with DeepEP, dropless routing; recompute is taken as none (TE-scoped
graphs refuse the recipe's full recompute) and BF16 as the card implies.

Megatron-Bridge's MoE comm-overlap card (skills/nemo-mbridge-perf-moe-comm-overlap/card.yaml, validated
2026-07-25) profiled a GPU-bound step of the same model: EP16 with HybridEP on 16 H100, GBS 1024 MBS 1, router and
dispatcher preprocessing graphed, 24.714 s, of which the GPU was active (the union of its kernels, copies and
memsets) 22.821 s. Its 1.893 s of idle GPU are almost all the dropless dispatcher's waits: with the EP A2A overlap
on, where another micro-batch's expert backward is queued before each wait, the same profile finds the GPU active
for the whole step. That idle fixes ``SYNC_SCALE``: the host time from the token counts' arrival to the dispatch's
launch (the GPU's queue is empty meanwhile), 3,072 waits a step. The three scales are fitted together (each fit
changes the others' targets a little), with the idle as step minus compute and exposed communication on the slowest
rank.

``--fit`` repeats the fit (a few minutes); without it the script prints the shipped constants against the cards
and the card's GPU-bound and communication-bound H100 EP16 runs (skills/nemo-mbridge-perf-moe-comm-overlap and
docs/training/cuda-graphs.md), which the host must not lengthen. GPT-OSS-20B's card row (TP2 PP4 EP4 on 16 GPUs)
folds the expert-parallel group across tensor-parallel ranks, which the generator does not express: not used.

Run: python benchmarks/host_calibration.py [--fit]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from simulator.collectives.hardware import load_profile
from simulator.tools.step_run import simulate_iteration
from simulator.tools.training_hardware import network_for
from workload.llm import host

QWEN3_30B = {"generate": "llm", "num_layers": 48, "hidden_size": 2048, "num_heads": 32, "num_kv_heads": 4,
             "head_dim": 128, "num_experts": 128, "top_k": 8, "ffn_hidden_size": 768, "seq_len": 4096,
             "vocab_size": 151936, "gated_ffn": True, "tied_embeddings": False, "position_embedding": "rope",
             "norm": "rmsnorm", "bias": False, "qk_norm": True, "use_distributed_optimizer": True,
             "overlap_grad_reduce": True, "overlap_param_gather": True, "ddp_bucket_size": "megatron",
             "iteration_tail": True, "moe_host_sync": True, "host_cpu": "x86"}
GRAPHED = "attn,moe_router,moe_preprocess"
CARD = {**QWEN3_30B, "tp": 2, "sequence_parallel": True, "pp": 2, "dp": 4, "ep": 4, "global_batch": 8,
        "micro_batch_size": 1, "moe_dispatcher": "flex", "nvlink_domain": 8}
EAGER_S, GRAPHED_S = 0.623, 0.484
EP16 = {**QWEN3_30B, "tp": 1, "pp": 1, "dp": 16, "ep": 16, "global_batch": 1024, "micro_batch_size": 1}
PROFILED = {**EP16, "moe_dispatcher": "flex", "moe_flex_backend": "hybridep", "nvlink_domain": 8,
            "cuda_graph_scope": "moe_router,moe_preprocess"}
PROFILED_S, PROFILED_ACTIVE_S = 24.714, 22.821  # the comm-overlap card's step and GPU-active union
# (run, spec, published step s, what it checks)
OTHERS = (
    ("EP16 HybridEP, router graphs (comm-overlap card; GPU active 22.82 s)", PROFILED, PROFILED_S),
    ("EP16 alltoall, eager (PR 3880)", EP16, 42.21),
    ("EP16 alltoall, attn+router graphs (cuda-graphs.md: no gain)", {**EP16, "cuda_graph_scope": GRAPHED}, 42.00),
)


def step_s(spec: dict) -> tuple[float, float]:
    """(step, exposed host) in s on 16 H100s (the hgx-h100 profile)."""
    step, exposed, _ = step_idle_s(spec)
    return step, exposed


def step_idle_s(spec: dict) -> tuple[float, float, float]:
    """(step, exposed host, GPU idle) in s on 16 H100s (the hgx-h100 profile); idle: the step minus the slowest
    rank's compute and exposed communication (a profile's GPU-active union counts both)."""
    network = network_for(load_profile("hgx-h100"), 16, "host calibration")
    it = simulate_iteration(spec, network, "hgx-h100", "H100")
    b = it.breakdown
    return (it.step_time_ns / 1e9, b["exposed_host_ns"] / 1e9,
            (it.step_time_ns - b["compute_busy_ns"] - b["exposed_collectives_ns"]) / 1e9)


@contextmanager
def scales(call: float, expert: float, sync: float) -> Iterator[None]:
    saved = host.CALL_SCALE, host.EXPERT_SCALE, host.SYNC_SCALE
    host.CALL_SCALE, host.EXPERT_SCALE, host.SYNC_SCALE = call, expert, sync
    try:
        yield
    finally:
        host.CALL_SCALE, host.EXPERT_SCALE, host.SYNC_SCALE = saved


def solve(f: Callable[[float], float], target: float, lo: float, hi: float, steps: int = 8) -> float:
    """x in [lo, hi] with f(x) = target, f increasing (bisection)."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return round((lo + hi) / 2, 1)


def fit(rounds: int = 3) -> tuple[float, float, float]:
    """(CALL_SCALE, EXPERT_SCALE, SYNC_SCALE): the graphs' saving, the eager step and the profiled idle, in turn
    (each fit moves the others' targets a little)."""
    call, expert, sync = host.CALL_SCALE, host.EXPERT_SCALE, host.SYNC_SCALE

    def saving(c: float) -> float:
        with scales(c, expert, sync):
            return step_s(CARD)[0] - step_s({**CARD, "cuda_graph_scope": GRAPHED})[0]

    def eager(e: float) -> float:
        with scales(call, e, sync):
            return step_s(CARD)[0]

    def idle(w: float) -> float:
        with scales(call, expert, w):
            return step_idle_s(PROFILED)[2]

    for _ in range(rounds):
        call = solve(saving, EAGER_S - GRAPHED_S, 1.0, 8.0)
        expert = solve(eager, EAGER_S, 0.25, 8.0)
        sync = solve(idle, PROFILED_S - PROFILED_ACTIVE_S, 1.0, 40.0)
    return call, expert, sync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true",
                        help="fit CALL_SCALE, EXPERT_SCALE and SYNC_SCALE to the cards again")
    args = parser.parse_args()
    if args.fit:
        call, expert, sync = fit()
        print(f"fitted: CALL_SCALE {call}, EXPERT_SCALE {expert}, SYNC_SCALE {sync} (shipped: {host.CALL_SCALE}, "
              f"{host.EXPERT_SCALE}, {host.SYNC_SCALE})")
    print(f"host model: CALL_SCALE {host.CALL_SCALE}, EXPERT_SCALE {host.EXPERT_SCALE}, SYNC_SCALE {host.SYNC_SCALE}, "
          f"Grace {host.HOST_CPU_SCALE['grace']}x")
    print(f"{'run (Qwen3-30B-A3B, 16 H100, BF16)':66} {'published s':>11} {'model s':>8} {'error':>7} {'host s':>7}")
    rows = [("TP2 PP2 EP4 GBS8, eager (cuda-graphs card)", CARD, EAGER_S),
            ("TP2 PP2 EP4 GBS8, attn+router graphs (cuda-graphs card)", {**CARD, "cuda_graph_scope": GRAPHED},
             GRAPHED_S), *OTHERS]
    for name, spec, published in rows:
        model, exposed = step_s(spec)
        print(f"{name:66} {published:11.3f} {model:8.3f} {model / published - 1:+7.1%} {exposed:7.3f}")
    model, _, idle = step_idle_s(PROFILED)
    print(f"\nthe comm-overlap card's profile of the EP16 HybridEP step: GPU active {PROFILED_ACTIVE_S:.3f} s, idle "
          f"{PROFILED_S - PROFILED_ACTIVE_S:.3f} s; the model: active {model - idle:.3f} s, idle {idle:.3f} s")


if __name__ == "__main__":
    main()
