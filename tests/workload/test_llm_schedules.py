"""Pipeline schedules of ``trace generate llm``: Megatron-LM's interleaved 1F1B (virtual stages), its bubble on a
compute-only trace, model chunks and their sends, uneven first and last stages."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from compute.devices import device
from compute.roofline import Roofline
from network.config import network_from_dict
from simulator.api import simulate
from simulator.config import DEFAULT_SYSTEM, system_from_dict
from tests.workload.test_llm import SMALL, load
from workload.errors import InputError
from workload.llm.build import build_programs
from workload.llm.emit import TraceEmitter, generate_traces
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan, RankMap
from workload.llm.schedules import (
    interleaved,
    merged_pairs,
    one_f_one_b,
    schedule_table,
    stage_receive_points,
    stage_schedule,
)
from workload.schema import NodeType

# wide layers and a tiny vocabulary: the embedding, final norm and head cost < 0.5% of a model chunk, so the stages
# are equal and the bubble is the schedule's alone
WIDE = ModelConfig(name="wide", num_layers=8, hidden_size=4096, num_heads=32, ffn_hidden_size=16384, vocab_size=64,
                   seq_len=1024)
H100 = device("H100")
ROOFLINE = Roofline(H100.peak_tflops * 1e12, H100.memory_bw_GBps * 1e9)


def test_schedule_table_is_megatrons() -> None:
    """Megatron-Core's own example (schedules.py): PP 2, 5 micro-batches in groups of 3, VP 2."""
    table = schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [chunk for _, chunk in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize(("pp", "stage", "m", "vp", "warmup"), [
    (4, 0, 8, 2, 3 * 2 + 4), (4, 3, 8, 2, 4), (4, 1, 4, 3, 2 * 2 + 2 * 4), (2, 0, 2, 2, 2 + 2), (4, 0, 4, 4, 4 * 4)])
def test_interleaved_warmup_then_alternating_then_cooldown(pp: int, stage: int, m: int, vp: int, warmup: int) -> None:
    """(pp - stage - 1) x 2 + (vp - 1) x pp warm-up forwards (all of them at most), then one forward and one
    backward at a time, the backwards walking the table with the chunks reversed."""
    order = interleaved(pp, stage, m, vp, pp)
    total = m * vp
    warmup = min(warmup, total)
    assert all(kind == "F" for kind, _, _ in order[:warmup])
    steady = order[warmup:warmup + 2 * (total - warmup)]
    assert [kind for kind, _, _ in steady] == ["F", "B"] * (total - warmup)
    assert all(kind == "B" for kind, _, _ in order[warmup + 2 * (total - warmup):])
    table = schedule_table(m, vp, pp)
    assert [(mb, c) for kind, mb, c in order if kind == "F"] == table
    assert [(mb, vp - 1 - c) for kind, mb, c in order if kind == "B"] == table


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5), st.integers(0, 4), st.integers(1, 4), st.integers(1, 4), st.integers(0, 3))
def test_interleaved_schedule_properties(pp: int, stage: int, vp: int, groups: int, extra: int) -> None:
    stage %= pp
    m = pp * groups + (extra if extra == 0 or extra >= pp else 0)
    order = stage_schedule(pp, stage, m, vp, pp)
    steps = [(kind, mb, c) for kind, mb, c in order]
    assert sorted(steps) == sorted((k, mb, c) for k in "FB" for mb in range(m) for c in range(vp))
    seen = {}
    for i, step in enumerate(steps):
        seen[step] = i
    for mb in range(m):
        for c in range(vp):
            assert seen["F", mb, c] < seen["B", mb, c]
            if c:  # a micro-batch's chunks run forward in order, backward in reverse
                assert seen["F", mb, c - 1] < seen["F", mb, c] and seen["B", mb, c] < seen["B", mb, c - 1]
    if vp == 1:
        assert [(k, mb) for k, mb, _ in order] == one_f_one_b(pp, stage, m)


