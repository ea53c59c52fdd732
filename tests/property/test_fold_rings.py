"""Folded runs with the send/receive rings of context-parallel ring attention and --tp-comm-overlap, virtual
stages with sequence parallelism, experts over the data-parallel ranks (groups of the same ranks), under the
astra-sim collective model (both analytical backends) and the NCCL model (profiles with 4, 8 and 16 NICs per
node), with one communication stream per rank or one per communicator: every rank equals the message
engine's, to the nanosecond."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simulator.api import simulate

EXAMPLES = int(os.environ.get("QUOTIENT_EXAMPLES", "20")) // 2


@st.composite
def ring_layouts(draw: st.DrawFn) -> dict[str, Any]:
    tp, cp, pp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    while tp * cp * pp * dp > 32:
        dp //= 2
        cp = cp if tp * cp * pp * dp <= 32 else cp // 2
    if tp * cp * pp * dp < 2:
        cp = 2
    vp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    sp = tp > 1 and draw(st.booleans())
    m = pp * draw(st.integers(1, 2)) if vp > 1 else draw(st.integers(1, 2))
    spec: dict[str, Any] = {
        "generate": "llm", "num_layers": 2 * pp * vp, "hidden_size": 256, "num_heads": 8, "num_kv_heads": 8,
        "ffn_hidden_size": 512, "vocab_size": 1000, "seq_len": 64, "tp": tp, "cp": cp, "pp": pp, "dp": dp, "vp": vp,
        "global_batch": dp * m, "sequence_parallel": sp, "tp_comm_overlap": sp and draw(st.booleans()),
        "cp_comm_type": "p2p", "layout": ",".join(draw(st.permutations(["tp", "cp", "dp", "pp"]))),
        "zero": draw(st.sampled_from([0, 1]))}
    ep = draw(st.sampled_from([1, 2, 4]))
    etp = 1 if sp or tp == 1 else tp  # without sequence parallelism the experts split as the tensor-parallel ranks
    if ep > 1 and (tp * cp * dp) % (etp * ep) == 0:  # ep = dp, tp = cp = 1: expert and data groups of one set
        spec.update(num_experts=4, top_k=2, ep=ep, etp=etp)
    world = tp * cp * pp * dp
    counts = draw(st.sampled_from([c for c in ([world], [2, world // 2], [4, world // 4])
                                   if math.prod(c) == world and min(c) >= 2]))
    network = {"topology": draw(st.lists(st.sampled_from(["Ring", "Switch", "FullyConnected"]),
                                         min_size=len(counts), max_size=len(counts))),
               "npus_count": counts, "bandwidth": [400.0] * len(counts), "latency": [500.0] * len(counts)}
    return {"spec": spec, "network": network}


def run_both(tmp_path: Path, case: dict[str, Any], **options: Any) -> Any:
    workload = tmp_path / "w.yaml"
    workload.write_text(json.dumps(case["spec"]))
    network = tmp_path / "n.yml"
    network.write_text(json.dumps(case["network"]))
    fast = simulate(str(workload), str(network), device="H100", **options)
    event(f"folded to {'all' if fast.simulated_ranks == len(fast.ranks) else 'fewer'} ranks")
    slow = simulate(str(workload), str(network), device="H100", engine="message", **options)
    assert fast.ranks == slow.ranks and fast.collectives == slow.collectives
    assert all(r.finish_ns > 0 for r in slow.ranks)
    return fast


@settings(max_examples=max(EXAMPLES, 10), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ring_layouts(), st.sampled_from(["analytical-unaware", "analytical-aware"]))
def test_rings_fold_exactly(tmp_path: Path, case: dict[str, Any], backend: str) -> None:
    run_both(tmp_path, case, backend=backend)


@settings(max_examples=max(EXAMPLES, 10), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ring_layouts(), st.sampled_from(["aws-p4d-a100", "hgx-h100", "oci-a100-b4"]))
def test_nccl_runs_fold_exactly(tmp_path: Path, case: dict[str, Any], profile: str) -> None:
    """... and under the NCCL model no tie makes the run fall back (each rank completes its same-instant sends
    and receives in its own issue order)."""
    fast = run_both(tmp_path, case, collective_model="nccl", hw_profile=profile)
    assert "diverge" not in fast.engine_reason, fast.engine_reason


def renumbered_traces(spec: dict[str, Any], group_order: list[int], id_offsets: list[int]) -> list[list[Any]]:
    """Per-rank traces of a ``generate: llm`` mapping written as files would be (tests/conftest.py)."""
    from tests.conftest import renumbered_llm_traces
    from workload.generated import _llm_parts

    _, model, plan, options = _llm_parts(spec, "test")
    return renumbered_llm_traces(model, plan, group_order, id_offsets, options)


@settings(max_examples=max(EXAMPLES // 2, 5), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ring_layouts(), st.sampled_from(["aws-p4d-a100", "hgx-h100", "oci-a100-b4"]),
       st.permutations(list(range(5))), st.lists(st.integers(0, 50), min_size=1, max_size=4))
def test_nccl_rings_from_renumbered_files_fold_without_a_tie(tmp_path: Path, case: dict[str, Any], profile: str,
                                                             group_order: list[int], id_offsets: list[int]) -> None:
    """Trace files numbering their own nodes and groups, under the NCCL model: every rank completes its
    same-instant sends and receives in its own issue order (simulator/nccl_flows.py), so the rings of TP comm
    overlap (tp 2 and 4), ring attention (cp 2 and 4), pipeline sends and data-parallel pairs never leave a tie
    that makes the run fall back, and the folded run equals the message engine rank by rank."""
    from tests.conftest import simulate as simulate_files

    traces = renumbered_traces(case["spec"], group_order, id_offsets)
    options = {"device": "H100", "collective_model": "nccl", "hw_profile": profile}
    fast = simulate_files(tmp_path, traces, case["network"], **options)
    event(f"folded to {'all' if fast.simulated_ranks == len(fast.ranks) else 'fewer'} ranks")
    slow = simulate_files(tmp_path, traces, case["network"], engine="message", **options)
    assert fast.ranks == slow.ranks and fast.collectives == slow.collectives
    assert "diverge" not in fast.engine_reason, fast.engine_reason


@settings(max_examples=max(EXAMPLES, 10), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ring_layouts(), st.sampled_from(["hgx-h100", "oci-a100-b4"]))
def test_communicator_streams_fold_exactly(tmp_path: Path, case: dict[str, Any], profile: str) -> None:
    """One communication stream per communicator (--comm-streams communicator) and collectives holding SMs
    (--sm-sharing), with the distributed optimizer's overlapped buckets in the mix: folded runs still equal the
    message engine's."""
    case["spec"].update(overlap_grad_reduce=True, ddp_bucket_size="megatron", iteration_tail=True)
    if case["spec"]["zero"] == 1:
        case["spec"]["overlap_param_gather"] = True
    run_both(tmp_path, case, collective_model="nccl", hw_profile=profile, comm_streams="communicator",
             compute_model="kernels", sm_sharing=True)
