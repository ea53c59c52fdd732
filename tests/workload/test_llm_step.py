"""The training step around the passes in ``trace generate llm``: the distributed optimizer and FSDP settings,
Megatron's gradient buckets, overlapped gradient, parameter and tensor-parallel communication, the iteration's
tail, and the command line and generator keys that set them."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from simulator.api import simulate
from tests.conftest import run_cli
from tests.workload.test_llm import SMALL, SMALL_GPT, RankTrace, load
from workload.errors import InputError
from workload.generated import generated_traces
from workload.llm import cli
from workload.llm.emit import generate_traces
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan
from workload.schema import CollectiveType, NodeType

AR, AG, RS = int(CollectiveType.ALL_REDUCE), int(CollectiveType.ALL_GATHER), int(CollectiveType.REDUCE_SCATTER)
BIG = {"generate": "llm", "num_layers": 2, "hidden_size": 8192, "num_heads": 64, "num_kv_heads": 8,
       "ffn_hidden_size": 28672, "vocab_size": 1000, "seq_len": 4096, "gated_ffn": True}


def traces(tmp_path: Path, model: Any, plan: ParallelPlan, **options: Any) -> list[RankTrace]:
    prefix = str(tmp_path / "t")
    generate_traces(model, plan, prefix, options=TrainingOptions(**options))
    return [load(prefix, r, plan.world_size) for r in range(plan.world_size)]


def last_compute(t: RankTrace, but: tuple[str, ...] = ("optimizer",)) -> int:
    return max(n.id for n in t.compute() if n.name not in but)


def finish(tmp_path: Path, spec: dict, npus: int, bandwidth: float) -> int:
    workload = tmp_path / "w.yaml"
    workload.write_text(json.dumps(spec))
    network = tmp_path / "n.yml"
    network.write_text(json.dumps({"topology": ["Switch"], "npus_count": [npus], "bandwidth": [bandwidth],
                                   "latency": [500.0]}))
    return simulate(str(workload), str(network), device="H100", engine="message").finish_ns


# --- FSDP and the distributed optimizer -----------------------------------------------------------------------

def test_fsdp_as_llama3_ran_it(tmp_path: Path) -> None:
    """reshard_after_forward off: the parameters gathered for a layer's forward stay for its backward (no gathers
    in the backward); fsdp_grad_sync last: gradients reduce-scattered only in the last micro-batch."""
    plan = ParallelPlan(dp=2, num_micro_batches=3, zero_stage=3)
    default = traces(tmp_path / "a", SMALL, plan)[0]
    llama = traces(tmp_path / "b", SMALL, plan, reshard_after_forward=False, fsdp_grad_sync="last")[0]
    units = SMALL.num_layers + 1
    for t, bwd_gathers, scatters in ((default, units * 3, units * 3), (llama, 0, units)):
        gathers = [n for n in t.collectives(AG) if "_param_allgather" in n.name]
        assert len([n for n in gathers if ".bwd." in n.name]) == bwd_gathers
        assert len([n for n in gathers if ".fwd." in n.name]) == units * 3
        grads = [n for n in t.collectives(RS) if "_dp_grad_" in n.name]
        assert len(grads) == scatters
    assert all(n.name.startswith("mb2.") for n in llama.collectives(RS))


def test_use_distributed_optimizer_is_zero_1() -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    plan = cli.plan_from_args(parser.parse_args(["--use-distributed-optimizer", "--dp", "2"]))
    assert plan.zero_stage == 1
    with pytest.raises(InputError, match="ZeRO stage 1, not --zero 3"):
        cli.plan_from_args(parser.parse_args(["--use-distributed-optimizer", "--zero", "3"]))


# --- gradient reduction --------------------------------------------------------------------------------------

@pytest.mark.parametrize("zero", [0, 1])
def test_overlap_grad_reduce_moves_the_reduction_into_the_backward(tmp_path: Path, zero: int) -> None:
    plan = ParallelPlan(dp=2, num_micro_batches=2, zero_stage=zero)
    for overlap in (True, False):
        t = traces(tmp_path / str(overlap), SMALL, plan, overlap_grad_reduce=overlap)[0]
        grads = [n for n in t.collectives() if "_dp_grad_" in n.name]
        assert len(grads) == SMALL.num_layers + 1
        end = last_compute(t)
        assert (min(n.id for n in grads) < end) is overlap
        assert all(n.name.startswith("mb1.") for n in grads) is overlap


def _megatron_buckets(tensors: list[int], limit: int) -> list[int]:
    buckets, size = [], 0
    for n in tensors:
        size += n
        if size >= limit:
            buckets.append(size)
            size = 0
    return buckets + ([size] if size else [])


def test_megatron_buckets(tmp_path: Path) -> None:
    """A bucket takes weight tensors in backward order until it holds bucket_size parameters; it is reduced during
    the last micro-batch's backward as soon as its last tensor's gradient is ready; a later pipeline stage keeps one
    bucket (Megatron turns bucketing off there)."""
    from workload.llm.sizes import tensor_params

    plan = ParallelPlan(dp=2, pp=2, num_micro_batches=2, zero_stage=1)
    limit = 300_000
    ranks = traces(tmp_path, SMALL_GPT, plan, bucket_size=limit, overlap_grad_reduce=True)
    first, last = ranks[0], ranks[plan.world_size - 1]
    per_layer = [n for _, n in tensor_params(SMALL_GPT, plan).values()]
    embedding = plan.padded_vocab(SMALL_GPT) * SMALL_GPT.hidden_size + SMALL_GPT.seq_len * SMALL_GPT.hidden_size
    expected = _megatron_buckets(per_layer * 2 + [embedding], limit)
    grads = [n for n in first.collectives(RS) if "_grad_" in n.name and "bucket" in n.name]
    assert [n.attrs["comm_size"] // 2 for n in grads] == expected and len(expected) > 2
    assert all(n.name.startswith("mb1.bwd.bucket") for n in grads)
    end = last_compute(first)
    assert min(n.id for n in grads) < end  # the first buckets go during the backward
    for before, n in zip([None, *grads], grads, strict=False):  # right after the kernel that completes the bucket
        parents = [first.by_id(d) for d in n.deps]
        (parent,) = [p for p in parents if p.type == NodeType.COMP_NODE]
        assert parent.name.endswith(("_wgrad", "norm", "embedding"))
        # and after the bucket before it where nothing else orders them: one communicator issues them in turn
        assert {p.id for p in parents if p is not parent} <= ({before.id} if before else set())
    assert len([n for n in last.collectives(RS) if "bucket" in n.name]) == 1
    params = [n for n in first.collectives(AG) if "bucket" in n.name]  # after the step, last bucket first
    assert [n.attrs["comm_size"] for n in params] == [-(-b // 2) * 2 for b in reversed(expected)]
    assert TrainingOptions(bucket_size="megatron").bucket_params(dp=64, cp=2) == 128_000_000
    assert TrainingOptions(bucket_size="megatron").bucket_params(dp=8, cp=1) == 40_000_000


def test_overlap_param_gather_runs_one_ahead_of_the_forward(tmp_path: Path) -> None:
    """The distributed optimizer's all-gathers (of the previous step's update) run per layer in forward order: the
    first at the start of the iteration, each next one when the one before is done and the forward has reached
    the unit that one serves (Megatron-Core r0.8 dispatches the next bucket's all-gather in the forward pre-hook
    that waits for the current one); each layer's first forward waits for its own; none follows the optimizer."""
    plan = ParallelPlan(dp=2, num_micro_batches=2, zero_stage=1)
    t = traces(tmp_path, SMALL, plan, overlap_grad_reduce=True, overlap_param_gather=True)[0]
    gathers = [n for n in t.collectives(AG) if "_param_allgather" in n.name]
    assert [n.name for n in gathers] == ["root_dp_param_allgather"] + [f"layer{i}_dp_param_allgather"
                                                                        for i in range(SMALL.num_layers)]
    assert gathers[0].id < min(n.id for n in t.compute()) and not gathers[0].deps
    first_kernel = {i: next(n for n in t.compute() if n.name == f"mb0.fwd.layer{i}.attn_norm")
                    for i in range(SMALL.num_layers)}
    for i, g in enumerate(gathers[1:]):
        later = next(n for n in t.compute() if n.name == f"mb1.fwd.layer{i}.attn_norm")
        assert g.id in first_kernel[i].deps and g.id not in later.deps
        assert gathers[i].id in g.deps
        gates = [t.by_id(d) for d in g.deps if t.by_id(d).type == NodeType.COMP_NODE]
        if i >= 2:  # dispatched when the forward reached layer i - 1: behind the kernels issued before it
            (gate,) = gates
            assert gate.name.startswith("mb0.fwd.") and first_kernel[i - 2].id < gate.id < first_kernel[i - 1].id
        else:  # layer 0's is dispatched at the embedding and layer 1's at layer 0, behind the first kernel only
            assert all(n.name == "mb0.fwd.embedding" for n in gates)
    assert all("optimizer" not in t.by_id(d).name for g in gathers for d in g.deps)