def test_receives_are_posted_where_megatron_posts_them() -> None:
    """Interleaved (pp 2, vp 2, 4 micro-batches): a forward's receive comes after the previous forward, a
    backward's after the previous backward, the first backward's after the last warm-up forward; 1F1B: after the
    step before."""
    def named(stage: int, vp: int) -> list[tuple[str, str]]:
        order = [f"{k}{mb}c{c}" for k, mb, c in stage_schedule(2, stage, 4, vp, 2)]
        points = stage_receive_points(2, stage, 4, vp, 2)
        return [(step, order[j] if j >= 0 else "start") for step, j in zip(order, points, strict=True)]
    assert named(1, 2) == [
        ("F0c0", "start"), ("F1c0", "F0c0"), ("F0c1", "F1c0"), ("B0c1", "F1c0"), ("F1c1", "F0c1"), ("B1c1", "B0c1"),
        ("F2c0", "F1c1"), ("B0c0", "B1c1"), ("F3c0", "F2c0"), ("B1c0", "B0c0"), ("F2c1", "F3c0"), ("B2c1", "B1c0"),
        ("F3c1", "F2c1"), ("B3c1", "B2c1"), ("B2c0", "B3c1"), ("B3c0", "B2c0")]
    assert named(0, 2)[4:6] == [("F2c0", "F1c1"), ("B0c1", "F1c1")]  # 4 warm-up forwards
    assert named(0, 1) == [("F0c0", "start"), ("F1c0", "F0c0"), ("B0c0", "F1c0"), ("F2c0", "B0c0"), ("B1c0", "F2c0"),
                           ("F3c0", "B1c0"), ("B2c0", "F3c0"), ("B3c0", "B2c0")]


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([1, 2]), st.integers(2, 4), st.integers(1, 3), st.integers(1, 2), st.booleans())
def test_generated_pipelines_run_under_rendezvous(tp: int, pp: int, vp: int, groups: int, sp: bool) -> None:
    """Every send of a generated pipeline meets a posted receive under --rendezvous-protocol (a send then waits
    for its receive and holds the rank's one communication slot, as in ASTRA-sim): interleaved with tensor
    parallelism deadlocked when a backward's receive waited behind a forward's collectives (QA R2: llama3-8b, 4
    layers, tp2 pp2 vp2, and ASTRA-sim 2.x stops there on the same traces), while Megatron posts it earlier."""
    model = replace(SMALL, num_layers=pp * vp)
    plan = ParallelPlan(tp=tp, pp=pp, vp=vp, num_micro_batches=pp * groups, sequence_parallel=sp and tp > 1)
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        generate_traces(model, plan, folder + "/t")
        network = network_from_dict({"topology": ["Ring"], "npus_count": [tp * pp], "bandwidth": [50.0],
                                     "latency": [500.0]})
        system = system_from_dict({**DEFAULT_SYSTEM, "roofline-enabled": 1})
        eager = simulate(folder + "/t", network, system, device="H100")
        rendezvous = simulate(folder + "/t", network, system, device="H100", rendezvous=True)
    assert rendezvous.finish_ns > eager.finish_ns


def test_model_chunks_hold_megatrons_layers() -> None:
    """Megatron-LM's example: 8 layers on 2 stages: vp 4 gives stage 0 layers 0, 2, 4, 6 (one per chunk), vp 2 gives
    stage 0 [0, 1] [4, 5] and stage 1 [2, 3] [6, 7]."""
    plan = ParallelPlan(pp=2, vp=4, num_micro_batches=2)
    assert [list(plan.chunk_layers(8, 0, c)) for c in range(4)] == [[0], [2], [4], [6]]
    plan = replace(plan, vp=2)
    assert [list(plan.chunk_layers(8, s, c)) for s in range(2) for c in range(2)] == [[0, 1], [4, 5], [2, 3], [6, 7]]


def test_interleaved_traces_send_around_the_ring_and_match(tmp_path: Path) -> None:
    """Chunk c of the last stage sends to chunk c + 1 of the first (a send from the last rank to the first); every
    send has its receive; each stage runs its chunks' layers in the schedule's order."""
    model = replace(SMALL, num_layers=8)
    plan = ParallelPlan(dp=2, pp=2, vp=2, num_micro_batches=4)
    prefix = str(tmp_path / "t")
    generate_traces(model, plan, prefix)
    sends, recvs = [], []
    ranks = RankMap(plan, model)
    for rank in range(plan.world_size):
        t = load(prefix, rank, plan.world_size)
        for n in t.nodes:
            key = (n.attrs.get("comm_src"), n.attrs.get("comm_dst"), n.attrs.get("comm_tag"), n.attrs.get("comm_size"))
            if n.type == NodeType.COMM_SEND_NODE:
                sends.append(key)
            elif n.type == NodeType.COMM_RECV_NODE:
                recvs.append(key)
        order = []
        for n in t.compute():
            if ".layer" in n.name and ".fwd." in n.name:
                layer = int(n.name.split(".layer")[1].split(".")[0])
                mb = int(n.name[2:n.name.index(".")])
                if not order or order[-1] != (mb, layer):
                    order.append((mb, layer))
        stage = ranks.coords(rank)[2]
        chunks = [plan.chunk_layers(8, stage, c) for c in range(2)]
        expected = [(mb, layer) for kind, mb, c in stage_schedule(2, stage, 4, 2, 2) if kind == "F"
                    for layer in chunks[c]]
        assert order == expected
    assert sorted(sends) == sorted(recvs) and len(set(sends)) == len(sends)
    # per replica: 3 chunk boundaries (s0c0 -> s1c0 -> s0c1 -> s1c1), activations and gradients, 4 micro-batches
    assert len(sends) == 2 * 3 * 4 * 2
    # the last stage sends chunk 0's activations forward to the first stage's chunk 1, besides both chunks' gradients
    back = [(s, d) for s, d, _, _ in sends if ranks.coords(s)[2] == 1 and ranks.coords(d)[2] == 0]
    assert len(back) == (1 + 2) * 4 * 2


