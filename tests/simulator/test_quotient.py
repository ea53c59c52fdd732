"""The quotient engine (one simulated rank per class of equivalent ranks) equals the message engine, per rank,
to the nanosecond: random LLM layouts, per-rank node numbering, renumbered groups, random networks."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import renumbered_llm_traces, simulate
from workload.llm.model import ModelConfig
from workload.llm.plan import ParallelPlan
from workload.schema import NodeType
from workload.writer import make_node

SMALL = ModelConfig(name="small", num_layers=2, hidden_size=256, num_heads=8, num_kv_heads=4, ffn_hidden_size=512,
                    vocab_size=1000, seq_len=64, gated_ffn=True)
SMALL_GPT = ModelConfig(name="small-gpt", num_layers=2, hidden_size=256, num_heads=8, ffn_hidden_size=1024,
                        vocab_size=1001, seq_len=64, tied_embeddings=True, position_embedding="learned",
                        norm="layernorm", bias=True)
SMALL_MOE = replace(SMALL, name="small-moe", num_experts=4, top_k=2)


def llm_traces(model: ModelConfig, plan: ParallelPlan, group_order: list[int], id_offsets: list[int]) -> list:
    """Per-rank node lists of ``plan``, with the groups renumbered and each rank's node ids shifted by its own
    offset (tests/conftest.py)."""
    return renumbered_llm_traces(model, plan, group_order, id_offsets)


@st.composite
def layouts(draw: st.DrawFn) -> dict:
    tp, pp, dp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2, 4]))
    model = replace(draw(st.sampled_from([SMALL, SMALL_GPT, SMALL_MOE])), num_layers=pp * draw(st.integers(1, 2)))
    world = tp * pp * dp
    if world < 2:
        tp = 2
        world = 2 * pp * dp
    layout = draw(st.permutations(["tp", "dp", "pp"]))
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp, ep=2 if model.is_moe and dp % 2 == 0 else 1,
                        zero_stage=draw(st.sampled_from([0, 1])), num_micro_batches=draw(st.integers(1, 3)),
                        sequence_parallel=draw(st.booleans()) and tp > 1, layout=tuple(layout))
    # the network: the world size split into 1-3 dimensions of random kinds
    counts, rest = [], world
    for _ in range(draw(st.integers(0, 2))):
        divisors = [d for d in range(2, rest) if rest % d == 0]
        if not divisors:
            break
        d = draw(st.sampled_from(divisors))
        counts.append(d)
        rest //= d
    counts.append(rest)
    topology = draw(st.lists(st.sampled_from(["Ring", "Switch", "FullyConnected"]), min_size=len(counts),
                             max_size=len(counts)))
    algo = st.sampled_from(["ring", "direct"])
    system = {f"{k}-implementation": draw(st.lists(algo, min_size=len(counts), max_size=len(counts)))
              for k in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")}
    system.update({"scheduling-policy": draw(st.sampled_from(["LIFO", "FIFO"])),
                   "active-chunks-per-dimension": draw(st.integers(1, 2)),
                   "preferred-dataset-splits": draw(st.integers(1, 4)),
                   "endpoint-delay": draw(st.sampled_from([0, 10]))})
    network = {"topology": topology, "npus_count": counts,
               "bandwidth": draw(st.lists(st.sampled_from([25.0, 50.0, 400.0]), min_size=len(counts),
                                          max_size=len(counts))),
               "latency": draw(st.lists(st.sampled_from([0.0, 500.0]), min_size=len(counts), max_size=len(counts)))}
    plan.validate(model)
    return {"model": model, "plan": plan, "network": network, "system": system,
            "group_order": draw(st.permutations(list(range(5)))), "id_offsets": draw(st.lists(
                st.integers(0, 50), min_size=1, max_size=4)), "rendezvous": draw(st.booleans()),
            "backend": draw(st.sampled_from(["analytical-unaware", "analytical-aware"]))}


EXAMPLES = int(os.environ.get("QUOTIENT_EXAMPLES", "30"))  # more for a longer hunt


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(layouts())
def test_quotient_engine_equals_message_engine(tmp_path: Path, case: dict) -> None:
    traces = llm_traces(case["model"], case["plan"], case["group_order"], case["id_offsets"])
    assert math.prod(case["network"]["npus_count"]) == len(traces)
    kw = {"device": "H100", "rendezvous": case["rendezvous"], "backend": case["backend"]}
    fast = simulate(tmp_path, traces, case["network"], case["system"], engine="auto", **kw)
    event(f"{case['backend']}: simulated {'all' if fast.simulated_ranks == len(traces) else 'fewer'} ranks")
    slow = simulate(tmp_path, traces, case["network"], case["system"], engine="message", **kw)
    assert [(r.finish_ns, r.exposed_comm_ns, r.comm_ns, r.compute_ns) for r in fast.ranks] == \
        [(r.finish_ns, r.exposed_comm_ns, r.comm_ns, r.compute_ns) for r in slow.ranks]
    assert fast.collectives == slow.collectives


def test_an_llm_layout_folds_to_its_pipeline_stages(tmp_path: Path) -> None:
    """tp 2 x dp 4 x pp 2 on two-level switches: the shifts along the tensor- and data-parallel groups leave one
    class per stage... per position the node's ports allow; every rank's result equals the full run's."""
    plan = ParallelPlan(dp=4, tp=2, pp=2, num_micro_batches=2)
    traces = llm_traces(SMALL, plan, [0], [0, 3])
    network = {"topology": ["Switch", "Switch"], "npus_count": [4, 4], "bandwidth": [400.0, 50.0],
               "latency": [500.0, 1000.0]}
    fast = simulate(tmp_path, traces, network, device="H100")
    slow = simulate(tmp_path, traces, network, device="H100", engine="message")
    assert fast.engine == "symmetric" and fast.simulated_ranks < 16 and "classes" in fast.engine_reason
    assert fast.ranks == slow.ranks and fast.collectives == slow.collectives
    # asked for every rank: the engine line names the flag, not what else would have stopped folding
    assert slow.simulated_ranks == 16 and slow.engine_reason == "every rank: --engine message"


