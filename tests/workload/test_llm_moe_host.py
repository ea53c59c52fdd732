"""The dropless MoE dispatcher's host side (workload/llm/moe_host.py): the token counts all-gathered and waited
for before the dispatch all-to-all, and the expert section no faster than the host issues it."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.workload.test_llm import SMALL_MOE
from tests.workload.test_llm_step import AG, finish, traces
from workload.llm import cli, moe_host
from workload.llm.plan import ParallelPlan


def test_host_issue_time_golden() -> None:
    """12 operators at 10 us and 2 GEMM launches per local expert at 4 us forward; 14 and 4 backward; FP8 adds a
    quantization launch per GEMM."""
    assert moe_host.expert_section_host_us(16, fp8=False, backward=False) == 12 * 10 + 2 * 16 * 4
    assert moe_host.expert_section_host_us(16, fp8=True, backward=False) == 12 * 10 + 2 * 16 * 4 * 2
    assert moe_host.expert_section_host_us(2, fp8=False, backward=True) == 14 * 10 + 4 * 2 * 4
    assert moe_host.count_bytes(128) == 1024


@given(st.integers(1, 512), st.booleans(), st.booleans())
def test_host_issue_time_grows_with_local_experts(experts: int, fp8: bool, backward: bool) -> None:
    t = moe_host.expert_section_host_us
    assert 0 < t(experts, fp8, backward) < t(experts + 1, fp8, backward)
    assert t(experts, False, backward) <= t(experts, True, backward)
    assert t(experts, fp8, False) < t(experts, fp8, True)


def test_dropless_dispatch_nodes(tmp_path: Path) -> None:
    """Per layer and micro-batch: the counts' all-gather over the expert-parallel group, a host node after it that
    the layer's unpermutation waits for, and a backward host node the permutation's gradient waits for."""
    plan = ParallelPlan(dp=2, ep=2, num_micro_batches=2)
    rank = traces(tmp_path, SMALL_MOE, plan, moe_host_sync=True)[0]
    counts = rank.collectives(AG, "dispatch_counts_allgather")
    assert len(counts) == SMALL_MOE.num_layers * 2
    assert all(c.attrs["comm_size"] == 8 * SMALL_MOE.num_experts and rank.members(c) == (0, 1) for c in counts)
    issue = [n for n in rank.nodes if n.name.endswith(".expert_issue")]
    issue_bwd = [n for n in rank.nodes if n.name.endswith(".expert_issue_bwd")]
    assert len(issue) == len(issue_bwd) == len(counts)
    forward_us = moe_host.expert_section_host_us(SMALL_MOE.num_experts // 2, fp8=False, backward=False)
    assert all(n.attrs["is_cpu_op"] and n.duration_us == forward_us for n in issue)
    for host in issue:
        (count,) = [c for c in counts if c.id in host.deps]
        unpermute = rank.by_id(max(n.id for n in rank.nodes if n.name == host.name.replace("expert_issue",
                                                                                              "unpermute")))
        assert host.id in unpermute.deps and count.id < host.id
    for host in issue_bwd:
        permute = next(n for n in rank.nodes if n.name == host.name.replace("expert_issue_bwd", "permute_bwd")
                       or (n.name.startswith(host.name.replace("expert_issue_bwd", "permute")) and host.id in n.deps))
        assert host.id in permute.deps
    plain = traces(tmp_path / "off", SMALL_MOE, plan)[0]
    assert not plain.collectives(AG, "dispatch_counts_allgather")
    assert not [n for n in plain.nodes if "expert_issue" in n.name]


@pytest.mark.parametrize("experts", [4, 64])
def test_host_bound_experts_lengthen_the_step(tmp_path: Path, experts: int) -> None:
    """Many small experts per rank: the host's issue time shows; the step never gets shorter with the host."""
    spec = {"generate": "llm", "num_layers": 2, "hidden_size": 512, "num_heads": 8, "ffn_hidden_size": 256,
            "vocab_size": 1000, "seq_len": 256, "gated_ffn": True, "num_experts": experts, "top_k": 2, "ep": 2,
            "dp": 2, "micro_batches": 2}
    (tmp_path / "ideal").mkdir()
    (tmp_path / "host").mkdir()
    ideal = finish(tmp_path / "ideal", spec, 2, 100.0)
    host = finish(tmp_path / "host", {**spec, "moe_host_sync": True}, 2, 100.0)
    assert host > ideal
    if experts == 64:  # 32 local experts: about 2 x 2 x (forward + backward issue time) per rank at least
        floor_ns = 2 * 2 * 1000 * (moe_host.expert_section_host_us(32, False, False)
                                   + moe_host.expert_section_host_us(32, False, True))
        assert host - ideal > floor_ns // 2


def test_cli_flag() -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["--experts", "4", "--top-k", "2", "--ep", "2", "--dp", "2", "--layers", "2",
                              "--hidden", "256", "--heads", "4", "--ffn-hidden", "512", "--vocab", "1000",
                              "--seq-len", "128", "--moe-host-sync"])
    options = cli.options_from_args(args, cli.plan_from_args(args))
    assert options.moe_host_sync
    assert replace(options, moe_host_sync=False) != options


def test_expert_gemms_run_per_expert_on_four_streams(tmp_path: Path) -> None:
    """Transformer Engine's GroupedLinear: one GEMM per local expert, four streams; a single local expert is one
    plain GEMM."""
    rank = traces(tmp_path, replace(SMALL_MOE, num_experts=8), ParallelPlan(dp=2, ep=2))[0]
    experts = [n for n in rank.compute() if ".expert_" in n.name]
    assert experts and all(n.attrs["gemm_batch"] == 4 and n.attrs["gemm_streams"] == moe_host.GROUPED_GEMM_STREAMS
                           for n in experts)
    single = traces(tmp_path / "one", replace(SMALL_MOE, num_experts=2), ParallelPlan(dp=2, ep=2))[0]
    assert all("gemm_streams" not in n.attrs for n in single.compute() if ".expert_" in n.name)
