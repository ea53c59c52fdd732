"""Context parallelism, expert tensor parallelism, FP8 and recompute in ``trace generate llm``: groups, the
communication each adds, and FLOP totals that stay those of the unsplit iteration."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from network.config import network_from_dict
from simulator.api import simulate
from simulator.config import DEFAULT_SYSTEM, system_from_dict
from tests.workload.test_llm import SMALL, SMALL_GPT, SMALL_MOE, load
from workload.errors import InputError
from workload.llm.build import build_programs
from workload.llm.emit import generate_traces
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan, RankMap
from workload.llm.sizes import tensor_params
from workload.llm.summary import stage_flops, summarize
from workload.schema import CollectiveType, NodeType

AR, AG, RS, A2A = (int(CollectiveType.ALL_REDUCE), int(CollectiveType.ALL_GATHER),
                   int(CollectiveType.REDUCE_SCATTER), int(CollectiveType.ALL_TO_ALL))
LONG = replace(SMALL, name="long", seq_len=256)


def flops(model: Any, plan: ParallelPlan, options: TrainingOptions | None = None) -> dict[str, int]:
    plan.validate(model)
    programs = build_programs(model, plan, options)
    return summarize(model, plan, programs, RankMap(plan, model), options=options)["flops"]


def exact_flops(model: Any, plan: ParallelPlan) -> tuple[int, int]:
    """The iteration's matmul and attention-score FLOPs (as test_llm's test_flops_per_iteration_against_6pt)."""
    tokens = plan.global_batch * model.seq_len
    padded = (plan.padded_vocab(model) - model.vocab_size) * model.hidden_size
    return (6 * (model.matmul_params() + padded) * tokens,
            6 * model.num_layers * model.num_heads * model.head_size * (model.seq_len + 1) * tokens)


# --- FLOPs ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "plan", "options"), [
    (LONG, dict(dp=2, cp=2, num_micro_batches=2), {}),
    (LONG, dict(cp=4, tp=2, num_micro_batches=1, cp_comm_type="all_gather"), {}),
    (LONG, dict(cp=2, tp=2, num_micro_batches=1, cp_comm_type="a2a"), {}),
    (LONG, dict(cp=2, tp=2, pp=2, vp=2, num_micro_batches=2, sequence_parallel=True), {"tp_comm_overlap": True}),
    (replace(LONG, num_experts=4, top_k=2), dict(dp=4, tp=2, cp=2, ep=4, etp=1, num_micro_batches=1,
                                                 sequence_parallel=True), {"precision": "fp8"}),
    (SMALL_GPT, dict(tp=2, pp=2, vp=2, num_micro_batches=4, zero_stage=1), {"iteration_tail": True}),
], ids=["cp-p2p", "cp-allgather", "cp-a2a", "vp-overlap", "moe-etp-fp8", "gpt-vp-tail"])
def test_flops_are_the_unsplit_iterations(model: Any, plan: dict, options: dict) -> None:
    """Every way of splitting the work keeps the matmul and attention-score FLOPs of the whole iteration, exactly
    (context parallelism's load-balanced chunks: n(s + 1) pairs per rank), and 6PT does not move."""
    p = ParallelPlan(**plan)
    got = flops(model, p, TrainingOptions(**options))
    matmul, attention = exact_flops(model, p)
    assert got["matmul"] == matmul and got["attention"] == attention
    assert got["recompute"] == 0


def test_recompute_counts_apart_and_selective_is_the_attention_core() -> None:
    """Selective recompute adds exactly one attention-core forward per layer and micro-batch; full adds the layer's
    forward; both are reported as recompute and leave the forward/backward FLOPs and 6PT as they were."""
    plan = ParallelPlan(tp=2, cp=2, pp=2, num_micro_batches=3, sequence_parallel=True)
    base = flops(LONG, plan)
    selective = flops(LONG, replace(plan, recompute="selective"))
    full = flops(LONG, replace(plan, recompute="full"))
    _, attention = exact_flops(LONG, plan)
    by_kind: Counter[tuple[str, str]] = Counter()
    for program in build_programs(LONG, replace(plan, recompute="selective")):
        by_kind.update(stage_flops(program))
    per_stage = plan.dp * plan.tp * plan.cp
    assert by_kind["recompute", "attention"] * per_stage == attention // 3  # the forward third of fwd + bwd
    assert by_kind["recompute", "matmul"] == 0
    assert selective["total"] - selective["recompute"] == base["total"]
    matmul, _ = exact_flops(LONG, plan)
    lookup_head = 6 * LONG.vocab_size * LONG.hidden_size * plan.global_batch * LONG.seq_len
    assert full["recompute"] > selective["recompute"] and full["total"] - full["recompute"] == base["total"]
    assert full["matmul"] - base["matmul"] == (matmul - lookup_head) // 3  # every layer GEMM once more, not the head
    programs = build_programs(LONG, replace(plan, recompute="selective"))
    recomputed = {op.name.split(".")[-1] for p in programs for op in p.ops if op.phase == "recompute"}
    assert recomputed == {"attention_step0", "attention_step1", "attention_correction", "cp_kv0_send",
                          "cp_kv0_recv"}  # the ring attention again, with its communication


def test_recompute_modules_run_again_what_they_name_and_nothing_else() -> None:
    """Megatron-Core's --recompute-modules: layernorm runs both norms' forwards again (when their block's backward
    starts), moe_act the experts' activation (before the second expert GEMM's backward), core_attn the attention
    core; the forward and backward are unchanged, and selective recompute without modules is core_attn."""
    plan = ParallelPlan(ep=2, dp=2, num_micro_batches=2, recompute="selective")

    def again(p: ParallelPlan) -> Counter[str]:
        return Counter(op.name.split(".")[-1] for prog in build_programs(SMALL_MOE, p) for op in prog.ops
                       if op.phase == "recompute")

    layers, mbs = SMALL_MOE.num_layers, plan.num_micro_batches
    assert again(plan) == again(replace(plan, recompute_modules=("core_attn",))) == Counter({"attention": layers * mbs})
    assert again(replace(plan, recompute_modules=("layernorm", "moe_act"))) == Counter(
        {"attn_norm": layers * mbs, "mlp_norm": layers * mbs, "activation": layers * mbs})
    base = flops(SMALL_MOE, replace(plan, recompute="none"))
    some = flops(SMALL_MOE, replace(plan, recompute_modules=("layernorm", "moe_act")))
    assert some["total"] - some["recompute"] == base["total"] and some["recompute"] > 0
    order = [op.name for prog in build_programs(SMALL_MOE, replace(plan, recompute_modules=("moe_act",)))
             for op in prog.ops if op.name.startswith("mb0.") and ".layer1." in op.name]
    assert order.index("mb0.recompute.layer1.activation") < order.index("mb0.bwd.layer1.expert_out_wgrad")


# --- context parallelism -------------------------------------------------------------------------------------

def test_context_parallel_groups_and_gradients(tmp_path: Path) -> None:
    """cp ranks sit right after tp (Megatron's order); dense gradients are reduced over data x context ranks."""
    plan = ParallelPlan(dp=2, tp=2, cp=2, num_micro_batches=1)
    rm = RankMap(plan, LONG)
    assert rm.group(0, "cp").ranks == (0, 2) and rm.group(1, "cp").ranks == (1, 3)
    assert rm.group(0, "dpcp").ranks == (0, 2, 4, 6) and rm.group(0, "dp").ranks == (0, 4)
    prefix = str(tmp_path / "t")
    generate_traces(LONG, plan, prefix)
    t = load(prefix, 0, 8)
    grads = [n for n in t.collectives() if "_dpcp_grad_" in n.name and "layer" in n.name]
    assert grads and {t.members(n) for n in grads} == {(0, 2, 4, 6)}
    assert {n.attrs["comm_size"] for n in grads} == {2 * LONG.layer_params(tp=2).dense}


def test_ring_attention_sends_kv_blocks_around_the_cp_ring(tmp_path: Path) -> None:
    """p2p: per layer, cp - 1 K/V blocks forward; cp - 1 K/V blocks and cp K/V-gradient blocks backward, all to the
    next cp rank and from the previous one, each the rank's K and V (b x s/cp x kv heads/tp x head size x 2 x 2 B);
    every send has its receive."""
    cp, tp = 4, 2
    plan = ParallelPlan(tp=tp, cp=cp, num_micro_batches=1)
    prefix = str(tmp_path / "t")
    generate_traces(LONG, plan, prefix)
    kv_bytes = 2 * (LONG.seq_len // cp) * (LONG.kv_heads // tp) * LONG.head_size * 2
    rm = RankMap(plan, LONG)
    sends, recvs = Counter(), Counter()
    for rank in range(plan.world_size):
        t = load(prefix, rank, plan.world_size)
        mine = [n for n in t.nodes if n.type == NodeType.COMM_SEND_NODE]
        fwd = [n for n in mine if ".fwd.layer0." in n.name]
        bwd = [n for n in mine if ".bwd.layer0." in n.name]
        assert len(fwd) == cp - 1 and len(bwd) == (cp - 1) + cp
        assert {n.attrs["comm_size"] for n in fwd + bwd} == {kv_bytes}
        nxt = rm.rank(dp=0, tp=rm.coord(rank, "tp"), pp=0, cp=(rm.coord(rank, "cp") + 1) % cp)
        assert {n.attrs["comm_dst"] for n in mine} == {nxt}
        for n in t.nodes:
            key = (n.attrs.get("comm_src"), n.attrs.get("comm_dst"), n.attrs.get("comm_tag"))
            if n.type == NodeType.COMM_SEND_NODE:
                sends[key] += 1
            elif n.type == NodeType.COMM_RECV_NODE:
                recvs[key] += 1
        steps = [n for n in t.compute() if n.name.startswith("mb0.fwd.layer0.attention_step")]
        assert len(steps) == cp
        for i, step in enumerate(steps[1:]):  # each later step attends to the block the previous receive brought
            (parent,) = step.deps - {d for d in step.deps if t.by_id(d).type == NodeType.COMP_NODE}
            assert t.by_id(parent).name == f"mb0.fwd.layer0.cp_kv{i}_recv"
    assert sends == recvs and max(sends.values()) == 1


@pytest.mark.parametrize(("kind", "forward", "backward"), [
    ("all_gather", {AG}, {AG, RS}), ("a2a", {A2A}, {A2A})])
def test_other_cp_comm_types(tmp_path: Path, kind: str, forward: set, backward: set) -> None:
    cp, tp = 2, 2
    plan = ParallelPlan(tp=tp, cp=cp, num_micro_batches=1, cp_comm_type=kind)
    prefix = str(tmp_path / "t")
    generate_traces(LONG, plan, prefix)
    t = load(prefix, 0, 4)
    cp_colls = [n for n in t.collectives() if ".cp_" in n.name]
    assert {t.members(n) for n in cp_colls} == {(0, 2)}
    assert {n.attrs["comm_type"] for n in cp_colls if ".fwd.layer0." in n.name} == forward
    assert {n.attrs["comm_type"] for n in cp_colls if ".bwd.layer0." in n.name} == backward
    tokens = LONG.seq_len // cp
    q, kv = tokens * 4 * 32 * 2, 2 * tokens * 2 * 32 * 2  # 8/2 query heads, 4/2 kv heads of 32, bf16
    sizes = {n.name.split(".")[-1]: n.attrs["comm_size"] for n in cp_colls if ".layer0." in n.name}
    if kind == "all_gather":
        assert sizes == {"cp_kv_allgather": kv, "cp_dkv_reducescatter": cp * kv}
    else:
        assert sizes == {"cp_qkv_alltoall": q + kv, "cp_out_alltoall": q, "cp_dout_alltoall": q,
                         "cp_dqkv_alltoall": q + kv}


def test_context_parallel_shrinks_what_a_rank_sends_and_computes(tmp_path: Path) -> None:
    plan = ParallelPlan(tp=2, pp=2, num_micro_batches=2, sequence_parallel=True)
    base = build_programs(LONG, plan)
    split = build_programs(LONG, replace(plan, cp=2))
    pp_send = {op.size_bytes for op in base[0].ops if op.name.endswith("send_activation")}
    assert {op.size_bytes for op in split[0].ops if op.name.endswith("send_activation")} == {min(pp_send) // 2}
    assert sum(stage_flops(split[0]).values()) < 0.55 * sum(stage_flops(base[0]).values())


# --- experts --------------------------------------------------------------------------------------------------

def test_expert_tensor_parallel_groups_follow_megatron() -> None:
    """Within a stage the expert layout is etp-ep-edp over the ranks' tp-cp-dp index: etp=1 with tp=2, ep=4 on
    dp=4 makes each expert group span tensor- and data-parallel ranks."""
    moe = replace(SMALL_MOE, num_experts=8)
    plan = ParallelPlan(dp=4, tp=2, ep=4, etp=1, sequence_parallel=True)
    plan.validate(moe)
    rm = RankMap(plan, moe)
    assert rm.group(0, "ep").ranks == (0, 1, 2, 3) and rm.group(0, "edp").ranks == (0, 4)
    assert rm.group(0, "etp") is None
    plan = ParallelPlan(dp=4, tp=2, ep=2)  # etp = tp: as before, experts over dp ranks 0, 1 of each tp index
    rm = RankMap(plan, moe)
    assert rm.group(0, "ep").ranks == (0, 2) and rm.group(0, "edp").ranks == (0, 4)
    assert rm.group(0, "etp").gid == rm.group(0, "tp").gid  # the same group, one number


def test_alltoall_dispatch_sends_local_tokens_and_gathers_over_expert_tp(tmp_path: Path) -> None:
    """Sequence parallel: a rank dispatches its own b x s/tp tokens x top-k; with etp > 1 the expert ranks
    all-gather them and reduce-scatter the results; expert weights are split etp ways."""
    moe = replace(SMALL_MOE, num_experts=4)
    plan = ParallelPlan(dp=2, tp=2, ep=2, etp=2, sequence_parallel=True)
    prefix = str(tmp_path / "t")
    generate_traces(moe, plan, prefix)
    t = load(prefix, 0, 4)
    local = moe.seq_len // 2 * moe.top_k * moe.hidden_size * 2
    assert {n.attrs["comm_size"] for n in t.collectives(A2A)} == {local}
    gathers = [n for n in t.collectives(AG) if "expert" in n.name]
    scatters = [n for n in t.collectives(RS) if "expert" in n.name]
    assert {n.attrs["comm_size"] for n in gathers} == {local}
    assert {n.attrs["comm_size"] for n in scatters} == {2 * local}
    assert {t.members(n) for n in gathers + scatters} == {(0, 1)}
    assert 2 * moe.layer_params(tp=2, ep=2, etp=2).expert == moe.layer_params(tp=2, ep=2, etp=1).expert


@pytest.mark.parametrize("model", [SMALL, SMALL_GPT, SMALL_MOE])
def test_tensor_params_add_up_to_the_layer(model: Any) -> None:
    for tp, ep, etp in ((1, 1, None), (2, 1, None), (2, 2, 1), (4, 4, 2)):
        if ep > 1 and not model.is_moe:
            continue
        plan = ParallelPlan(tp=tp, ep=ep, etp=etp, dp=4)
        layer = model.layer_params(tp, ep, plan.expert_tp)
        pieces = tensor_params(model, plan)
        assert sum(n for buf, n in pieces.values() if buf == "dense") == layer.dense
        assert sum(n for buf, n in pieces.values() if buf == "expert") == layer.expert


# --- precision ---------------------------------------------------------------------------------------------

def test_fp8_gemms_and_what_travels_in_fp8(tmp_path: Path) -> None:
    """precision fp8: the layers' GEMMs carry dtype fp8 (the output layer stays bf16); the sequence-parallel
    all-gathers of GEMM inputs carry 1 byte per value, the reduce-scatters and the head's gather 2; gradients go in
    fp32 with grad_reduce_in_fp32 and parameters in FP8 with fp8_param_gather."""
    plan = ParallelPlan(dp=2, tp=2, num_micro_batches=1, sequence_parallel=True, zero_stage=1)
    base, fp8 = str(tmp_path / "b"), str(tmp_path / "f")
    generate_traces(SMALL, plan, base)
    generate_traces(SMALL, plan, fp8, options=TrainingOptions(precision="fp8", grad_reduce_in_fp32=True,
                                                              fp8_param_gather=True))
    b, f = load(base, 0, 4), load(fp8, 0, 4)
    gemms = [n for n in f.compute() if n.attrs.get("op_class") == "gemm"]
    assert {n.attrs["dtype"] for n in gemms if "lm_head" not in n.name} == {"fp8"}
    assert {n.attrs["dtype"] for n in gemms if "lm_head" in n.name} == {"bf16"}
    assert {n.attrs["dtype"] for n in b.compute() if n.attrs.get("op_class") == "gemm"} == {"bf16"}

    def sizes(t: Any, kind: int, part: str) -> set[int]:
        return {n.attrs["comm_size"] for n in t.collectives(kind) if part in n.name}

    act = SMALL.seq_len // 2 * SMALL.hidden_size
    assert sizes(f, AG, "layer0.attn") == {act} and sizes(b, AG, "layer0.attn") == {2 * act}
    assert sizes(f, RS, "layer0.mlp") == sizes(b, RS, "layer0.mlp") == {2 * 2 * act}
    assert sizes(f, AG, "head") == {2 * act}
    grads_b, grads_f = sizes(b, RS, "_dp_grad_reducescatter"), sizes(f, RS, "_dp_grad_reducescatter")
    assert {2 * g for g in grads_b} == grads_f
    params_b, params_f = sizes(b, AG, "layer1_dp_param"), sizes(f, AG, "layer1_dp_param")
    layer = SMALL.layer_params(tp=2)
    assert params_b == {-(-layer.dense // 2) * 2}
    assert params_f == {-(-(layer.dense_matmul + 2 * (layer.dense - layer.dense_matmul)) // 2)}


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), dp=st.sampled_from([2, 4, 8]),
       ep=st.sampled_from([2, 4, 8]), etp_one=st.booleans(), domain=st.sampled_from([1, 2, 4, 8]),
       overlap=st.booleans())
def test_flex_exchange_over_nvlink_domains_pairs_on_every_plan(tmp_path_factory: pytest.TempPathFactory, tp: int,
                                                               pp: int, dp: int, ep: int, etp_one: bool,
                                                               domain: int, overlap: bool) -> None:
    """Where the ep groups split over NVLink domains, every ep group's ranks fall into equal epd groups (one per
    domain) and epx groups (one per place), each rank in one of each; the traces simulate to the end (the two
    stages' collectives pair up on every rank), with the EP A2A overlap too."""
    moe = replace(SMALL_MOE, num_experts=8, top_k=2)
    etp = 1 if etp_one else None
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp, ep=ep, etp=etp, vp=pp, num_micro_batches=4, sequence_parallel=tp > 1)
    options = TrainingOptions(moe_dispatcher="flex", nvlink_domain=domain, moe_a2a_overlap=overlap)
    try:
        plan.validate(moe)
        options.validate(plan.zero_stage, plan.sequence_parallel, plan.tp)
    except InputError:
        return
    rm = options.rank_map(plan, moe)
    split = rm.expert_domains()
    for rank in range(plan.world_size):
        ep_group, near, far = rm.group(rank, "ep"), rm.group(rank, "epd"), rm.group(rank, "epx")
        if split is None or ep_group is None:
            assert near is None and far is None
            continue
        domains, per_domain = split
        assert (near is not None) == (per_domain > 1) and (far is not None) == (domains > 1)
        if near is not None:
            assert set(near.ranks) <= set(ep_group.ranks) and {r // domain for r in near.ranks} == {rank // domain}
        if far is not None:
            assert set(far.ranks) <= set(ep_group.ranks) and len({r // domain for r in far.ranks}) == domains
    prefix = str(tmp_path_factory.mktemp("flex") / "t")
    generate_traces(moe, plan, prefix, options=options)
    net = network_from_dict({"topology": ["Switch"], "npus_count": [plan.world_size], "bandwidth": [50.0],
                             "latency": [500.0]})
    result = simulate(prefix, net, system_from_dict({**DEFAULT_SYSTEM, "roofline-enabled": 1}), device="H100",
                      comm_streams="communicator")
    assert result.finish_ns > 0
