"""Where each MoE dispatcher sorts a rank's tokens by expert: the alltoall dispatcher before its all-to-all and,
with several local experts, the received tokens by local expert after it (and back before the combine); DeepEP
after its dispatch; HybridEP inside its own exchange kernels."""

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