@st.composite
def generated_layouts(draw: st.DrawFn) -> dict:
    tp, pp, dp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2, 4]))
    if tp * pp * dp < 2:
        dp = 2
    spec = {"generate": "llm", "num_layers": pp * draw(st.integers(1, 2)), "hidden_size": 256, "num_heads": 8,
            "num_kv_heads": 4, "ffn_hidden_size": 512, "vocab_size": 1000, "seq_len": 64, "tp": tp, "pp": pp,
            "dp": dp,
            "global_batch": dp * draw(st.integers(1, 3)), "layout": ",".join(draw(st.permutations(["tp", "dp", "pp"]))),
            "zero": draw(st.sampled_from([0, 1])), "sequence_parallel": draw(st.booleans()) and tp > 1}
    world = tp * pp * dp
    counts = draw(st.sampled_from([c for c in ([world], [2, world // 2], [4, world // 4]) if math.prod(c) == world
                                   and min(c) >= 2]))
    topology = draw(st.lists(st.sampled_from(["Ring", "Switch", "FullyConnected"]), min_size=len(counts),
                             max_size=len(counts)))
    return {"spec": spec, "network": {"topology": topology, "npus_count": counts, "bandwidth": [400.0] * len(counts),
                                      "latency": [500.0] * len(counts)},
            "backend": draw(st.sampled_from(["analytical-unaware", "analytical-aware"]))}


@settings(max_examples=max(EXAMPLES // 2, 10), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(generated_layouts())
def test_generated_workloads_fold_without_their_traces(tmp_path: Path, case: dict) -> None:
    """A generated workload describes its ranks (TraceSet.structure): the classes are found, and only the
    representatives' traces built, without reading any trace; the result equals the message engine's."""
    import json

    from simulator.api import simulate as run

    spec = case["spec"]
    workload = tmp_path / "w.yaml"
    workload.write_text(json.dumps(spec))
    network = tmp_path / "n.yml"
    network.write_text(json.dumps(case["network"]))
    fast = run(str(workload), str(network), device="H100", backend=case["backend"])
    event(f"{case['backend']}: simulated {'all' if fast.simulated_ranks == len(fast.ranks) else 'fewer'} ranks")
    slow = run(str(workload), str(network), device="H100", engine="message", backend=case["backend"])
    assert fast.ranks == slow.ranks and fast.collectives == slow.collectives


def test_converted_pytorch_traces_fold(tmp_path: Path) -> None:
    """Execution traces converted from PyTorch (4 ranks, two process groups of 2) fold to one rank per class."""
    from simulator.api import simulate as run
    from tests.conftest import run_cli

    fixtures = Path(__file__).resolve().parents[1] / "workload" / "fixtures" / "pytorch" / "v1_1_0_groups"
    done = run_cli("trace", "convert", "pytorch", str(fixtures), "-o", str(tmp_path / "pt"))
    assert done.returncode == 0, done.stderr
    network = tmp_path / "n.yml"
    network.write_text('{"topology": ["Ring"], "npus_count": [4], "bandwidth": [50], "latency": [500]}')
    fast = run(str(tmp_path / "pt"), str(network), device="H100")
    slow = run(str(tmp_path / "pt"), str(network), device="H100", engine="message")
    assert fast.simulated_ranks == 2 and fast.ranks == slow.ranks


KINDS = {"all_reduce": 0, "all_gather": 2, "reduce_scatter": 7, "all_to_all": 6}


@st.composite
def collective_runs(draw: st.DrawFn) -> dict:
    """Collectives on all NPUs and on a family of communicator groups, each collective type with its own
    algorithm per dimension (ring, direct, halving-doubling, double binary tree), on power-of-two networks."""
    counts = draw(st.sampled_from([[4], [8], [16], [2, 4], [4, 2], [4, 4], [2, 8]]))
    dims, npus = len(counts), math.prod(counts)
    size = draw(st.sampled_from([2, 4])) if npus > 4 else 2
    if draw(st.booleans()):  # blocks of consecutive ranks, or every (npus / size)-th rank
        groups = [tuple(range(g * size, (g + 1) * size)) for g in range(npus // size)]
    else:
        step = npus // size
        groups = [tuple(range(g, npus, step)) for g in range(step)]
    group_kind = draw(st.sampled_from(sorted(KINDS)))
    system: dict = {"preferred-dataset-splits": draw(st.integers(1, 3)),
                    "active-chunks-per-dimension": draw(st.integers(1, 2)),
                    "scheduling-policy": draw(st.sampled_from(["LIFO", "FIFO"]))}
    for kind in KINDS:
        names = ["ring", "direct"] + (["halvingDoubling"] if kind != "all_to_all" else [])
        if kind == "all_reduce" and not (group_kind == "all_reduce" and dims == 1):  # no tree on smaller groups
            names.append("doubleBinaryTree")
        system[f"{kind.replace('_', '-')}-implementation"] = draw(st.lists(st.sampled_from(names), min_size=dims,
                                                                          max_size=dims))
    world = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=0, max_size=2))
    return {"network": {"topology": draw(st.lists(st.sampled_from(["Ring", "Switch", "FullyConnected"]),
                                                  min_size=dims, max_size=dims)),
                        "npus_count": counts, "bandwidth": [50.0] * dims, "latency": [500.0] * dims},
            "system": system, "groups": groups, "group_kind": group_kind, "world": world,
            "backend": draw(st.sampled_from(["analytical-unaware", "analytical-aware"])),
            "rendezvous": draw(st.booleans())}


@settings(max_examples=max(EXAMPLES, 10), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(collective_runs())
def test_collective_algorithms_fold_exactly(tmp_path: Path, case: dict) -> None:
    """Halving-doubling (kept by exchanging positions), the double binary tree (kept only by shifts along other
    dimensions) and all-to-all on communicator groups fold exactly: every rank equals the message engine's."""
    npus = math.prod(case["network"]["npus_count"])
    gid = {m: k + 1 for k, members in enumerate(case["groups"]) for m in members}
    traces = []
    for rank in range(npus):
        nodes = []
        for k, kind in enumerate([*case["world"], case["group_kind"]]):
            attrs = {"comm_type": KINDS[kind], "comm_size": 1 << 16}
            if k == len(case["world"]):
                attrs["pg_name"] = str(gid[rank])
            nodes.append(make_node(10 * rank + k + 1, f"{kind}{k}", NodeType.COMM_COLL_NODE,
                                   data_deps=[10 * rank + k] if k else [], attrs=attrs))
        traces.append(nodes)
    groups = {k + 1: members for k, members in enumerate(case["groups"])}
    kw = {"backend": case["backend"], "rendezvous": case["rendezvous"]}
    fast = simulate(tmp_path, traces, case["network"], case["system"], groups=groups, **kw)
    event(f"simulated {'all' if fast.simulated_ranks == npus else 'fewer'} ranks")
    slow = simulate(tmp_path, traces, case["network"], case["system"], groups=groups, engine="message", **kw)
    assert fast.ranks == slow.ranks and fast.collectives == slow.collectives


def test_halving_doubling_on_groups_folds(tmp_path: Path) -> None:
    """Data-parallel all-reduces with halving-doubling on 4 groups of 4 (every 4th rank) on a switch: the XOR
    shifts of member positions and the translations leave one class."""
    groups = {g + 1: tuple(range(g, 16, 4)) for g in range(4)}
    traces = [[make_node(rank + 1, "ar", NodeType.COMM_COLL_NODE,
                         attrs={"comm_type": 0, "comm_size": 1 << 20, "pg_name": str(rank % 4 + 1)})]
              for rank in range(16)]
    network = {"topology": ["Switch"], "npus_count": [16], "bandwidth": [50.0], "latency": [500.0]}
    system = {"all-reduce-implementation": ["halvingDoubling"]}
    fast = simulate(tmp_path, traces, network, system, groups=groups)
    slow = simulate(tmp_path, traces, network, system, groups=groups, engine="message")
    assert fast.simulated_ranks == 1 and "exchange" in fast.engine_reason, fast.engine_reason
    assert fast.ranks == slow.ranks