def test_overlapped_buckets_are_waited_for_where_their_modules_run(tmp_path: Path) -> None:
    """Megatron's buckets with overlap_param_gather on one stage: the embedding waits only for the bucket holding
    it (the last one reduced, gathered first); the final norm, in the first bucket (gathered last), is waited for
    at the end of the forward, not before the embedding."""
    plan = ParallelPlan(dp=2, num_micro_batches=2, zero_stage=1)
    t = traces(tmp_path, SMALL_GPT, plan, overlap_grad_reduce=True, overlap_param_gather=True, bucket_size=1)[0]
    gathers = [n for n in t.collectives(AG) if "_param_allgather" in n.name]
    assert len(gathers) > 2 and gathers[-1].name == "bucket0_dp_param_allgather"
    embedding = next(n for n in t.compute() if n.name == "mb0.fwd.embedding")
    batch = [t.by_id(d) for d in embedding.deps]
    waited = {d for n in [embedding, *batch] for d in n.deps}
    assert gathers[0].id in waited and gathers[-1].id not in waited
    final_norm = next(n for n in t.compute() if n.name == "mb0.fwd.final_norm")
    assert gathers[-1].id in final_norm.deps


def test_overlapping_gradients_and_fsdp_choices_shorten_the_step(tmp_path: Path) -> None:
    base = {"generate": "llm", "num_layers": 4, "hidden_size": 1024, "num_heads": 16, "num_kv_heads": 4,
            "ffn_hidden_size": 4096, "vocab_size": 1000, "seq_len": 1024, "dp": 4, "global_batch": 8}
    times = {name: finish(tmp_path, {**base, **extra}, 4, 20.0) for name, extra in {
        "after": {"overlap_grad_reduce": False}, "during": {"overlap_grad_reduce": True},
        "zero3": {"zero": 3}, "llama3": {"zero": 3, "reshard_after_forward": False, "fsdp_grad_sync": "last"}}.items()}
    assert times["during"] < times["after"]
    assert times["llama3"] < times["zero3"]