def _bubble(pp: int, vp: int, m: int) -> float:
    """(step - ideal) / ideal of a compute-only run: every message takes 0 ns, the optimizer step left out."""
    model = replace(WIDE, num_layers=pp * vp * 2)
    plan = ParallelPlan(pp=pp, vp=vp, num_micro_batches=m)
    plan.validate(model)
    programs = build_programs(model, plan)
    traces = TraceEmitter(programs, RankMap(plan, model))
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        traces.write(folder + "/t")
        network = network_from_dict({"topology": ["Switch"], "npus_count": [pp], "bandwidth": [1e9],
                                     "latency": [0.0]})
        result = simulate(folder + "/t", network, system_from_dict({**DEFAULT_SYSTEM, "roofline-enabled": 1}),
                          device="H100", engine="message")
    optimizer = [ROOFLINE.time_ns(op.kernel.flops, op.kernel.size_bytes) for p in programs for op in p.ops
                 if op.name == "optimizer" and op.kernel is not None]
    ideal = max(r.compute_ns - o for r, o in zip(result.ranks, optimizer, strict=True))
    step = max(r.finish_ns for r in result.ranks) - max(optimizer)
    return (step - ideal) / ideal


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([2, 3, 4]), st.sampled_from([1, 2, 3, 4]), st.integers(1, 3))
def test_bubble_is_pp_minus_1_over_vp_m(pp: int, vp: int, groups: int) -> None:
    """The issue's property: with equal stages and no communication time the idle bubble is (pp - 1) / (vp x m) of
    the ideal step within 1% (interleaved), (pp - 1) / m without interleaving."""
    m = pp * groups
    assert _bubble(pp, vp, m) == pytest.approx((pp - 1) / (vp * m), rel=0.01)


def test_interleaving_shrinks_the_simulated_step(tmp_path: Path) -> None:
    """The same model and batch on 4 stages with real links: 2 virtual stages run the iteration faster."""
    model = replace(SMALL, num_layers=8, seq_len=512, hidden_size=1024, ffn_hidden_size=4096)
    times = {}
    for vp in (1, 2):
        plan = ParallelPlan(pp=4, vp=vp, num_micro_batches=4)
        generate_traces(model, plan, str(tmp_path / f"v{vp}"))
        net = network_from_dict({"topology": ["Ring"], "npus_count": [4], "bandwidth": [200.0], "latency": [500.0]})
        times[vp] = simulate(str(tmp_path / f"v{vp}"), net, system_from_dict({**DEFAULT_SYSTEM,
                                                                               "roofline-enabled": 1}),
                             device="H100").finish_ns
    assert times[2] < times[1]


# --- uneven stages ----------------------------------------------------------------------------------------

def test_first_and_last_stage_layer_counts_as_megatron() -> None:
    """--decoder-first/last-pipeline-num-layers: the given counts, the other stages split the rest evenly; with
    virtual stages every stage's layers split over its chunks."""
    plan = ParallelPlan(pp=4, first_stage_layers=6, last_stage_layers=5)
    assert plan.stage_layer_counts(31) == [6, 10, 10, 5]
    assert ParallelPlan(pp=2, last_stage_layers=3).stage_layer_counts(10) == [7, 3]
    programs = build_programs(replace(SMALL, num_layers=31), plan)
    assert [len(p.layers) for p in programs] == [6, 10, 10, 5]
    assert [x for p in programs for x in p.layers] == list(range(31))
    plan = ParallelPlan(pp=4, vp=2, num_micro_batches=4, first_stage_layers=2, last_stage_layers=2)
    plan.validate(replace(SMALL, num_layers=16))
    chunks = [list(plan.chunk_layers(16, s, c)) for c in range(2) for s in range(4)]
    assert chunks == [[0], [1, 2, 3], [4, 5, 6], [7], [8], [9, 10, 11], [12, 13, 14], [15]]


