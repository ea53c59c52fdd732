"""The host issuing the kernels (workload/llm/host.py): one chain of CPU nodes per rank, each block of a layer pass
ending no earlier than its host node; the dropless dispatcher's host waiting for the token counts; CUDA graphs."""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.workload.test_llm import SMALL, SMALL_MOE
from tests.workload.test_llm_step import AG, finish, traces
from workload.errors import InputError
from workload.llm import cli, host
from workload.llm.host import HostModel
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan
from workload.llm.sizes import GROUPED_GEMM_STREAMS


def test_issue_times_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts of framework calls times per-call costs: 3 TE modules and 4 operators for attention (36 and 7 us),
    twice that backward, times Megatron's call scale; per-expert work times its own scale; Grace 1.25x; a captured
    block one graph launch."""
    c, e, w = host.CALL_SCALE, host.EXPERT_SCALE, host.SYNC_SCALE
    x86, grace = HostModel(), HostModel(cpu="grace")
    assert x86.attention(False) == round(c * (3 * 36 + 4 * 7))
    assert x86.attention(True) == round(c * 2 * (3 * 36 + 4 * 7))
    assert grace.attention(False) == round(1.25 * c * (3 * 36 + 4 * 7))
    assert x86.attention(False, qk_norm=True) == round(c * (5 * 36 + 4 * 7))  # Qwen3's query and key norms
    assert x86.experts(16, False) == round(c * (2 * 36 + 8 * 7) + e * 2 * 16 * 10)
    assert x86.experts(16, True) == round(c * 2 * (2 * 36 + 8 * 7) + e * 2 * 16 * 27)
    assert x86.routing(False) == round(c * (36 + 12 * 7 + 6 * 7))
    assert x86.sync_return() == round(w * (30 + 2 * 7))  # the wait's own scale (the profiled idle GPU)
    graphed = HostModel(graph_scopes=frozenset({"attn", "moe_router", "moe_preprocess"}))
    assert graphed.attention(True) == 15 and graphed.routing(False) == 15 + 15
    monkeypatch.setattr(host, "CALL_SCALE", 1.0)
    monkeypatch.setattr(host, "EXPERT_SCALE", 1.0)
    assert HostModel().experts(16, False) == 2 * 36 + 8 * 7 + 2 * 16 * 10  # the isolated calls' costs


def test_low_precision_gemm_modules_cost_more_host_time() -> None:
    """FP8/FP4 GEMM modules (qkv, proj, fc1, fc2, the grouped linears and their per-expert work) take
    LOW_PRECISION_FACTOR times their 16-bit host time; the attention core, router and output layer do not quantize."""
    c, e, f = host.CALL_SCALE, host.EXPERT_SCALE, host.LOW_PRECISION_FACTOR
    bf16, fp8 = HostModel(), HostModel(low_precision=True)
    assert fp8.attention(False) == round(c * ((3 + 2 * (f - 1)) * 36 + 4 * 7))
    assert fp8.mlp(True) == round(c * 2 * ((2 + 2 * (f - 1)) * 36 + 2 * 7))
    assert fp8.experts(16, False) == round(c * ((2 + 2 * (f - 1)) * 36 + 8 * 7) + f * e * 2 * 16 * 10)
    assert fp8.routing(False) == bf16.routing(False) and fp8.head(True) == bf16.head(True)
    assert fp8.sync_return() == bf16.sync_return()
    graphed = HostModel(low_precision=True, graph_scopes=frozenset({"attn"}))
    assert graphed.attention(False) == HostModel(graph_scopes=frozenset({"attn"})).attention(False) == 15


def test_generator_passes_low_precision_to_the_host() -> None:
    assert TrainingOptions(precision="fp8", host_cpu="x86").host().low_precision
    assert TrainingOptions(precision="fp4", moe_host_sync=True).host().low_precision
    assert not TrainingOptions(host_cpu="x86").host().low_precision


@given(st.integers(1, 512), st.booleans(), st.sampled_from(host.HOST_CPUS),
       st.sets(st.sampled_from(host.GRAPH_SCOPES[:-1])))
def test_issue_times_grow_with_work_and_shrink_with_graphs(experts: int, backward: bool, cpu: str,
                                                           scopes: set[str]) -> None:
    m = HostModel(cpu=cpu)
    graphed = HostModel(cpu=cpu, graph_scopes=frozenset(scopes))
    assert 0 < m.experts(experts, backward) < m.experts(experts + 1, backward)
    assert m.experts(experts, False) < m.experts(experts, True)
    assert HostModel().experts(experts, backward) <= HostModel(cpu="grace").experts(experts, backward)
    low = HostModel(cpu=cpu, low_precision=True)
    assert m.experts(experts, backward) < low.experts(experts, backward)
    for block in ("attention", "mlp"):
        assert getattr(m, block)(backward) < getattr(low, block)(backward)
    for block in ("attention", "mlp", "head"):
        assert 0 < getattr(graphed, block)(backward) <= getattr(m, block)(backward)
    assert 0 < graphed.experts(experts, backward) <= m.experts(experts, backward)
    assert 0 < graphed.routing(backward) <= m.routing(backward)


def test_host_nodes_form_one_chain_and_close_their_blocks(tmp_path: Path) -> None:
    """Per layer pass a host node per block, each after the host's previous one; the block's last kernel waits for
    it; with the dropless sync a forward's host waits for the token counts' all-gather (dispatch_issue: the copy's
    round trip and the dispatch's launch), and the dispatch waits for that host node."""
    plan = ParallelPlan(dp=2, ep=2, num_micro_batches=2)
    rank = traces(tmp_path, SMALL_MOE, plan, moe_host_sync=True)[0]
    hosts = [n for n in rank.nodes if n.attrs.get("is_cpu_op") and n.name.endswith(("_issue", "_issue_bwd"))]
    per_pass = {"attn_issue", "route_issue", "expert_issue"}
    syncs = [h for h in hosts if h.name.endswith(".dispatch_issue")]
    assert len(syncs) == SMALL_MOE.num_layers * 2  # a forward's MoE layers, 2 micro-batches
    assert len(hosts) - len(syncs) == 2 * (SMALL_MOE.num_layers * 2 * len(per_pass) + 2)  # fwd + bwd, + head
    for before, after in itertools.pairwise(hosts):
        assert before.id in after.deps
    counts = rank.collectives(AG, "dispatch_counts_allgather")
    assert len(counts) == SMALL_MOE.num_layers * 2
    assert all(c.attrs["comm_size"] == 8 * SMALL_MOE.num_experts and rank.members(c) == (0, 1) for c in counts)
    for h in syncs:
        assert any(c.id in h.deps for c in counts) and h.duration_us == HostModel().sync_return()
        dispatch = [n for n in rank.nodes if h.id in n.deps and not n.attrs.get("is_cpu_op")]
        assert [n.name for n in dispatch] == [h.name.replace("dispatch_issue", "dispatch_alltoall")]
    closers = [h for h in hosts if h not in syncs]
    host_ids = {h.id for h in closers}
    waiting = {n.id: n for n in rank.compute() if not n.attrs.get("is_cpu_op") and host_ids & set(n.deps)}
    assert len(waiting) == len(closers)
    for h in closers:
        closer = next(n for n in waiting.values() if h.id in n.deps)
        assert closer.id > h.id
        if h.name.endswith(".expert_issue"):
            assert closer.name.endswith(".unpermute")
    plain = traces(tmp_path / "off", SMALL_MOE, plan)[0]
    assert not plain.collectives(AG, "dispatch_counts_allgather")
    assert not [n for n in plain.nodes if n.attrs.get("is_cpu_op")]


def test_token_drop_and_whole_iteration_graphs(tmp_path: Path) -> None:
    """Without the dropless sync the host chain runs free (no counts); one graph per iteration: no host nodes."""
    plan = ParallelPlan(dp=2, ep=2)
    drop = traces(tmp_path / "drop", SMALL_MOE, plan, host_cpu="grace")[0]
    assert not drop.collectives(AG, "dispatch_counts_allgather")
    issue = [n for n in drop.nodes if n.name.endswith(".expert_issue")]
    assert issue and all(len(n.deps) == 1 for n in issue)
    assert issue[0].duration_us == HostModel(cpu="grace").experts(SMALL_MOE.num_experts // 2, False)
    graphed = traces(tmp_path / "graph", SMALL, ParallelPlan(dp=2), host_cpu="x86",
                     cuda_graph_scope="full_iteration")[0]
    assert not [n for n in graphed.nodes if n.attrs.get("is_cpu_op")]


MOE_SPEC = {"generate": "llm", "num_layers": 2, "hidden_size": 512, "num_heads": 8, "ffn_hidden_size": 256,
            "vocab_size": 1000, "seq_len": 256, "gated_ffn": True, "top_k": 2, "ep": 2, "dp": 2, "micro_batches": 2}


@pytest.mark.parametrize("experts", [4, 64])
def test_host_bound_experts_lengthen_the_step(tmp_path: Path, experts: int) -> None:
    """Many small experts per rank: the host's issue time shows, and more with the dropless sync than without; the
    step never gets shorter with the host."""
    spec = {**MOE_SPEC, "num_experts": experts}
    runs = {}
    for name, extra in (("ideal", {}), ("free", {"host_cpu": "x86"}), ("sync", {"moe_host_sync": True})):
        (tmp_path / name).mkdir()
        runs[name] = finish(tmp_path / name, {**spec, **extra}, 2, 100.0)
    assert runs["ideal"] <= runs["free"] <= runs["sync"]
    if experts == 64:  # 32 local experts: the host issues 2 micro-batches x 2 layers of expert sections at least
        m = HostModel()
        floor_ns = 2 * 2 * 1000 * (m.experts(32, False) + m.experts(32, True))
        assert runs["sync"] - runs["ideal"] > floor_ns // 2


def test_a_gpu_bound_dense_step_hides_the_host(tmp_path: Path) -> None:
    """Large kernels: the host runs ahead and the step is the GPU's (within the first block's issue time)."""
    spec = {"generate": "llm", "num_layers": 2, "hidden_size": 4096, "num_heads": 32, "ffn_hidden_size": 16384,
            "vocab_size": 32000, "seq_len": 4096, "dp": 2, "micro_batches": 2}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ideal = finish(tmp_path / "a", spec, 2, 100.0)
    hosted = finish(tmp_path / "b", {**spec, "host_cpu": "x86"}, 2, 100.0)
    assert ideal <= hosted <= ideal + 1000 * HostModel().attention(False)


@pytest.mark.parametrize("options, message", [
    ({"cuda_graph_scope": "attn"}, "needs the host model"),
    ({"host_cpu": "arm"}, "host CPU must be one of x86, grace"),
    ({"host_cpu": "x86", "cuda_graph_scope": "attn,layers"}, "unknown CUDA graph scope layers: valid are attn"),
    ({"moe_host_sync": True, "cuda_graph_scope": "full"}, "whole-iteration CUDA graph .cuda_graph_scope full."),
    ({"moe_host_sync": True, "cuda_graph_scope": "attn,full_iteration"}, "cuda_graph_scope full_iteration"),
])
def test_bad_host_settings_are_one_line_errors(options: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        TrainingOptions(**options).validate(0, False, 1)


def test_cli_flags() -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["--experts", "4", "--top-k", "2", "--ep", "2", "--dp", "2", "--layers", "2",
                              "--hidden", "256", "--heads", "4", "--ffn-hidden", "512", "--vocab", "1000",
                              "--seq-len", "128", "--moe-host-sync", "--host-cpu", "grace",
                              "--cuda-graph-scope", "attn,moe_router"])
    options = cli.options_from_args(args, cli.plan_from_args(args))
    assert options.moe_host_sync and options.host_cpu == "grace"
    assert options.host() == HostModel(cpu="grace", graph_scopes=frozenset({"attn", "moe_router"}))
    assert replace(options, moe_host_sync=False) != options


def test_expert_gemms_run_per_expert_on_four_streams(tmp_path: Path) -> None:
    """Transformer Engine's GroupedLinear: one GEMM per local expert, four streams; a single local expert is one
    plain GEMM."""
    rank = traces(tmp_path, replace(SMALL_MOE, num_experts=8), ParallelPlan(dp=2, ep=2))[0]
    experts = [n for n in rank.compute() if ".expert_" in n.name]
    assert experts and all(n.attrs["gemm_batch"] == 4 and n.attrs["gemm_streams"] == GROUPED_GEMM_STREAMS
                           for n in experts)
    single = traces(tmp_path / "one", replace(SMALL_MOE, num_experts=2), ParallelPlan(dp=2, ep=2))[0]
    assert all("gemm_streams" not in n.attrs for n in single.compute() if ".expert_" in n.name)


@pytest.mark.parametrize("overlap", [False, True])
def test_dispatch_gradient_waits_for_the_experts_weight_gradient(tmp_path: Path, overlap: bool) -> None:
    """Stream order: the autograd engine issues the dispatch's backward after the grouped GEMMs' backward returns,
    weight gradient included; Megatron's delayed weight gradient (with the EP A2A overlap) lets it go first. The
    input gradient reaches it through the backward of the sort by local expert (2 local experts here), which runs
    after the input gradient, and before the weight gradient when that is delayed."""
    rank = traces(tmp_path, SMALL_MOE, ParallelPlan(dp=2, ep=2, num_micro_batches=2), moe_a2a_overlap=overlap)[0]
    names = {n.id: n.name for n in rank.nodes}
    by_id = {n.id: n for n in rank.nodes}
    exchanges = [n for n in rank.nodes if n.name.endswith("dispatch_grad_alltoall")]
    assert len(exchanges) == SMALL_MOE.num_layers * 2
    for n in exchanges:
        waits = {names[d].rsplit(".", 1)[1] for d in n.deps}
        assert "sort_chunks" in waits
        sort = next(by_id[d] for d in n.deps if names[d].endswith(".sort_chunks"))
        assert {names[d].rsplit(".", 1)[1] for d in sort.deps} >= {"expert_in_dgrad"}
        assert ("expert_in_wgrad" in waits) is not overlap
        wgrad = next(m for m in rank.nodes if m.name == n.name.replace("dispatch_grad_alltoall", "expert_in_wgrad"))
        assert (sort.id < wgrad.id) is overlap


def test_overlapped_backward_runs_while_the_host_waits_for_the_counts(tmp_path: Path) -> None:
    """Megatron-Core's combined 1F1B issues one micro-batch's expert backward before the other's dispatch, whose
    call holds the dropless dispatcher's wait, and that backward's dispatch after it (model_chunk_schedule_plan.py):
    with the EP A2A overlap the backward's expert kernels come before the forward's wait, so the GPU has them to run
    meanwhile, and the backward's dispatch waits for the host to be back from the forward's; without the overlap a
    pass runs alone and nothing is queued behind the wait."""
    plan = ParallelPlan(dp=2, ep=2, num_micro_batches=3)
    for overlap in (False, True):
        rank = traces(tmp_path / str(overlap), SMALL_MOE, plan, moe_host_sync=True, moe_a2a_overlap=overlap)[0]
        by_id = {n.id: n for n in rank.nodes}
        syncs = [n for n in rank.nodes if n.name.endswith(".dispatch_issue")]
        assert syncs
        paired = 0
        for sync in syncs:
            router = next(n for n in rank.nodes if n.name == sync.name.replace("dispatch_issue", "router"))
            between = [n for n in rank.compute() if router.id < n.id < sync.id and not n.attrs.get("is_cpu_op")]
            paired += any(".bwd." in n.name and ".expert_" in n.name for n in between)
        # with one stage every forward but the first runs beside the previous micro-batch's backward
        assert paired == (SMALL_MOE.num_layers * (plan.num_micro_batches - 1) if overlap else 0)
        exchanges = [n for n in rank.nodes if n.name.endswith("dispatch_grad_alltoall")]
        waits_for_host = [n for n in exchanges if any(by_id[d].attrs.get("is_cpu_op") for d in n.deps)]
        assert len(waits_for_host) == (len(exchanges) if overlap else 0)