# --- tensor-parallel communication overlap ---------------------------------------------------------------------

def test_tp_comm_overlap_marks_userbuffers_kernels_with_their_sms(tmp_path: Path) -> None:
    """Transformer Engine's userbuffers run the pipelined reduce-scatters and the backward's bulk all-gather and
    reduce-scatter on 16 SMs: those collectives say so (comm_sms); the others (NCCL's) and the ring exchange's
    sends do not, nor does anything without tp_comm_overlap."""
    plan = ParallelPlan(tp=2, num_micro_batches=1, sequence_parallel=True)
    over = traces(tmp_path / "a", SMALL, plan, tp_comm_overlap=True)[0]
    marked = {n.name.split(".", 3)[-1] for n in over.nodes if n.attrs.get("comm_sms") == 16 and ".layer1." in n.name}
    assert marked == {"attn_chunk0_reducescatter", "attn_chunk1_reducescatter", "attn_chunk2_reducescatter",
                      "attn_chunk3_reducescatter", "mlp_chunk0_reducescatter", "mlp_chunk1_reducescatter",
                      "mlp_chunk2_reducescatter", "mlp_chunk3_reducescatter", "attn_input_allgather",
                      "mlp_input_allgather", "attn_grad_reducescatter", "mlp_grad_reducescatter"}
    assert all(n.type == NodeType.COMM_COLL_NODE for n in over.nodes if "comm_sms" in n.attrs)
    plain = traces(tmp_path / "b", SMALL, plan)[0]
    assert not any("comm_sms" in n.attrs for n in plain.nodes)