def test_embedding_and_loss_accounted_in_the_pipeline_split() -> None:
    """Megatron-Core's account_for_embedding/loss_in_pipeline_split: layers + 2 places split equally over the
    virtual stages, the embedding taking one in the first chunk of the first stage and the loss one in the last
    chunk of the last stage (Llama 3.1 405B: 126 layers on 8 x 8 virtual stages of 2 places)."""
    plan = ParallelPlan(pp=8, vp=8, num_micro_batches=16, account_for_embedding=True, account_for_loss=True)
    plan.validate(replace(SMALL, num_layers=126))
    assert plan.stage_layer_counts(126) == [15, 16, 16, 16, 16, 16, 16, 15]
    chunks = [list(plan.chunk_layers(126, s, c)) for c in range(8) for s in range(8)]
    assert [x for chunk in chunks for x in chunk] == list(range(126))
    assert chunks[0] == [0] and chunks[-1] == [125] and all(len(c) == 2 for c in chunks[1:-1])
    plan = ParallelPlan(pp=2, account_for_loss=True)
    assert plan.stage_layer_counts(7) == [4, 3]
    programs = build_programs(replace(SMALL, num_layers=7), plan)
    assert [list(p.layers) for p in programs] == [[0, 1, 2, 3], [4, 5, 6]]
    # a chunk of the embedding alone (no transformer layer) runs
    plan = ParallelPlan(pp=2, vp=2, num_micro_batches=2, account_for_embedding=True, account_for_loss=True)
    plan.validate(replace(SMALL, num_layers=2))
    assert [list(plan.chunk_layers(2, s, c)) for c in range(2) for s in range(2)] == [[], [0], [1], []]
    assert all(p.ops for p in build_programs(replace(SMALL, num_layers=2), plan))


@pytest.mark.parametrize(("plan", "layers", "message"), [
    (dict(pp=4, account_for_loss=True, account_for_embedding=True), 11, r"11 layers \+ 2 \(embedding/loss\) do not"),
    (dict(pp=2, account_for_loss=True, last_stage_layers=3), 9, "contradict accounting"),
    (dict(pp=4, first_stage_layers=3), 10, "do not split evenly over the other 3 stages"),
    (dict(pp=1, last_stage_layers=3), 10, "need pp >= 2"),
    (dict(pp=3, first_stage_layers=5, last_stage_layers=5), 10, "every pipeline stage needs at least one layer"),
    (dict(pp=2, vp=2, num_micro_batches=2), 6, "not divisible by vp=2"),
    (dict(pp=2, vp=2, num_micro_batches=1), 8, "between pp=2 and the 1 micro-batches"),
    (dict(pp=4, vp=2, num_micro_batches=6), 8, "last group of 2 < pp=4"),
    (dict(pp=1, vp=2), 8, "need pp >= 2"),
])
def test_bad_pipeline_plans_are_one_line_errors(plan: dict, layers: int, message: str) -> None:
    with pytest.raises(InputError, match=message) as e:
        ParallelPlan(**plan).validate(replace(SMALL, num_layers=layers))
    assert "\n" not in str(e.value)


# --- EP A2A overlap (Megatron-Core's combined 1F1B) ------------------------------------------------------

MOE = replace(SMALL, name="moe", num_layers=4, num_experts=4, top_k=2, hidden_size=512, ffn_hidden_size=1024,
              seq_len=512)


def test_ep_overlap_schedule_adds_one_warmup_forward_and_pairs_the_steady_phase() -> None:
    assert stage_schedule(1, 0, 3, ep_overlap=True) == [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0),
                                                         ("B", 1, 0), ("B", 2, 0)]
    order = stage_schedule(2, 0, 4, 2, ep_overlap=True)
    plain = stage_schedule(2, 0, 4, 2)
    assert sorted(order) == sorted(plain) and order[:5] == plain[:5] and order[5] == ("F", 3, 0)  # 5th forward
    pairs = merged_pairs(2, 0, 4, 2)
    assert all(order[i][0] == "F" and order[i + 1][0] == "B" for i, p in enumerate(pairs) if p)
    assert sum(pairs) == len(order) // 2 - 5  # every forward after the 5 warm-up ones runs with a backward
    # every forward a warm-up one (2 micro-batches x 2 chunks, 5 warm-up wanted): none runs with a backward, not even
    # the last, which a backward follows (paired, it would wait for its own gradient: a deadlock)
    assert stage_schedule(2, 0, 2, 2, ep_overlap=True)[3:5] == [("F", 1, 1), ("B", 0, 1)]
    assert not any(merged_pairs(2, 0, 2, 2))


