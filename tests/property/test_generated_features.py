"""Generated LLM workloads with the step's features (context parallelism, virtual stages, TP overlap, buckets,
FSDP, FP8, recompute, the iteration tail, expert tensor parallelism, shared experts, latent attention, dense
first layers, multi-token prediction, the embedding and loss in the pipeline split):
the folded run (TraceSet.structure, one rank per class) equals the message engine rank by rank, to the nanosecond,
and every rank finishes."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simulator.api import simulate

EXAMPLES = int(os.environ.get("QUOTIENT_EXAMPLES", "20")) // 2


@st.composite
def featured_layouts(draw: st.DrawFn) -> dict:
    tp, cp, pp = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2])) if tp * cp * pp > 1 else 2
    vp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    m = pp * draw(st.integers(1, 2)) if vp > 1 else draw(st.integers(1, 2))
    sp = tp > 1 and draw(st.booleans())
    zero = draw(st.sampled_from([0, 1, 3]))
    moe = draw(st.booleans())
    spec = {"generate": "llm", "num_layers": 2 * pp * vp, "hidden_size": 256, "num_heads": 8, "num_kv_heads": 4,
            "ffn_hidden_size": 512, "vocab_size": 1000, "seq_len": 64, "tp": tp, "cp": cp, "pp": pp, "dp": dp,
            "vp": vp, "global_batch": dp * m, "zero": zero, "sequence_parallel": sp,
            "cp_comm_type": draw(st.sampled_from(["p2p", "all_gather", "a2a"])),
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
            "precision": draw(st.sampled_from(["bf16", "fp8"])), "iteration_tail": draw(st.booleans()),
            "tp_comm_overlap": sp and draw(st.booleans()),
            "layout": ",".join(draw(st.permutations(["tp", "cp", "dp", "pp"])))}
    if zero in (0, 1):
        spec["overlap_grad_reduce"] = draw(st.sampled_from([None, True, False]))
        if draw(st.booleans()):
            spec["ddp_bucket_size"] = draw(st.sampled_from([200_000, 800_000]))
        if zero == 1 and spec["overlap_grad_reduce"] is not False:
            spec["overlap_param_gather"] = draw(st.booleans())
    else:
        spec["reshard_after_forward"] = draw(st.booleans())
        spec["fsdp_grad_sync"] = draw(st.sampled_from(["every", "last"]))
    if pp > 1 and draw(st.booleans()):  # embedding and loss as pipeline layers: two layers fewer fill the stages
        spec.update(num_layers=2 * pp * vp - 2, account_for_embedding=True, account_for_loss=True)
    if draw(st.booleans()):  # multi-head latent attention (MHA heads; the core's head dims 24 + 8 and 16)
        spec.update(num_kv_heads=8, head_dim=24, q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16)
    etp = 1 if sp or tp == 1 else tp  # without sequence parallelism the experts split as the tensor-parallel ranks
    if moe and (tp * cp * dp) % (2 * etp) == 0:
        spec.update(num_experts=4, top_k=2, ep=2, etp=etp, shared_expert_ffn=draw(st.sampled_from([0, 256])),
                    dense_layers=draw(st.sampled_from([0, 1])))
    if pp > 1 and "account_for_embedding" not in spec and draw(st.booleans()):  # a multi-token-prediction depth
        spec["mtp_layers"] = 1
    world = tp * cp * pp * dp
    counts = draw(st.sampled_from([c for c in ([world], [2, world // 2]) if math.prod(c) == world and min(c) >= 2]))
    return {"spec": {k: v for k, v in spec.items() if v is not None},
            "network": {"topology": draw(st.lists(st.sampled_from(["Ring", "Switch", "FullyConnected"]),
                                                  min_size=len(counts), max_size=len(counts))),
                        "npus_count": counts, "bandwidth": [400.0] * len(counts), "latency": [500.0] * len(counts)},
            "backend": draw(st.sampled_from(["analytical-unaware", "analytical-aware"]))}


@settings(max_examples=max(EXAMPLES, 10), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(featured_layouts())
def test_featured_workloads_fold_exactly(tmp_path: Path, case: dict) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(json.dumps(case["spec"]))
    network = tmp_path / "n.yml"
    network.write_text(json.dumps(case["network"]))
    fast = simulate(str(workload), str(network), device="H100", backend=case["backend"])
    event(f"folded to {'all' if fast.simulated_ranks == len(fast.ranks) else 'fewer'} ranks")
    slow = simulate(str(workload), str(network), device="H100", engine="message", backend=case["backend"])
    assert fast.ranks == slow.ranks and fast.collectives == slow.collectives
    assert all(r.finish_ns > 0 for r in slow.ranks)