def test_tp_comm_overlap_splits_gemms_around_ring_steps(tmp_path: Path) -> None:
    """QKV and FC1 (forward), projection and FC2 input gradients (backward): tp GEMM chunks fed by tp - 1
    ring steps; projection and FC2 forward: 4 chunks, each reduce-scattered on its own."""
    tp = 4
    plan = ParallelPlan(tp=tp, num_micro_batches=1, sequence_parallel=True)
    t = traces(tmp_path, SMALL, plan, tp_comm_overlap=True)[0]
    layer = [n for n in t.nodes if ".layer1." in n.name]
    sends = [n for n in layer if n.type == NodeType.COMM_SEND_NODE]
    assert len(sends) == 4 * (tp - 1) and {n.attrs["comm_dst"] for n in sends} == {1}
    assert {n.attrs["comm_size"] for n in sends} == {SMALL.seq_len // tp * SMALL.hidden_size * 2}
    for gemm in ("fwd.layer1.qkv", "fwd.layer1.mlp_in", "bwd.layer1.attn_out_dgrad", "bwd.layer1.mlp_out_dgrad"):
        chunks = [n for n in layer if f"mb0.{gemm}_chunk" in n.name]
        assert len(chunks) == tp
        for i, chunk in enumerate(chunks[1:]):
            assert any(t.by_id(d).name.endswith(f"_ring{i}_recv") for d in chunk.deps)
    for gemm in ("attn_out", "mlp_out"):
        chunks = [n for n in layer if n.name.startswith(f"mb0.fwd.layer1.{gemm}_chunk")]
        assert len(chunks) == 4
        scatters = [n for n in t.collectives(RS) if n.name.startswith(f"mb0.fwd.layer1.{gemm[:-4] or 'attn'}")]
        assert len([n for n in scatters if "_chunk" in n.name]) == 4


def test_tp_comm_overlap_hides_tensor_parallel_time(tmp_path: Path) -> None:
    plain = finish(tmp_path, {**BIG, "tp": 8, "global_batch": 1, "sequence_parallel": True}, 8, 200.0)
    overlapped = finish(tmp_path, {**BIG, "tp": 8, "global_batch": 1, "sequence_parallel": True,
                                   "tp_comm_overlap": True}, 8, 200.0)
    assert overlapped < 0.95 * plain


# --- the iteration's tail -----------------------------------------------------------------------------------------

def test_iteration_tail_nodes(tmp_path: Path) -> None:
    """Batch loading per micro-batch on the first and last stage (after the host wait), the gradient norm's
    4-byte all-reduce between the norm and clipping kernels before the optimizer (over every rank with ZeRO 1,
    over tp x pp ranks without), the loss reduced over dp on the last stage after the step."""
    plan = ParallelPlan(dp=2, tp=2, pp=2, num_micro_batches=2, zero_stage=1)
    ranks = traces(tmp_path, SMALL, plan, iteration_tail=True, dataloader_wait_us=7)
    first, last = ranks[0], ranks[plan.world_size - 1]
    for t in (first, last):
        loads = [n for n in t.compute() if n.name.endswith("get_batch")]
        assert len(loads) == 2 and all(n.attrs["tensor_size"] > 0 for n in loads)
        waits = [n for n in t.nodes if n.name.endswith("dataloader_wait")]
        assert len(waits) == 2 and all(n.attrs["is_cpu_op"] and n.duration_us == 7 for n in waits)
        (norm,) = t.collectives(AR, "grad_norm_allreduce")
        assert norm.attrs["comm_size"] == 4 and t.members(norm) == tuple(range(8))
        clip = next(n for n in t.compute() if n.name == "clip_grad")
        optimizer = next(n for n in t.compute() if n.name == "optimizer")
        assert norm.id in clip.deps and clip.id in optimizer.deps
    assert last.collectives(AR, "logged_loss_allreduce")[0].attrs["comm_size"] == 8
    assert not first.collectives(AR, "logged_loss_allreduce")
    zero0 = traces(tmp_path / "z0", SMALL, replace(plan, zero_stage=0), iteration_tail=True)[0]
    (norm,) = zero0.collectives(AR, "grad_norm_allreduce")
    assert zero0.members(norm) == (0, 4, 1, 5)  # tp x pp of data-parallel rank 0, tp outermost
    plain = traces(tmp_path / "off", SMALL, plan)[0]
    assert not [n for n in plain.nodes if "get_batch" in n.name or "grad_norm" in n.name]


# --- command line and generator keys ----------------------------------------------------------------------------

def test_cli_generates_and_simulates_every_feature(tmp_path: Path) -> None:
    args = ["trace", "generate", "llm", "--layers", "8", "--hidden", "256", "--heads", "8", "--kv-heads", "4",
            "--ffn-hidden", "512", "--vocab", "1000", "--seq-len", "256", "--tp", "2", "--pp", "2", "--cp", "2",
            "--vp", "2", "--dp", "2", "--global-batch", "8", "--sequence-parallel", "--recompute", "selective",
            "--use-distributed-optimizer", "--precision", "fp8", "--overlap-grad-reduce", "--overlap-param-gather",
            "--ddp-bucket-size", "megatron", "--tp-comm-overlap", "--iteration-tail", "--grad-reduce-in-fp32",
            "-o", str(tmp_path), "--summary", "--groups-file"]
    out = run_cli(*args)
    assert out.returncode == 0, out.stderr
    assert "x cp 2 (p2p)" in out.stdout and "interleaved over 2 virtual stages" in out.stdout
    assert "selective recompute" in out.stdout and "FP8 GEMMs" in out.stdout
    assert "cp-ring context parallel ring" in out.stdout
    prefix = out.stdout.splitlines()[0]
    network = tmp_path / "n.yml"
    network.write_text('{"topology": ["Switch", "Switch"], "npus_count": [4, 4], "bandwidth": [400, 50], '
                       '"latency": [500, 1000]}')
    sim = run_cli("--workload", prefix, "--network", str(network), "--comm-groups", f"{prefix}.comm_groups.json",
                  "--device", "H100", "--quiet")
    assert sim.returncode == 0, sim.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--tp", "2", "--tp-comm-overlap"], "tp_comm_overlap needs sequence parallelism"),
    (["--dp", "2", "--overlap-param-gather"], "needs the distributed optimizer"),
    (["--dp", "2", "--zero", "1", "--overlap-param-gather", "--no-overlap-grad-reduce"], "needs overlap_grad_reduce"),
    (["--cp", "5"], "not divisible by 2 x cp = 10"),
    (["--cp", "2", "--cp-comm-type", "a2a", "--tp", "8"], "a2a"),
    (["--fp8-param-gather", "--zero", "1", "--dp", "2"], "fp8_param_gather needs precision fp8"),
    (["--ddp-bucket-size", "0", "--dp", "2"], "bucket size must be a number of parameters >= 1"),
    (["--vp", "2", "--pp", "2", "--micro-batches", "1"], "between pp=2 and the 1 micro-batches"),
    (["--recompute", "selective", "--activation-recompute"], "contradicts"),
    (["--recompute", "selective", "--recompute-modules", "core_attn,shared_experts"],
     "recompute module(s) shared_experts not modelled"),
    (["--recompute-modules", "layernorm"], "recompute modules need selective recompute"),
    (["--nvlink-domain", "0"], "NVLink domain must be a whole number of GPUs >= 1"),
    (["--experts", "8", "--ep", "2", "--etp", "1", "--tp", "2", "--dp", "2"], "--sequence-parallel"),
])
def test_bad_step_settings_are_one_line_errors(tmp_path: Path, flags: list[str], message: str) -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["--preset", "llama3-8b", "--layers", "8", "--seq-len", "1536", *flags, "--summary"])
    with pytest.raises(InputError) as e:
        cli.main(args, lambda _: None)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_bad_step_setting_on_the_command_line(tmp_path: Path) -> None:
    out = run_cli("trace", "generate", "llm", "--preset", "llama3-8b", "--tp", "2", "--tp-comm-overlap", "-o",
                  str(tmp_path))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and "needs sequence parallelism" in out.stderr