def test_ep_overlap_interleaves_a_forward_and_a_backward_layer_by_layer() -> None:
    """Megatron-Core's order for a pair of layers (model_chunk_schedule_plan.py): the backward's combine exchange,
    the forward's attention and routing, the backward's expert gradients, the forward's dispatch, the backward's
    dispatch exchange, the forward's experts and combine, the backward's attention."""
    plan = ParallelPlan(dp=2, ep=2, num_micro_batches=2)
    plain = build_programs(MOE, plan)[0].ops
    ops = build_programs(MOE, plan, TrainingOptions(moe_a2a_overlap=True))[0].ops
    assert sorted(o.name for o in ops) == sorted(o.name for o in plain)  # the same nodes, another order
    at = {o.name: i for i, o in enumerate(ops)}
    f, b = "mb1.fwd.layer0.", "mb0.bwd.layer3."
    assert (at[b + "combine_grad_alltoall"] < at[f + "attn_norm"] < at[f + "permute"] < at[b + "expert_out_dgrad"]
            < at[f + "dispatch_alltoall"] < at[b + "dispatch_grad_alltoall"] < at[f + "expert_in"]
            < at[f + "combine_alltoall"] < at[b + "attn_norm"] < at[f + "unpermute"])
    assert at["mb0.fwd.layer3.unpermute"] < at["mb1.fwd.layer0.attn_norm"]  # the first forward runs alone


def test_ep_overlap_hides_the_exchanges(tmp_path: Path) -> None:
    """On a slow expert-parallel link the overlapped step is shorter than the plain one."""
    plan = ParallelPlan(dp=4, ep=4, num_micro_batches=4)
    times = {}
    for overlap in (False, True):
        prefix = str(tmp_path / f"o{overlap}")
        generate_traces(MOE, plan, prefix, options=TrainingOptions(moe_a2a_overlap=overlap))
        net = network_from_dict({"topology": ["Switch"], "npus_count": [4], "bandwidth": [5.0], "latency": [500.0]})
        system = system_from_dict({**DEFAULT_SYSTEM, "roofline-enabled": 1})
        times[overlap] = simulate(prefix, net, system, device="H100", comm_streams="communicator").finish_ns
    assert times[True] < times[False]


@pytest.mark.parametrize(("model", "plan", "says"), [
    (SMALL, ParallelPlan(dp=2), "ep > 1"),
    (MOE, ParallelPlan(dp=2, pp=2, ep=2, num_micro_batches=2), "virtual pipeline stages"),
    (MOE, ParallelPlan(dp=2, ep=2, recompute="full"), "full recompute")])
def test_ep_overlap_refuses_what_megatron_refuses(model: ModelConfig, plan: ParallelPlan, says: str) -> None:
    with pytest.raises(InputError, match=says):
        build_programs(model, plan, TrainingOptions(moe_a2a_overlap=True))


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2]),
       st.booleans(), st.booleans())
@example(1, 2, 1, 1, False, False)  # every forward of stage 0 a warm-up one: deadlocked once (a paired warm-up)
def test_ep_overlap_pipelines_finish(tp: int, pp: int, vp_per_pp: int, groups: int, rendezvous: bool,
                                     streams: bool) -> None:
    """Overlapped forward/backward pairs on interleaved pipelines, with tensor parallelism, one communication slot
    per rank (ASTRA-sim's) or one per communicator, eager or rendezvous sends: every generated iteration runs to its
    end, its nodes all done (a deadlock would stop it early with an error)."""
    vp = 1 if pp == 1 else 2 * vp_per_pp
    model = replace(MOE, num_layers=pp * vp)
    plan = ParallelPlan(tp=tp, pp=pp, vp=vp, dp=2, ep=2, num_micro_batches=groups * pp, sequence_parallel=tp > 1)
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        generate_traces(model, plan, folder + "/t", options=TrainingOptions(moe_a2a_overlap=True))
        network = network_from_dict({"topology": ["Ring"], "npus_count": [tp * pp * 2], "bandwidth": [50.0],
                                     "latency": [500.0]})
        system = system_from_dict({**DEFAULT_SYSTEM, "roofline-enabled": 1})
        result = simulate(folder + "/t", network, system, device="H100", rendezvous=rendezvous,
                          comm_streams="communicator" if streams else "single")
    assert result.finish_ns > 0 and all(r.finish_ns > 0 for r in result.ranks)
