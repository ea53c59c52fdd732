"""Where each MoE dispatcher sorts a rank's tokens by expert: the alltoall dispatcher before its all-to-all and,
with several local experts, the received tokens by local expert after it (and back before the combine); DeepEP
after its dispatch; HybridEP in kernels of its own after its dispatch kernel (Megatron-Core's default), or inside
that kernel when the permutation is fused into it. HybridEP also all-gathers the routing map before the dispatch
and, across NVLink domains, stages the rank's tokens in its RDMA buffer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.workload.test_llm import SMALL_MOE
from tests.workload.test_llm_step import traces
from workload.errors import InputError
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan

PLAN = ParallelPlan(dp=2, ep=2, num_micro_batches=1)
KERNELS = ("permute", "sort_chunks", "unsort_chunks", "unpermute")


def layer_order(rank, phase: str) -> list[str]:
    prefix = f"mb0.{phase}.layer0."
    return [n.name[len(prefix):] for n in rank.nodes if n.name.startswith(prefix)
            and (n.name.endswith(KERNELS) or "alltoall" in n.name or n.name.endswith(("expert_in", "expert_out")))]


@pytest.mark.parametrize("options, forward, backward", [
    ({}, ["permute", "dispatch_alltoall", "sort_chunks", "expert_in", "expert_out", "unsort_chunks",
          "combine_alltoall", "unpermute"],
     ["unpermute", "combine_grad_alltoall", "unsort_chunks", "sort_chunks", "dispatch_grad_alltoall", "permute"]),
    ({"moe_dispatcher": "flex"}, ["dispatch_alltoall", "permute", "expert_in", "expert_out", "unpermute",
                                  "combine_alltoall"],
     ["combine_grad_alltoall", "unpermute", "permute", "dispatch_grad_alltoall"]),
    ({"moe_dispatcher": "flex", "moe_flex_backend": "hybridep"},
     ["dispatch_alltoall", "permute", "expert_in", "expert_out", "unpermute", "combine_alltoall"],
     ["combine_grad_alltoall", "unpermute", "permute", "dispatch_grad_alltoall"]),
    ({"moe_dispatcher": "flex", "moe_flex_backend": "hybridep", "moe_hybridep_fused_permute": True},
     ["dispatch_alltoall", "expert_in", "expert_out", "combine_alltoall"],
     ["combine_grad_alltoall", "dispatch_grad_alltoall"]),
])
def test_each_dispatcher_permutes_where_megatron_core_does(tmp_path: Path, options: dict, forward: list[str],
                                                           backward: list[str]) -> None:
    rank = traces(tmp_path, SMALL_MOE, PLAN, **options)[0]
    assert layer_order(rank, "fwd") == forward
    assert [k for k in layer_order(rank, "bwd") if not k.startswith("expert_")] == backward


def test_one_local_expert_needs_no_sort_and_the_copies_move_the_routed_tokens(tmp_path: Path) -> None:
    """One expert per rank: nothing to sort. Each copy reads and writes the routed tokens (a rank's 64 tokens, top-2,
    hidden 256, 2 bytes) once; its backward reads one more tensor's worth."""
    one = traces(tmp_path / "one", replace(SMALL_MOE, num_experts=2, top_k=1), PLAN)[0]
    assert not [n for n in one.nodes if "sort_chunks" in n.name]
    rank = traces(tmp_path / "two", SMALL_MOE, PLAN)[0]
    routed_bytes = 64 * 2 * 256 * 2
    for name in KERNELS:
        assert {n.attrs["tensor_size"] for n in rank.compute() if n.name == f"mb0.fwd.layer0.{name}"} == \
            {2 * routed_bytes}
        assert {n.attrs["tensor_size"] for n in rank.compute() if n.name == f"mb0.bwd.layer0.{name}"} == \
            {3 * routed_bytes}


def test_unknown_flex_backend_is_a_one_line_error() -> None:
    with pytest.raises(InputError, match="moe_flex_backend must be one of deepep, hybridep"):
        TrainingOptions(moe_flex_backend="nccl-ep").validate(0, False, 1)


@pytest.mark.parametrize("options, padded", [
    ({"precision": "fp8", "moe_host_sync": True}, True),
    ({"precision": "fp4", "moe_host_sync": True}, True),
    ({"precision": "fp8"}, False),  # token drop: capacities padded already
    ({"moe_host_sync": True}, False),  # 16-bit GEMMs need no padding
    ({"precision": "fp8", "moe_host_sync": True, "moe_dispatcher": "flex"}, False),  # padded while permuting
])
def test_low_precision_dropless_experts_pad_their_rows(tmp_path: Path, options: dict, padded: bool) -> None:
    """Dropless FP8/FP4 with the alltoall dispatcher: TEGroupedMLP pads each expert's rows to the quantization block
    after the sort (a copy) and unpads the output before the unsort; backward the other way round."""
    rank = traces(tmp_path, SMALL_MOE, PLAN, **options)[0]
    forward = layer_order_all(rank, "fwd")
    if not padded:
        assert "quantization_padding" not in forward and "quantization_unpadding" not in forward
        return
    assert forward.index("sort_chunks") < forward.index("quantization_padding") < forward.index("expert_in")
    assert forward.index("expert_out") < forward.index("quantization_unpadding") < forward.index("unsort_chunks")
    backward = layer_order_all(rank, "bwd")
    assert backward.index("unsort_chunks") < backward.index("quantization_unpadding") < backward.index(
        "expert_out_dgrad")
    assert backward.index("expert_in_dgrad") < backward.index("quantization_padding") < backward.index("sort_chunks")


