"""A generated program states the order of each communicator's collectives, as the host issues them: any two
collectives of one communicator are ordered by the program's dependencies. Two unordered ones could be reached
in opposite orders on two ranks (the Megatron-MoE-ModelZoo H100 128k-token run's were, on its expert-parallel
group), which NCCL would deadlock on and the simulator refuses."""

from __future__ import annotations

from dataclasses import replace
from graphlib import TopologicalSorter

import pytest

from tests.workload.test_llm import SMALL, SMALL_GPT, SMALL_MOE
from workload.llm.build import build_programs
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan
from workload.llm.program import Op
from workload.schema import NodeType

MOE = replace(SMALL_MOE, num_layers=8, seq_len=256)

CASES = [
    (MOE, ParallelPlan(tp=2, ep=2, dp=2, num_micro_batches=4, sequence_parallel=True), TrainingOptions()),
    (MOE, ParallelPlan(pp=2, vp=2, cp=2, ep=2, num_micro_batches=4), TrainingOptions(iteration_tail=True)),
    (MOE, ParallelPlan(pp=2, vp=2, ep=2, dp=2, num_micro_batches=4, zero_stage=1),
     TrainingOptions(moe_a2a_overlap=True, overlap_grad_reduce=True, overlap_param_gather=True, bucket_size=20_000)),
    (MOE, ParallelPlan(ep=4, dp=4, num_micro_batches=2), TrainingOptions(moe_dispatcher="flex", nvlink_domain=2)),
    (SMALL, ParallelPlan(dp=4, num_micro_batches=2, zero_stage=3), TrainingOptions(iteration_tail=True)),
    (SMALL_GPT, ParallelPlan(tp=2, pp=2, dp=2, num_micro_batches=4, zero_stage=1, sequence_parallel=True),
     TrainingOptions(overlap_grad_reduce=True, overlap_param_gather=True, bucket_size=100_000, iteration_tail=True)),
]


def collectives_before(ops: list[Op]) -> dict[int, set[int]]:
    """{collective node: the collective nodes it (transitively) waits for}."""
    graph = {node: {*op.deps, *op.ctrl} for node, op in enumerate(ops, start=1)}
    before: dict[int, set[int]] = {}
    for node in TopologicalSorter(graph).static_order():
        got: set[int] = set()
        for dep in graph.get(node, ()):
            got |= before[dep]
            if ops[dep - 1].node_type == NodeType.COMM_COLL_NODE:
                got.add(dep)
        before[node] = got
    return {n: b for n, b in before.items() if ops[n - 1].node_type == NodeType.COMM_COLL_NODE}


@pytest.mark.parametrize(("model", "plan", "options"), CASES)
def test_each_communicators_collectives_are_ordered(model: ModelConfig, plan: ParallelPlan,
                                                     options: TrainingOptions) -> None:
    plan.validate(model)
    ranks = options.rank_map(plan, model)
    for program in build_programs(model, plan, options):
        rank = ranks.stage_ranks(program.stage)[0]
        before = collectives_before(program.ops)
        by_communicator: dict[int, list[int]] = {}
        for node in before:
            group = ranks.group(rank, program.ops[node - 1].group)
            assert group is not None
            by_communicator.setdefault(group.gid, []).append(node)
        for nodes in by_communicator.values():
            members = set(nodes)
            # a chain: the k-th collective waits for the k before it, and no two wait for as many
            counts = sorted(len(before[n] & members) for n in nodes)
            assert counts == list(range(len(nodes)))


@pytest.mark.parametrize(("model", "plan", "kinds"), [
    (SMALL, ParallelPlan(dp=4, num_micro_batches=2, zero_stage=3), ("dp",)),
    (MOE, ParallelPlan(ep=2, dp=4, num_micro_batches=2, zero_stage=3), ("dp", "edp"))])
def test_a_prefetched_all_gather_is_issued_before_the_gradients_of_the_layer_it_runs_beside(
        model: ModelConfig, plan: ParallelPlan, kinds: tuple[str, ...]) -> None:
    """FSDP's backward prefetch issues a layer's parameter all-gathers (the dense ones, then the experts') before
    the reduce-scatters of the layer whose backward they run beside, though the program adds them after those:
    the chain follows the issue order, so the all-gathers still overlap that layer's backward."""
    ops = build_programs(model, plan, TrainingOptions())[0].ops
    node = {op.name: i for i, op in enumerate(ops, start=1)}
    before = collectives_before(ops)
    for kind in kinds:
        for layer in (3, 2):
            gather = node[f"mb0.bwd.layer{layer - 1}_{kind}_param_allgather"]
            reduce = node[f"mb0.bwd.layer{layer}_{kind}_grad_reducescatter"]
            assert gather > reduce and gather in before[reduce]