def test_flex_over_uneven_nvlink_domains_warns() -> None:
    """Expert-parallel groups of 8 over domains of 3 GPUs (3 + 3 + 2): one all-to-all, with a warning; over
    domains of 4 the two-stage exchange, silently."""
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    base = ["--layers", "2", "--hidden", "256", "--heads", "8", "--ffn-hidden", "512", "--vocab", "1000", "--seq-len",
            "64", "--experts", "8", "--dp", "8", "--ep", "8", "--moe-dispatcher", "flex", "--summary"]
    for domain, warned in (("3", True), ("4", False)):
        said: list[str] = []
        cli.main(parser.parse_args([*base, "--nvlink-domain", domain]), said.append)
        assert any(f"do not split evenly over NVLink domains of {domain} GPUs" in s for s in said) == warned


def test_generator_keys_take_the_new_settings() -> None:
    spec = {"generate": "llm", "preset": "gpt3-1.3b", "num_layers": 4, "tp": 2, "pp": 2, "cp": 2, "vp": 2,
            "global_batch": 4, "ddp_bucket_size": 1_000_000, "zero": 1, "overlap_grad_reduce": True,
            "precision": "fp8", "iteration_tail": True, "recompute": "full"}
    assert generated_traces(spec, 8, "w.yaml").num_ranks == 8
    with pytest.raises(InputError, match="'ddp_bucket_size' must be a number or a name"):
        generated_traces({**spec, "ddp_bucket_size": [1]}, 8, "w.yaml")
    with pytest.raises(InputError, match=r"w\.yaml: .*dp 1 x tp 2 x pp 2 x cp 2"):
        generated_traces(spec, 16, "w.yaml")


@pytest.mark.parametrize(("plan", "options"), [
    (dict(tp=2, pp=4, vp=2, dp=2, num_micro_batches=8), {}),
    (dict(tp=2, pp=2, cp=2, num_micro_batches=4, sequence_parallel=True), dict(tp_comm_overlap=True,
                                                                             iteration_tail=True)),
])
def test_output_estimate_is_close_to_what_is_written(tmp_path: Path, plan: dict, options: dict) -> None:
    """--max-bytes checks the estimate before writing: within 2% of the written traces."""
    model = replace(SMALL, num_layers=8, seq_len=256)
    p, o = ParallelPlan(**plan), TrainingOptions(**options)
    generate_traces(model, p, str(tmp_path / "t"), options=o)
    written = sum(f.stat().st_size for f in tmp_path.glob("t.*.et"))
    assert cli.estimated_bytes(model, p, o) == pytest.approx(written, rel=0.02)