def layer_order_all(rank, phase: str) -> list[str]:
    prefix = f"mb0.{phase}.layer0."
    return [n.name[len(prefix):] for n in rank.nodes if n.name.startswith(prefix)]


def test_flex_backend_without_the_flex_dispatcher_warns(tmp_path: Path) -> None:
    """The backend only picks the flex dispatcher's library: given with the alltoall dispatcher it changes nothing,
    and the CLI says so (naming the flag that would make it count)."""
    from tests.workload.test_llm import _main
    argv = ["--preset", "mixtral-8x7b", "--layers", "2", "--dp", "2", "--ep", "2", "--summary"]
    assert not any("moe-flex-backend" in w for w in _main(argv))
    assert not any("moe-flex-backend" in w for w in _main([*argv, "--moe-dispatcher", "flex",
                                                           "--moe-flex-backend", "hybridep"]))
    warned = [w for w in _main([*argv, "--moe-flex-backend", "hybridep"]) if "moe-flex-backend" in w]
    assert len(warned) == 1 and "--moe-dispatcher flex" in warned[0] and "\n" not in warned[0]
    fused = [w for w in _main([*argv, "--moe-dispatcher", "flex", "--moe-hybridep-fused-permute"])
             if "fused-permute" in w]
    assert len(fused) == 1 and "--moe-flex-backend hybridep" in fused[0]
    assert not [w for w in _main([*argv, "--moe-dispatcher", "flex", "--moe-flex-backend", "hybridep",
                                  "--moe-hybridep-fused-permute"]) if "fused-permute" in w]


@pytest.mark.parametrize("options, name, size", [
    ({"moe_host_sync": True}, "dispatch_counts_allgather", 8 * 4),  # an int64 count per expert
    ({"moe_host_sync": True, "moe_dispatcher": "flex"}, "dispatch_counts_allgather", 8 * 4),
    ({"moe_host_sync": True, "moe_dispatcher": "flex", "moe_flex_backend": "hybridep"},
     "dispatch_routing_map_allgather", 64 * 4),  # a byte per token and expert
    ({"moe_dispatcher": "flex", "moe_flex_backend": "hybridep"}, "dispatch_routing_map_allgather", 64 * 4),
    ({}, None, 0),  # token drop: fixed capacities, nothing to gather
])
def test_what_each_dispatcher_gathers_before_its_exchange(tmp_path: Path, options: dict, name: str | None,
                                                         size: int) -> None:
    """The dropless dispatchers all-gather every expert's token count over the expert-parallel group; HybridEP
    all-gathers its rank's routing map instead (64 tokens x 4 experts here), also without the host sync (its
    metadata preprocessing needs the map either way)."""
    rank = traces(tmp_path, SMALL_MOE, PLAN, **options)[0]
    gathered = [n for n in rank.nodes if n.name.startswith("mb0.fwd.layer0.dispatch_") and "allgather" in n.name]
    if name is None:
        assert not gathered
        return
    assert [n.name.rsplit(".", 1)[1] for n in gathered] == [name]
    assert gathered[0].attrs["comm_size"] == size
    assert not [n for n in rank.nodes if "allgather" in n.name and ".bwd." in n.name and "dispatch" in n.name]


def test_hybridep_across_nvlink_domains_stages_its_tokens_before_each_dispatch(tmp_path: Path) -> None:
    """Across NVLink domains HybridEP copies the rank's tokens (64 x hidden 256, bf16) into its RDMA buffer before
    the dispatch and before the combine's gradient (a dispatch too); inside one domain it does not."""
    plan = ParallelPlan(dp=4, ep=4, num_micro_batches=1)
    options = {"moe_dispatcher": "flex", "moe_flex_backend": "hybridep"}
    rank = traces(tmp_path / "two", SMALL_MOE, plan, nvlink_domain=2, **options)[0]
    staged = [n for n in rank.compute() if n.name.endswith(".rdma_staging") and ".layer0." in n.name]
    assert [n.name for n in staged] == ["mb0.fwd.layer0.rdma_staging", "mb0.bwd.layer0.rdma_staging"]
    assert {n.attrs["tensor_size"] for n in staged} == {2 * 64 * 256 * 2}
    exchange = {n.name: n for n in rank.nodes}
    for staging, then in (("mb0.fwd.layer0.rdma_staging", "mb0.fwd.layer0.dispatch_alltoall_across"),
                          ("mb0.bwd.layer0.rdma_staging", "mb0.bwd.layer0.combine_grad_alltoall_across")):
        assert exchange[staging].id in exchange[then].deps
    one = traces(tmp_path / "one", SMALL_MOE, plan, nvlink_domain=4, **options)[0]
    assert not [n for n in one.nodes if n.name.endswith(".rdma_staging")]
