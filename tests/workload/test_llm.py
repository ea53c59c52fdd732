"""``trace generate llm``: parameter and FLOP counts, the collectives of every parallelism dimension, the 1F1B
schedule, send/recv matching, simulation end to end, the command line and its errors."""

from __future__ import annotations

import argparse
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compute.devices import device
from compute.roofline import Roofline
from network.config import network_from_dict
from simulator.api import simulate
from simulator.config import DEFAULT_SYSTEM, system_from_dict
from tests.conftest import run_cli
from workload.errors import InputError
from workload.groups import metadata_groups
from workload.llm import cli
from workload.llm.build import build_programs, one_f_one_b
from workload.llm.emit import generate_traces
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan, RankMap, parse_pipeline_layout
from workload.llm.presets import PRESETS, PUBLISHED_PARAMS
from workload.llm.sizes import flex_copies
from workload.llm.summary import stage_flops, summarize
from workload.schema import CollectiveType, NodeType
from workload.traceset import TraceLoader
from workload.validate import validate

SMALL = ModelConfig(name="small", num_layers=4, hidden_size=256, num_heads=8, num_kv_heads=4, ffn_hidden_size=512,
                    vocab_size=1000, seq_len=64, gated_ffn=True)
SMALL_MOE = replace(SMALL, name="small-moe", num_experts=4, top_k=2)
SMALL_GPT = ModelConfig(name="small-gpt", num_layers=4, hidden_size=256, num_heads=8, ffn_hidden_size=1024,
                        vocab_size=1001, seq_len=64, tied_embeddings=True, position_embedding="learned",
                        norm="layernorm", bias=True)
AR, AG, RS, A2A = (int(CollectiveType.ALL_REDUCE), int(CollectiveType.ALL_GATHER),
                   int(CollectiveType.REDUCE_SCATTER), int(CollectiveType.ALL_TO_ALL))
ACT_BYTES = 64 * 256 * 2  # one micro-batch of one sequence: seq x hidden x bf16


@dataclass
class Node:
    id: int
    name: str
    type: int
    deps: set[int]
    attrs: dict[str, Any]
    duration_us: int


@dataclass
class RankTrace:
    nodes: list[Node]
    groups: dict[str, tuple[int, ...]]
    world: int

    def by_id(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    def compute(self) -> list[Node]:
        return [n for n in self.nodes if n.type == NodeType.COMP_NODE]

    def collectives(self, comm_type: int | None = None, name: str = "") -> list[Node]:
        return [n for n in self.nodes if n.type == NodeType.COMM_COLL_NODE and name in n.name
                and (comm_type is None or n.attrs["comm_type"] == comm_type)]

    def members(self, node: Node) -> tuple[int, ...]:
        pg = node.attrs.get("pg_name", "")
        return self.groups[pg] if pg else tuple(range(self.world))


def in_layer(node: Node) -> bool:
    """A node inside a layer's forward or backward (not the layer's gradient or parameter collectives)."""
    return re.search(r"\.layer\d+\.", node.name) is not None


def generate(tmp_path: Path, model: ModelConfig, **plan: Any) -> tuple[str, ParallelPlan]:
    p = ParallelPlan(**plan)
    prefix = str(tmp_path / model.name)
    generate_traces(model, p, prefix)
    return prefix, p


def load(prefix: str, rank: int, world: int) -> RankTrace:
    g = TraceLoader().load(f"{prefix}.{rank}.et", rank)
    validate(g)
    nodes, groups = [], {}
    for i in range(g.num_nodes):
        if int(g.types[i]) == NodeType.METADATA_NODE:
            groups = {name: tuple(ranks) for name, ranks in metadata_groups(g, i) or []}
        nodes.append(Node(g.node_id(i), g.name(i), int(g.types[i]), set(g.data_deps_of(i)) | set(g.ctrl_deps_of(i)),
                          {a[0]: a[2] for a in g.attributes(i)}, int(g.duration_micros[i])))
    return RankTrace(nodes, groups, world)


def h100_run(prefix: str, world: int) -> Any:
    net = network_from_dict({"topology": ["Ring"], "npus_count": [world], "bandwidth": [50.0], "latency": [500.0]})
    return simulate(prefix, net, system_from_dict({**DEFAULT_SYSTEM, "roofline-enabled": 1}), device="H100")


# --- parameters and FLOPs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_counts_match_the_published_ones(name: str) -> None:
    model = PRESETS[name]
    total, active = PUBLISHED_PARAMS[name]
    assert model.total_params() == pytest.approx(total, rel=0.02)
    assert model.active_params() == pytest.approx(active, rel=0.02)


def test_parameter_counts_by_tensor() -> None:
    # Llama-3 8B by hand: attention 2*4096^2 + 2*4096*1024, SwiGLU 3*4096*14336, 2 RMSNorms; untied 128256 x 4096
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert PRESETS["llama3-8b"].total_params() == 32 * layer + 2 * 128256 * 4096 + 4096
    # a tensor-parallel rank holds 1/tp of every matrix and whole norms
    assert PRESETS["llama3-8b"].layer_params(tp=4).dense == (layer - 2 * 4096) // 4 + 2 * 4096


@pytest.mark.parametrize("name", list(PRESETS))
def test_flops_per_iteration_against_6pt(name: str) -> None:
    model = PRESETS[name]
    plan = ParallelPlan(dp=2, tp=2, pp=2, ep=2 if model.is_moe else 1, num_micro_batches=2,
                        sequence_parallel=model.is_moe)
    plan.validate(model)
    programs = build_programs(model, plan)
    flops = summarize(model, plan, programs, RankMap(plan, model))["flops"]
    tokens = plan.global_batch * model.seq_len
    six_pt = 6 * model.active_params() * tokens
    # exact: every weight a token multiplies, forward + backward (3 x 2 x weights), the vocabulary padded to tp
    padded = (plan.padded_vocab(model) - model.vocab_size) * model.hidden_size
    assert flops["matmul"] == 6 * (model.matmul_params() + padded) * tokens
    # exact: causal attention scores, s(s+1)/2 pairs per head and sequence, forward + backward (latent attention:
    # query/key heads of head_size + RoPE dims, value heads of value_head_size)
    # (sliding-window layers: each query sees its last ``window_size`` keys)
    attention_width = model.num_heads * (model.head_size + model.qk_rope_head_dim + model.value_head_size)
    s, w = model.seq_len, model.window_size or 0
    windowed = sum(model.windowed(layer) for layer in range(model.num_layers))
    pairs = (model.attention_layers - windowed) * s * (s + 1) // 2 + windowed * (w * (w + 1) // 2 + (s - w) * w)
    assert flops["attention"] == 6 * attention_width * pairs * plan.global_batch
    assert flops["elementwise"] + flops["optimizer"] < 0.005 * flops["total"]
    # 6PT counts the untied input embedding (a lookup, no FLOPs) as a matmul: 6.5% of Llama-3 8B's parameters
    lookup = model.embedding_params() if not model.tied_embeddings else model.embedding_params() - \
        model.vocab_size * model.hidden_size
    assert flops["matmul"] == pytest.approx(6 * (model.active_params() - lookup) * tokens, rel=0.05)
    if lookup < 0.05 * model.active_params():  # not Llama-3 8B, nor Nemotron 3 Nano (10%)
        assert flops["matmul"] == pytest.approx(six_pt, rel=0.05)
    # the attention term is 6 L s h per token: small only for wide models, short sequences or few attention layers
    if name in ("gpt3-6.7b", "gpt3-13b", "gpt3-175b", "llama3-405b", "nemotron-3-super"):  # few attention layers
        assert flops["total"] == pytest.approx(six_pt, rel=0.05)
    else:  # e.g. GPT-3 1.3B at 2048 tokens is ~ +7.5%, Mixtral at 32768 tokens ~ +33%
        assert flops["total"] > 1.05 * 6 * (model.active_params() - lookup) * tokens


def test_activation_recompute_adds_exactly_one_forward_of_the_layers() -> None:
    plan = ParallelPlan(tp=2, pp=2, num_micro_batches=3)

    def per_tp_rank(p: ParallelPlan) -> Counter[tuple[str, str]]:
        out: Counter[tuple[str, str]] = Counter()
        for program in build_programs(SMALL, p):
            out.update(stage_flops(program))
        return out

    base, recomputed = per_tp_rank(plan), per_tp_rank(replace(plan, activation_recompute=True))
    extra = recomputed - base
    tokens = plan.global_batch * SMALL.seq_len
    assert extra["recompute", "matmul"] * plan.tp == 2 * SMALL.num_layers * SMALL.layer_params().dense_matmul * tokens
    width = SMALL.num_heads * SMALL.head_size
    assert extra["recompute", "attention"] * plan.tp == 2 * SMALL.num_layers * width * (SMALL.seq_len + 1) * tokens
    assert set(extra) == {("recompute", c) for c in ("matmul", "attention", "elementwise")}


def test_summary_reports_the_attention_share_and_group_bytes() -> None:
    from workload.llm.summary import format_summary

    plan = ParallelPlan(dp=2, tp=2, pp=2, num_micro_batches=2, zero_stage=1)
    text = format_summary(summarize(SMALL, plan, build_programs(SMALL, plan), RankMap(plan, SMALL)))
    assert "attention scores" in text and "x 6PT" in text
    assert "tp   tensor parallel" in text and "dp   data parallel" in text and "pp   pipeline" in text


# --- collectives of every dimension -----------------------------------------------------------------------

def test_tensor_parallel_all_reduces(tmp_path: Path) -> None:
    prefix, plan = generate(tmp_path, SMALL, dp=2, tp=2, num_micro_batches=2)
    t = load(prefix, 0, 4)
    layer_ars = [n for n in t.collectives(AR) if in_layer(n)]
    assert len(layer_ars) == 4 * SMALL.num_layers * plan.num_micro_batches  # 2 forward + 2 backward per layer
    assert {n.attrs["comm_size"] for n in layer_ars} == {ACT_BYTES}
    assert {t.members(n) for n in layer_ars} == {(0, 1)}
    for n in layer_ars:
        (parent,) = [t.by_id(d) for d in n.deps]  # right after the matmul that produces it ...
        assert parent.type == NodeType.COMP_NODE and parent.name.rsplit(".", 1)[0] == n.name.rsplit(".", 1)[0]
        assert parent.name.endswith(("attn_out", "mlp_out", "qkv_dgrad", "mlp_in_dgrad"))
        consumers = [c for c in t.nodes if n.id in c.deps]  # ... and before the next kernel
        assert len(consumers) == 1 and consumers[0].name.endswith("norm")


def test_sequence_parallel_all_gathers_and_reduce_scatters(tmp_path: Path) -> None:
    prefix, _ = generate(tmp_path, SMALL, tp=2, num_micro_batches=1, sequence_parallel=True)
    t = load(prefix, 1, 2)
    assert not [n for n in t.collectives(AR) if in_layer(n)]
    ags = [n for n in t.collectives(AG) if in_layer(n)]
    rss = [n for n in t.collectives(RS) if in_layer(n)]
    assert len([n for n in ags if ".fwd." in n.name]) == 2 * SMALL.num_layers
    assert len([n for n in ags if ".bwd." in n.name]) == 4 * SMALL.num_layers  # + saved inputs for wgrad
    assert len(rss) == 4 * SMALL.num_layers
    assert {n.attrs["comm_size"] for n in ags} == {ACT_BYTES // 2}  # ALL_GATHER: the per-rank input
    assert {n.attrs["comm_size"] for n in rss} == {ACT_BYTES}
    assert "pg_name" not in ags[0].attrs  # a group of every rank is the world


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_data_parallel_gradient_and_parameter_collectives(tmp_path: Path, zero: int) -> None:
    prefix, plan = generate(tmp_path, SMALL_GPT, dp=2, tp=2, num_micro_batches=2, zero_stage=zero)
    t = load(prefix, 0, 4)
    dp = [n for n in t.collectives() if t.members(n) == (0, 2)]
    grads = [n for n in dp if "_grad_" in n.name]
    params = [n for n in dp if "_param_allgather" in n.name]
    units = SMALL_GPT.num_layers + 1  # the layers and the embedding/norm/head parameters
    layer = SMALL_GPT.layer_params(tp=2).dense
    optimizer = next(n for n in t.compute() if n.name == "optimizer")
    last_compute = max(n.id for n in t.compute() if n.name != "optimizer")
    assert {n.attrs["comm_type"] for n in grads} == {AR if zero == 0 else RS}
    assert len(grads) == units * (plan.num_micro_batches if zero == 3 else 1)
    assert sorted({n.attrs["comm_size"] for n in grads if ".layer" in n.name or n.name.startswith("layer")}) == \
        [2 * layer]
    assert max(n.id for n in grads if n.name.startswith(f"mb{plan.num_micro_batches - 1}.") or zero == 1) in \
        optimizer.deps
    if zero == 1:  # after the whole backward
        assert all(n.deps >= {last_compute} for n in grads)
    if zero in (0, 2, 3):  # during the backward, overlapping the rest of it
        assert min(n.id for n in grads) < last_compute
        first = min(grads, key=lambda n: n.id)
        parents = [t.by_id(d).name for d in first.deps]
        assert any(f".bwd.layer{SMALL_GPT.num_layers - 1}." in p for p in parents)
    if zero in (1, 2):
        assert len(params) == units and all(optimizer.id in n.deps for n in params)
        assert {n.attrs["comm_size"] for n in params if n.name.startswith("layer")} == {layer}  # half, in bf16
    elif zero == 3:  # before every layer's forward and backward, per micro-batch
        assert len(params) == 2 * units * plan.num_micro_batches
        first_fwd = next(n for n in t.compute() if n.name == "mb0.fwd.layer2.attn_norm")
        gather = next(n for n in params if n.name == "mb0.fwd.layer2_dp_param_allgather")
        assert gather.id in first_fwd.deps and gather.attrs["comm_size"] == layer
    else:
        assert not params


def test_expert_parallel_all_to_alls_and_expert_gradients(tmp_path: Path) -> None:
    prefix, plan = generate(tmp_path, SMALL_MOE, dp=4, ep=2, num_micro_batches=2)
    t = load(prefix, 0, 4)
    a2a = t.collectives(A2A)
    assert len(a2a) == 4 * SMALL_MOE.num_layers * plan.num_micro_batches  # dispatch + combine, forward + backward
    assert {n.attrs["comm_size"] for n in a2a} == {ACT_BYTES * SMALL_MOE.top_k}
    assert {t.members(n) for n in a2a} == {(0, 1)}  # experts sharded over dp ranks 0 and 1
    expert_grads = [n for n in t.collectives(AR) if "_edp_grad" in n.name]
    assert {t.members(n) for n in expert_grads} == {(0, 2)}  # replicas of the same experts
    assert {n.attrs["comm_size"] for n in expert_grads} == {2 * SMALL_MOE.layer_params(ep=2).expert}
    dense_grads = [n for n in t.collectives(AR) if "_dp_grad" in n.name]
    assert dense_grads and all("pg_name" not in n.attrs for n in dense_grads)  # dp = all 4 ranks
    # the alltoall dispatcher sorts the received tokens by local expert (2 here) before the experts' GEMMs
    sort = next(n for n in t.compute() if n.name == "mb0.fwd.layer0.sort_chunks")
    assert t.by_id(next(iter(sort.deps - {d for d in sort.deps
                                         if t.by_id(d).type == NodeType.COMP_NODE}))).name.endswith(
        "dispatch_alltoall")
    expert_in = next(n for n in t.compute() if n.name == "mb0.fwd.layer0.expert_in")
    assert sort.id in expert_in.deps


@pytest.mark.parametrize("tp", [1, 2])
def test_shared_expert_is_a_dense_ffn_between_the_dispatch_and_the_routed_experts(tmp_path: Path, tp: int) -> None:
    """Megatron-Core's shared expert: every token through a dense FFN of its own width, tensor-parallel like a dense
    layer, synchronised with the dense gradients; run before the router and, backward, last (after the router's
    gradient: it was created first)."""
    width = 384
    model = replace(SMALL_MOE, name="shared", shared_expert_ffn=width)
    plan = {"tp": tp, "dp": 2, "ep": 2, "num_micro_batches": 2, "sequence_parallel": tp > 1}
    prefix, p = generate(tmp_path, model, **plan)
    base, _ = generate(tmp_path, replace(SMALL_MOE, name="base"), **plan)
    per_rank = model.ffn_matrices * model.hidden_size * width // tp
    assert model.layer_params(tp, 2).dense - SMALL_MOE.layer_params(tp, 2).dense == per_rank
    assert model.matmul_params() - SMALL_MOE.matmul_params() == model.num_layers * model.ffn_matrices * 256 * width
    t, b = load(prefix, 0, 2 * tp), load(base, 0, 2 * tp)
    tokens = model.seq_len  # one sequence per micro-batch
    gemm_flops = sum(n.attrs["num_ops"] for n in t.compute() if ".shared_" in n.name and "activation" not in n.name)
    assert gemm_flops == 3 * 2 * tokens * per_rank * model.num_layers * p.num_micro_batches  # forward, dgrad, wgrad
    assert sum(n.attrs["num_ops"] for n in t.compute() if in_layer(n) and ".shared_" not in n.name) == \
        sum(n.attrs["num_ops"] for n in b.compute() if in_layer(n))
    # its gradients travel with the dense ones (all data-parallel ranks), not the experts'
    dense = sum(n.attrs["comm_size"] for n in t.collectives(name="_dp_grad"))
    assert dense - sum(n.attrs["comm_size"] for n in b.collectives(name="_dp_grad")) == \
        model.num_layers * per_rank * 2
    assert sum(n.attrs["comm_size"] for n in t.collectives(name="_edp_grad")) == \
        sum(n.attrs["comm_size"] for n in b.collectives(name="_edp_grad"))
    fwd = [n.name.rsplit(".", 1)[1] for n in t.nodes if n.name.startswith("mb1.fwd.layer2.")]
    assert fwd.index("mlp_norm") < fwd.index("shared_in") < fwd.index("shared_out") < fwd.index("router")
    bwd = [n.name.rsplit(".", 1)[1] for n in t.nodes if n.name.startswith("mb1.bwd.layer2.")]
    assert bwd.index("dispatch_grad_alltoall") < bwd.index("router_wgrad") < bwd.index("shared_out_dgrad") \
        < bwd.index("shared_in_wgrad") < bwd.index("mlp_norm")
    names = {n.id: n.name for n in t.nodes}
    router = next(n for n in t.nodes if n.name == "mb1.fwd.layer2.router")
    assert any(names[d].endswith("shared_out") for d in router.deps)  # stream order


DEEPSEEK_MLA = ModelConfig(name="mla", num_layers=2, hidden_size=7168, num_heads=128, head_dim=128, q_lora_rank=1536,
                           kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128, ffn_hidden_size=2048,
                           vocab_size=1000, seq_len=64, num_experts=8, top_k=2, gated_ffn=True, shared_expert_ffn=2048)


def test_latent_attention_parameters_are_deepseek_v3s() -> None:
    """DeepSeek-V3's attention (its checkpoint's shapes): q_a 7168x1536, q_b 1536x(128x192), kv_a 7168x576,
    kv_b 512x(128x256), o (128x128)x7168, and the two latent norms (1536 + 512)."""
    split, split_matmul, whole, whole_matmul = DEEPSEEK_MLA.attention_params()
    assert split + whole == 187_105_280 + 2048
    assert whole_matmul == 7168 * (1536 + 576) and split == split_matmul
    tp8 = DEEPSEEK_MLA.layer_params(tp=8, ep=8)
    assert tp8.replicated - DEEPSEEK_MLA.layer_params(tp=1, ep=8).replicated == 0  # held whole at any tp


@pytest.mark.parametrize("sp", [False, True])
def test_latent_attention_projects_down_per_rank_and_gathers_the_latents(tmp_path: Path, sp: bool) -> None:
    """Megatron-Core's MLA: each tensor-parallel rank projects its own tokens down (weights held whole), norms the
    latents and (sequence parallel) all-gathers them, projects up to its heads; backward, the latents' gradients are
    summed over tp (reduce-scatter or all-reduce) before the down-projections, whose weight gradients the step
    all-reduces over tp with the norms' (sequence parallel)."""
    model = replace(DEEPSEEK_MLA, num_experts=1, top_k=1, shared_expert_ffn=0, name=f"mla{sp}")
    prefix, _ = generate(tmp_path, model, tp=2, dp=1, num_micro_batches=1, sequence_parallel=sp)
    t = load(prefix, 0, 2)
    tokens, local = 64, 32 if sp else 64
    ops = {n.name.rsplit(".", 1)[1]: n for n in t.nodes if n.name.startswith("mb0.fwd.layer1.")}
    assert ops["q_down"].attrs["num_ops"] == 2 * local * 7168 * 1536
    assert ops["kv_down"].attrs["num_ops"] == 2 * local * 7168 * 576
    assert ops["q_up"].attrs["num_ops"] == 2 * tokens * 1536 * 64 * 192  # 64 of 128 heads per rank
    assert ops["kv_up"].attrs["num_ops"] == 2 * tokens * 512 * 64 * 256
    assert ops["attn_out"].attrs["num_ops"] == 2 * tokens * 64 * 128 * 7168
    # the core: QK^T over 192 dims and AV over 128 per (query, key) pair and head
    assert ops["attention"].attrs["num_ops"] == 2 * (192 + 128) * 64 * (tokens * (tokens + 1) // 2)
    assert ("latent_allgather" in ops) is sp and "qkv" not in ops
    bwd = {n.name.rsplit(".", 1)[1]: n for n in t.nodes if n.name.startswith("mb0.bwd.layer1.")}
    summed = bwd["latent_grad_reducescatter" if sp else "latent_grad_allreduce"]
    assert summed.attrs["comm_size"] == tokens * (1536 + 512 + 64) * 2
    assert "attn_grad_reducescatter" not in bwd and "attn_grad_allreduce" not in bwd
    replicated = t.collectives(AR, "replicated_grad_allreduce")
    if sp:
        whole = model.layer_params(tp=2).replicated * model.num_layers + model.norm_params()
        assert [n.attrs["comm_size"] for n in replicated] == [whole * 2]
    assert h100_run(prefix, 2).finish_ns > 0


def test_mla_up_projection_recompute_runs_them_again_before_the_attention_backward(tmp_path: Path) -> None:
    model = replace(DEEPSEEK_MLA, num_experts=1, top_k=1, shared_expert_ffn=0, name="mla-rc")
    p = ParallelPlan(dp=1, num_micro_batches=1, recompute="selective", recompute_modules=("mla_up_proj",))
    p.validate(model)
    names = [op.name for op in build_programs(model, p)[0].ops]
    again = names.index("mb0.recompute.layer1.q_up")
    assert names.index("mb0.bwd.layer1.attn_out_dgrad") < again < names.index("mb0.bwd.layer1.attention")
    assert "mb0.recompute.layer1.kv_up" in names and "mb0.recompute.layer1.q_down" not in names


def test_deepseek_v3_parameters_are_its_checkpoints() -> None:
    """DeepSeek-V3's 671,026,419,200 parameters without its MTP module, less the routers' 58 x 256 score-correction
    biases the model leaves out; its first 3 layers dense (FFN 18432), the other 58 with experts."""
    model = PRESETS["deepseek-v3"]
    assert model.total_params() == 671_026_419_200 - 58 * 256
    assert [model.moe_at(i) for i in range(5)] == [False, False, False, True, True]


def test_dense_first_layers_run_a_dense_ffn_and_sync_with_the_dense_gradients(tmp_path: Path) -> None:
    model = replace(SMALL_MOE, name="first-dense", dense_layers=1, dense_ffn_hidden_size=768)
    prefix, _ = generate(tmp_path, model, dp=2, ep=2, num_micro_batches=1)
    t = load(prefix, 0, 2)
    names = {n.name for n in t.compute()}
    assert "mb0.fwd.layer0.mlp_in" in names and "mb0.fwd.layer0.expert_in" not in names
    assert "mb0.fwd.layer1.expert_in" in names and "mb0.fwd.layer1.mlp_in" not in names
    mlp_in = next(n for n in t.compute() if n.name == "mb0.fwd.layer0.mlp_in")
    assert mlp_in.attrs["num_ops"] == 2 * 64 * 256 * 2 * 768  # gated: two 768-wide halves
    assert not any(".layer0." in n.name for n in t.collectives(A2A))
    dense = model.layer_params(ep=2, moe=False)
    assert dense.expert == 0 and dense.dense == SMALL.layer_params().dense + 3 * 256 * (768 - 512)
    total = model.total_params()
    assert total == replace(SMALL_MOE).total_params() - SMALL_MOE.layer_params().dense - \
        SMALL_MOE.layer_params().expert + model.layer_params(moe=False).dense
    assert h100_run(prefix, 2).finish_ns > 0


@pytest.mark.parametrize("moe", [False, True])
def test_multi_token_prediction_adds_a_layer_projection_and_head_on_the_last_stage(moe: bool) -> None:
    """Each depth: its transformer layer, the 2h -> h projection and the shared output layer once more, all on the
    last stage (FLOPs exact against matmul_params); its parameters travel with the last stage's gradients."""
    base = replace(SMALL_MOE if moe else SMALL, name="mtp-base", dense_layers=1 if moe else 0)
    model = replace(base, name="mtp", mtp_layers=1)
    plan = ParallelPlan(dp=2, tp=2, pp=2, ep=2 if moe else 1, num_micro_batches=2, sequence_parallel=True)
    tokens = plan.global_batch * model.seq_len
    padded = (plan.padded_vocab(model) - model.vocab_size) * model.hidden_size
    flops = {m: summarize(m, plan, build_programs(m, plan), RankMap(plan, m))["flops"] for m in (base, model)}
    assert flops[model]["matmul"] == 6 * (model.matmul_params() + 2 * padded) * tokens
    assert model.matmul_params() - base.matmul_params() == (
        base.layer_params(moe=moe).dense_matmul + moe * base.top_k * 3 * 256 * 512 + 2 * 256 * 256 + 1000 * 256)
    layer = base.layer_params(moe=moe)
    assert model.total_params() - base.total_params() == layer.dense + layer.expert + 2 * 256 * 256 + 3 * 256
    programs = build_programs(model, plan)
    assert not any(".mtp0." in op.name for op in programs[0].ops)  # the first stage has none
    last = [op.name for op in programs[-1].ops if op.name.startswith("mb1.")]
    assert last.index("mb1.fwd.layer3.attn_norm") < last.index("mb1.fwd.mtp0.mtp_proj") < \
        last.index("mb1.fwd.mtp0.lm_head")
    assert last.index("mb1.bwd.mtp0.lm_head_wgrad") < last.index("mb1.bwd.mtp0.mtp_proj_wgrad") < \
        last.index("mb1.bwd.layer3.attn_norm")
    # the last stage reads the token embeddings again: both ends hold them and sum their gradients (as tied ones)
    for program in (programs[0], programs[-1]):
        sums = [op for op in program.ops if op.name == "embedding_grad_allreduce"]
        assert len(sums) == 1
    assert not any(op.name == "embedding_grad_allreduce" for op in build_programs(base, plan)[0].ops)


def test_a_repeated_multi_token_prediction_layer_runs_each_depth_but_holds_its_weights_once() -> None:
    """mtp_use_repeated_layer: two depths run one stored block, so the compute is two depths' and the parameters
    and gradient synchronisation one depth's."""
    base = replace(SMALL_MOE, name="mtp1", dense_layers=1, mtp_layers=1)
    two = replace(base, name="mtp2", mtp_layers=2)
    shared = replace(two, name="mtp2-shared", mtp_repeated_layer=True)
    plan = ParallelPlan(dp=2, tp=2, pp=2, ep=2, num_micro_batches=2, sequence_parallel=True)
    assert shared.total_params() == base.total_params() < two.total_params()
    assert shared.active_params() == base.active_params()
    assert shared.matmul_params() == two.matmul_params()
    flops = {m.name: summarize(m, plan, build_programs(m, plan), RankMap(plan, m))["flops"] for m in (two, shared)}
    assert {k: v for k, v in flops["mtp2"].items() if k not in ("optimizer", "total")} == \
        {k: v for k, v in flops["mtp2-shared"].items() if k not in ("optimizer", "total")}
    assert flops["mtp2-shared"]["optimizer"] < flops["mtp2"]["optimizer"]  # fewer parameters to update

    def grad_bytes(model: ModelConfig) -> int:
        last = build_programs(model, plan)[-1]
        return sum(op.size_bytes for op in last.ops if "_grad_" in op.name and op.group in ("dp", "edp"))

    assert grad_bytes(shared) == grad_bytes(base) < grad_bytes(two)
    names = [op.name for op in build_programs(shared, plan)[-1].ops]
    assert "mb1.fwd.mtp1.mtp_proj" in names and "mb1.bwd.mtp1.mtp_proj_wgrad" in names
    with pytest.raises(InputError, match="mtp_repeated_layer shares one block") as e:
        replace(SMALL, mtp_repeated_layer=True).validate()
    assert "\n" not in str(e.value)


def test_pipeline_layout_strings_as_megatron_writes_them() -> None:
    assert parse_pipeline_layout("Et*4|(t*4|)*14tmL") == ((4,) * 15 + (1,), 1)
    assert parse_pipeline_layout("Et|(tt|)*30mL") == ((1,) + (2,) * 30 + (0,), 1)
    assert parse_pipeline_layout("E|t*2|t*2|tL") == ((0, 2, 2, 1), 0)
    plan = ParallelPlan(pp=2, vp=2, dp=1, num_micro_batches=2, pipeline_layout=(1, 2, 2, 0))
    plan.validate(replace(SMALL, num_layers=5))
    # model order: stage 0 chunk 0, stage 1 chunk 0, stage 0 chunk 1, stage 1 chunk 1
    assert [list(plan.chunk_layers(5, s, c)) for s in (0, 1) for c in (0, 1)] == [[0], [3, 4], [1, 2], []]
    for bad in ("tE|tL", "Et|tX", "Et|mt|L", ""):
        with pytest.raises(InputError, match="pipeline layout"):
            parse_pipeline_layout(bad)
    with pytest.raises(InputError, match="places 4 layers"):
        replace(plan, pipeline_layout=(1, 1, 2, 0)).validate(replace(SMALL, num_layers=5))
    with pytest.raises(InputError, match="multi-token-prediction"):
        replace(plan, pipeline_layout_mtp=1).validate(replace(SMALL, num_layers=5))


def test_shared_expert_never_shortens_the_step(tmp_path: Path) -> None:
    steps = []
    for width in (0, 256, 1024):
        model = replace(SMALL_MOE, name=f"s{width}", shared_expert_ffn=width)
        prefix, _ = generate(tmp_path, model, tp=2, dp=2, ep=2, num_micro_batches=2, sequence_parallel=True)
        steps.append(h100_run(prefix, 4).finish_ns)
    assert steps[0] < steps[1] < steps[2]


def test_flex_dispatcher_sends_a_token_once_per_destination_rank(tmp_path: Path) -> None:
    """DeepEP/HybridEP: one copy per rank holding any of the token's experts (expected over balanced routing),
    combined on the expert side; the experts' work is the same as the alltoall dispatcher's."""
    model = replace(SMALL_MOE, num_experts=8, top_k=4)
    prefix = str(tmp_path / "flex")
    generate_traces(model, ParallelPlan(dp=4, ep=4, num_micro_batches=1), prefix,
                    options=TrainingOptions(moe_dispatcher="flex"))
    a2a = load(prefix, 0, 4).collectives(A2A)
    # 8 experts on 4 ranks, top-4 distinct: a rank misses all 4 with probability C(6, 4) / C(8, 4) = 15 / 70
    assert {n.attrs["comm_size"] for n in a2a} == {round(ACT_BYTES * 4 * (1 - 15 / 70))}
    alltoall = str(tmp_path / "alltoall")
    generate_traces(model, ParallelPlan(dp=4, ep=4, num_micro_batches=1), alltoall)
    assert {n.attrs["comm_size"] for n in load(alltoall, 0, 4).collectives(A2A)} == {ACT_BYTES * 4}
    expert_in = {n.name: n.attrs for n in load(prefix, 0, 4).compute() if n.name.endswith("expert_in")}
    assert expert_in == {n.name: n.attrs for n in load(alltoall, 0, 4).compute() if n.name.endswith("expert_in")}


@given(experts_per_rank=st.integers(1, 8), ep=st.integers(1, 16), top_k=st.integers(1, 8))
def test_flex_copies_between_one_and_the_lesser_of_top_k_and_ranks(experts_per_rank: int, ep: int,
                                                                    top_k: int) -> None:
    experts = experts_per_rank * ep
    if top_k > experts:
        return
    copies = flex_copies(experts, top_k, ep)
    assert 1 - 1e-9 <= copies <= min(top_k, ep) + 1e-9
    if experts_per_rank == 1:  # one expert per rank: every chosen expert is another rank
        assert copies == pytest.approx(top_k)


def test_flex_dispatcher_across_nvlink_domains_crosses_once_per_domain(tmp_path: Path) -> None:
    """DeepEP/HybridEP across nodes: a token crosses to each other domain holding one of its experts once (epx: the
    ranks at the same place in each domain), and is forwarded inside the domain (epd) with the flex bytes; the two
    stages run at once (the expert GEMM waits for both)."""
    model = replace(SMALL_MOE, num_experts=16, top_k=4)
    plan = ParallelPlan(dp=8, ep=8, num_micro_batches=1)
    prefix = str(tmp_path / "domains")
    generate_traces(model, plan, prefix, options=TrainingOptions(moe_dispatcher="flex", nvlink_domain=4))
    t = load(prefix, 1, 8)
    a2a = t.collectives(A2A)
    across = [n for n in a2a if n.name.endswith("_across")]
    within = [n for n in a2a if n.name.endswith("_within")]
    assert len(across) == len(within) == 4 * model.num_layers and len(a2a) == len(across) + len(within)
    assert {t.members(n) for n in across} == {(1, 5)} and {t.members(n) for n in within} == {(0, 1, 2, 3)}
    # 2 domains of 8 experts, top-4: a domain holds none of a token's experts with probability C(8, 4) / C(16, 4)
    assert {n.attrs["comm_size"] for n in across} == {round(ACT_BYTES * 2 * (1 - 70 / 1820))}
    assert {n.attrs["comm_size"] for n in within} == {round(ACT_BYTES * flex_copies(16, 4, 8))}
    permute = next(n for n in t.compute() if n.name == "mb0.fwd.layer0.permute")  # DeepEP's, after the dispatch
    waits = {t.by_id(d).name for d in permute.deps}
    assert {"mb0.fwd.layer0.dispatch_alltoall_across", "mb0.fwd.layer0.dispatch_alltoall_within"} <= waits
    # an expert-parallel group inside one domain keeps the one all-to-all (and no extra groups)
    one = str(tmp_path / "one")
    generate_traces(model, plan, one, options=TrainingOptions(moe_dispatcher="flex", nvlink_domain=8))
    single = load(one, 1, 8)
    assert {n.name.rsplit(".", 1)[1] for n in single.collectives(A2A)} == {
        "dispatch_alltoall", "combine_alltoall", "combine_grad_alltoall", "dispatch_grad_alltoall"}
    plain = str(tmp_path / "plain")
    generate_traces(model, plan, plain, options=TrainingOptions(moe_dispatcher="flex"))
    assert single.groups == load(plain, 1, 8).groups and len(t.groups) == len(single.groups) + 2


def test_flex_exchange_across_two_h100_nodes_is_bound_by_one_crossing_per_domain(tmp_path: Path) -> None:
    """A Qwen3-30B-like MoE layer on 16 H100 (2 HGX nodes, EP 16): the dispatch with the domain stage is shorter
    than every rank's copy crossing the network, and no shorter than its crossings at the NICs' line rate."""
    from simulator.collectives.hardware import load_profile
    from simulator.config import MemoryConfig, default_system
    from simulator.simulation import RunOptions, Simulation
    from simulator.tools.training_hardware import network_for
    from workload.generated import workload_traces

    model = ModelConfig(name="moe-h2048", num_layers=1, hidden_size=2048, num_heads=32, num_kv_heads=4,
                        ffn_hidden_size=768, vocab_size=32000, seq_len=4096, gated_ffn=True, num_experts=128,
                        top_k=8)
    plan = ParallelPlan(dp=16, ep=16, num_micro_batches=1)
    profile = load_profile("hgx-h100")
    spans = {}
    for domain in (None, 8):
        prefix = str(tmp_path / f"d{domain}")
        generate_traces(model, plan, prefix, options=TrainingOptions(moe_dispatcher="flex", nvlink_domain=domain))
        network = network_for(profile, 16, "test")
        sim = Simulation(workload_traces(prefix, 16), network, default_system(network.num_dims), MemoryConfig(),
                         options=RunOptions(collective_model="nccl", hw_profile="hgx-h100", device="H100",
                                            comm_streams="communicator", timeline=True))
        sim.run()
        rank0 = next(w for w in sim.workloads if w.rank == 0)
        names = {i: rank0.graph.name(i) for i, _, _ in rank0.timeline.spans}
        dispatch = [(s, e) for i, s, e in rank0.timeline.spans if "fwd.layer0.dispatch_alltoall" in names[i]]
        spans[domain] = max(e for _, e in dispatch) - min(s for s, _ in dispatch)
    crossing_bytes = 4096 * 2048 * 2 * flex_copies(128, 8, 2) / 2  # the other node's share of the epx all-to-all
    nic_bytes_per_ns = profile.scale_out.nic_bandwidth_Gbps / 8 * profile.nics_per_node / 8
    assert crossing_bytes / nic_bytes_per_ns < spans[8] < spans[None] / 2


def test_expert_domains_split_only_where_every_group_splits_evenly() -> None:
    model = replace(SMALL_MOE, num_experts=16)
    plan = ParallelPlan(dp=8, ep=8)
    assert RankMap(plan, model, nvlink_domain=4).expert_domains() == (2, 4)
    assert RankMap(plan, model, nvlink_domain=8).expert_domains() is None  # one domain
    assert RankMap(plan, model, nvlink_domain=3).expert_domains() is None  # 3 + 3 + 2: uneven
    assert RankMap(plan, model, nvlink_domain=3).ep_splits_unevenly()
    assert not RankMap(plan, model, nvlink_domain=8).ep_splits_unevenly()
    assert RankMap(plan, model).expert_domains() is None
    rm = RankMap(ParallelPlan(dp=4, ep=4, tp=2), model, nvlink_domain=4)  # ep ranks 0, 2, 4, 6 (tp innermost)
    assert rm.expert_domains() == (2, 2)
    assert rm.group(2, "epd").ranks == (0, 2) and rm.group(2, "epx").ranks == (2, 6)


@given(experts_per_rank=st.integers(1, 4), ep_log2=st.integers(1, 5), domain_log2=st.integers(0, 4),
       top_k=st.integers(1, 8))
def test_flex_crossings_per_domain_never_exceed_the_copies_per_rank(experts_per_rank: int, ep_log2: int,
                                                                    domain_log2: int, top_k: int) -> None:
    ep, per_domain = 2 ** ep_log2, 2 ** domain_log2
    experts = experts_per_rank * ep
    if top_k > experts or per_domain >= ep:
        return
    domains = ep // per_domain
    across, ranks = flex_copies(experts, top_k, domains), flex_copies(experts, top_k, ep)
    assert across <= ranks + 1e-9 and across <= domains + 1e-9
    assert ranks <= across * per_domain + 1e-9  # a domain reached forwards to at most all of its ranks


@settings(max_examples=60, deadline=None)
@given(per_group=st.integers(1, 4), groups=st.integers(1, 6), parts_log2=st.integers(0, 3), top_k=st.integers(1, 4),
       data=st.data())
def test_flex_copies_under_group_limited_routing_match_enumeration(per_group: int, groups: int, parts_log2: int,
                                                                    top_k: int, data: st.DataObject) -> None:
    """Every choice of groups, then every choice of top-k experts among theirs, equally likely: the expected count
    of parts (ranks or domains, the experts split over them in order) holding one of a token's experts."""
    from itertools import combinations

    experts, parts = per_group * groups, 2 ** parts_log2
    if experts % parts:
        return
    group_topk = data.draw(st.integers(1, groups))
    if top_k > group_topk * per_group:
        return
    per_part = experts // parts
    hits = total = 0
    for chosen in combinations(range(groups), group_topk):
        pool = [e for g in chosen for e in range(g * per_group, (g + 1) * per_group)]
        for picked in combinations(pool, top_k):
            hits += len({e // per_part for e in picked})
            total += 1
    assert flex_copies(experts, top_k, parts, groups, group_topk) == pytest.approx(hits / total)


def test_group_limited_routing_caps_the_ranks_a_token_reaches(tmp_path: Path) -> None:
    """DeepSeek-V3's routing on 8 ranks of one group each: a token reaches at most its 4 groups' ranks; the
    alltoall dispatcher still sends it once per expert."""
    model = replace(SMALL_MOE, num_experts=32, top_k=8, router_groups=8, router_group_topk=4)
    assert flex_copies(32, 8, 8, 8, 4) == pytest.approx(4 * (1 - math.comb(12, 8) / math.comb(16, 8)))
    prefix = str(tmp_path / "groups")
    generate_traces(model, ParallelPlan(dp=8, ep=8), prefix, options=TrainingOptions(moe_dispatcher="flex"))
    assert {n.attrs["comm_size"] for n in load(prefix, 0, 8).collectives(A2A)} == {
        round(ACT_BYTES * flex_copies(32, 8, 8, 8, 4))}
    with pytest.raises(InputError, match="group-limited routing"):
        replace(model, router_group_topk=1).validate()  # 8 experts from one group of 4


def test_tied_embeddings_over_pipeline_stages_are_all_reduced(tmp_path: Path) -> None:
    prefix, _ = generate(tmp_path, SMALL_GPT, pp=2, num_micro_batches=2)
    first, last = load(prefix, 0, 2), load(prefix, 1, 2)
    (a,), (b,) = first.collectives(AR, "embedding_grad"), last.collectives(AR, "embedding_grad")
    assert first.members(a) == last.members(b) == (0, 1) and a.attrs["comm_size"] == b.attrs["comm_size"]


# --- pipeline ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_1f1b_order_on_a_4_stage_pipeline(tmp_path: Path, stage: int) -> None:
    prefix, _ = generate(tmp_path, SMALL, pp=4, num_micro_batches=8)
    t = load(prefix, stage, 4)
    compute = t.compute()
    order: list[tuple[str, int]] = []
    for n in compute[:-1]:  # all but the optimizer step
        mb, phase = n.name.split(".")[:2]
        step = ("F" if phase == "fwd" else "B", int(mb[2:]))
        if not order or order[-1] != step:
            order.append(step)
    assert compute[-1].name == "optimizer"
    warmup = 4 - stage - 1
    assert order[:warmup] == [("F", m) for m in range(warmup)]
    assert order[warmup:warmup + 2] == [("F", warmup), ("B", 0)]
    assert order[-warmup - 1:] == [("B", m) for m in range(8 - warmup - 1, 8)]
    assert order == one_f_one_b(4, stage, 8)
    for prev, node in pairwise(compute):  # one stream: each kernel after the previous
        assert prev.id in node.deps


def test_every_send_has_a_matching_receive(tmp_path: Path) -> None:
    prefix, plan = generate(tmp_path, SMALL, dp=2, tp=2, pp=4, num_micro_batches=4, sequence_parallel=True)
    sends, recvs = [], []
    for rank in range(plan.world_size):
        for n in load(prefix, rank, plan.world_size).nodes:
            key = (n.attrs.get("comm_src"), n.attrs.get("comm_dst"), n.attrs.get("comm_tag"), n.attrs.get("comm_size"))
            if n.type == NodeType.COMM_SEND_NODE:
                assert key[0] == rank
                sends.append(key)
            elif n.type == NodeType.COMM_RECV_NODE:
                assert key[1] == rank
                recvs.append(key)
    assert sorted(sends) == sorted(recvs) and len(set(sends)) == len(sends)
    assert len(sends) == 2 * (4 - 1) * 4 * 4  # activations and gradients, 3 stage boundaries, 4 replicas, 4 mbs
    assert {s[3] for s in sends} == {ACT_BYTES // 2}  # sequence parallel: each rank sends its shard
    rm = RankMap(plan, SMALL)
    assert all(rm.coords(s)[:2] == rm.coords(d)[:2] and abs(rm.coords(s)[2] - rm.coords(d)[2]) == 1
               for s, d, _, _ in sends)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(0, 5), st.integers(1, 12))
def test_1f1b_schedule_properties(pp: int, stage: int, mbs: int) -> None:
    stage %= pp
    order = one_f_one_b(pp, stage, mbs)
    assert sorted(order) == sorted([("F", m) for m in range(mbs)] + [("B", m) for m in range(mbs)])
    in_flight = 0
    for kind, m in order:
        in_flight += 1 if kind == "F" else -1
        assert 0 <= in_flight <= pp - stage  # at most pp - stage activations kept
        if kind == "B":
            assert order.index(("F", m)) < order.index(("B", m))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]),
       st.permutations(["tp", "dp", "pp"]))
def test_rank_map_is_a_bijection_with_consistent_groups(dp: int, tp: int, pp: int, layout: list[str]) -> None:
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp, layout=tuple(layout))
    rm = RankMap(plan, SMALL_GPT)
    seen = set()
    for r in range(plan.world_size):
        d, t, s = rm.coords(r)
        assert rm.rank(dp=d, tp=t, pp=s) == r
        seen.add((d, t, s))
        for kind in ("tp", "dp"):
            g = rm.group(r, kind)
            size = tp if kind == "tp" else dp
            assert (g is None) == (size == 1) and (g is None or (r in g.ranks and len(g.ranks) == size))
    assert len(seen) == plan.world_size


# --- simulation end to end --------------------------------------------------------------------------------

PLANS = [
    (SMALL, dict(dp=2, tp=2, pp=2, num_micro_batches=4)),
    (SMALL, dict(dp=2, tp=2, num_micro_batches=2, sequence_parallel=True, activation_recompute=True, zero_stage=1)),
    (SMALL_GPT, dict(dp=2, tp=2, pp=2, num_micro_batches=3, zero_stage=3)),
    (SMALL_GPT, dict(dp=2, pp=2, num_micro_batches=2, zero_stage=2, micro_batch_size=2)),
    (SMALL_MOE, dict(dp=4, tp=2, ep=2, num_micro_batches=2)),
    (SMALL_MOE, dict(dp=4, ep=4, pp=2, num_micro_batches=2, zero_stage=3)),
]


@pytest.mark.parametrize(("model", "plan"), PLANS, ids=[f"{m.name}-{i}" for i, (m, _) in enumerate(PLANS)])
def test_generated_traces_simulate_with_a_roofline(tmp_path: Path, model: ModelConfig, plan: dict[str, Any]) -> None:
    prefix, p = generate(tmp_path, model, **plan)
    result = h100_run(prefix, p.world_size)
    h100 = device("H100")
    roofline = Roofline(h100.peak_tflops * 1e12, h100.memory_bw_GBps * 1e9)
    for rank in (0, p.world_size - 1):
        kernels = load(prefix, rank, p.world_size).compute()
        expected = sum(roofline.time_ns(n.attrs["num_ops"], n.attrs["tensor_size"]) for n in kernels)
        assert result.ranks[rank].compute_ns == expected  # every kernel ran, timed by the roofline
        assert result.ranks[rank].finish_ns >= expected
    assert all(r.finish_ns > 0 for r in result.ranks)


def test_more_data_parallelism_keeps_and_more_tensor_parallelism_cuts_compute_per_rank(tmp_path: Path) -> None:
    runs = {}
    for dp, tp in ((2, 1), (4, 1), (2, 2)):
        prefix, p = generate(tmp_path / f"dp{dp}tp{tp}", SMALL, dp=dp, tp=tp, num_micro_batches=2)
        runs[dp, tp] = h100_run(prefix, p.world_size).ranks[0].compute_ns
    assert runs[4, 1] >= runs[2, 1]  # the same per-rank batch: the same work per rank
    assert runs[2, 2] < runs[2, 1]
    flops = {}
    for tp in (1, 2):
        plan = ParallelPlan(dp=2, tp=tp, num_micro_batches=2)
        flops[tp] = sum(stage_flops(build_programs(SMALL, plan)[0]).values())
    assert flops[2] < flops[1]


def test_device_fills_durations_from_the_roofline(tmp_path: Path) -> None:
    plan = ParallelPlan(tp=2, num_micro_batches=1)
    big = replace(SMALL, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=8192, seq_len=1024)
    generate_traces(big, plan, str(tmp_path / "t"), device("H100"))
    kernels = load(str(tmp_path / "t"), 0, 2).compute()
    h100 = device("H100")
    roofline = Roofline(h100.peak_tflops * 1e12, h100.memory_bw_GBps * 1e9)
    for n in kernels:
        ns = roofline.time_ns(n.attrs["num_ops"], n.attrs["tensor_size"])
        assert n.duration_us == max(round(ns / 1000), 1 if n.attrs["num_ops"] or n.attrs["tensor_size"] else 0)
    assert max(n.duration_us for n in kernels) > 100


def test_device_gives_sub_microsecond_kernels_one_microsecond(tmp_path: Path) -> None:
    """The iteration tail's batch copy and loss reduction (nanoseconds on an H100) are recorded as 1 us, not 0,
    which would read as no recorded duration: 1 ns in the run and a warning that compute went untimed although
    --device timed it."""
    out = run_cli("trace", "generate", "llm", "--layers", "2", "--hidden", "256", "--heads", "8", "--ffn-hidden",
                  "512", "--vocab", "1000", "--seq-len", "64", "--dp", "2", "--global-batch", "2", "--iteration-tail",
                  "--device", "H100", "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr
    kernels = load(out.stdout.splitlines()[0], 0, 2).compute()
    assert all(n.duration_us >= 1 for n in kernels if n.attrs["num_ops"] or n.attrs["tensor_size"])
    assert any(n.name.endswith("get_batch") and n.duration_us == 1 for n in kernels)
    network = tmp_path / "ring.yml"
    network.write_text("topology: [Ring]\nnpus_count: [2]\nbandwidth: [50]\nlatency: [500]\n")
    sim = run_cli("--workload", out.stdout.splitlines()[0], "--network", str(network), "--quiet")
    assert sim.returncode == 0 and "warning" not in sim.stderr, sim.stderr


# --- command line -----------------------------------------------------------------------------------------

def test_cli_writes_traces_prints_the_prefix_and_a_summary(tmp_path: Path) -> None:
    out = run_cli("trace", "generate", "llm", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn-hidden",
                  "512", "--vocab", "1000", "--seq-len", "64", "--dp", "2", "--tp", "2", "--pp", "2",
                  "--global-batch", "8", "--device", "H100", "-o", str(tmp_path), "--summary")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == str(tmp_path / "custom")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"custom.{r}.et" for r in range(8)]
    assert "x 6PT" in out.stdout and "attention scores" in out.stdout and "4 micro-batches of 1" in out.stdout
    assert any(n.duration_us > 0 for n in load(lines[0], 0, 8).compute())
    network = tmp_path / "ring.yml"
    network.write_text("topology: [Ring]\nnpus_count: [8]\nbandwidth: [50]\nlatency: [500]\n")
    sim = run_cli("--workload", lines[0], "--network", str(network), "--quiet")
    assert sim.returncode == 0, sim.stderr


def test_cli_lists_presets() -> None:
    out = run_cli("trace", "generate", "llm", "--list-presets")
    assert out.returncode == 0 and all(name in out.stdout for name in PRESETS)


def test_cli_shows_progress_while_writing_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Writing 16,384 ranks of Llama-3 405B (8.1 GB) took 2.5 minutes without a line (QA R4): now one every 10 s
    (here every rank), as the simulator's own progress lines, and none with --quiet."""
    import workload.traceset as traceset
    from simulator.cli import main

    monkeypatch.setattr(traceset, "PROGRESS_FIRST_S", 0.0)
    monkeypatch.setattr(traceset, "PROGRESS_EVERY_S", 0.0)
    argv = ["trace", "generate", "llm", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn-hidden", "512",
            "--vocab", "1000", "--seq-len", "64", "--tp", "2", "--pp", "2", "--global-batch", "4", "--device", "H100"]
    assert main([*argv, "-o", str(tmp_path / "a")]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == [f"astrasim-py: writing traces: {n} of 4 ranks"
                                                      for n in range(1, 5)]
    sizes = [float(line.split(", ")[1].split()[0]) for line in lines]
    written_kib = sum(p.stat().st_size for p in (tmp_path / "a").glob("*.et")) / 1024
    assert sizes == sorted(sizes) and lines[-1].split(", ")[1] == f"{written_kib:.1f} KiB"
    assert main([*argv, "-o", str(tmp_path / "b"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_cli_bad_plan_is_a_one_line_error(tmp_path: Path) -> None:
    out = run_cli("trace", "generate", "llm", "--preset", "llama3-8b", "--tp", "3", "-o", str(tmp_path))
    assert out.returncode in (1, 2) and "Traceback" not in out.stderr  # the CLI's exit code for bad input
    assert len(out.stderr.strip().splitlines()) == 1 and "not divisible by tp=3" in out.stderr


def _main(argv: list[str]) -> list[str]:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    warnings: list[str] = []
    cli.main(parser.parse_args(argv), warnings.append)
    return warnings


@pytest.mark.parametrize(("argv", "message"), [
    (["--preset", "gpt3-1.3b", "--dp", "2", "--tp", "2", "--npus", "16"], "world size mismatch"),
    (["--preset", "gpt3-2.7b", "--tp", "5"], "32 attention heads are not divisible by tp=5"),
    (["--preset", "gpt3-13b", "--layers", "2", "--pp", "3"], "2 layers cannot fill pp=3 stages"),
    (["--preset", "llama3-8b", "--dp", "4", "--global-batch", "10"], "global batch 10 is not divisible by dp=4"),
    (["--preset", "llama3-8b", "--dp", "2", "--global-batch", "8", "--micro-batches", "3"],
     "global batch 8 is not divisible by dp=2 x 3 micro-batches"),
    (["--preset", "llama3-8b", "--dp", "2", "--global-batch", "8", "--micro-batch-size", "2", "--micro-batches", "3"],
     "= dp=2 x micro-batch size 2 x 2 micro-batches, not 3"),
    (["--preset", "gpt-5"], "valid: gpt3-1.3b, gpt3-2.7b"),
    (["--preset", "mixtral-8x7b", "--dp", "4", "--ep", "3"], "ep=3 does not divide dp=4"),
    (["--preset", "llama3-8b", "--ep", "2", "--dp", "2"], "needs a mixture-of-experts model"),
    (["--preset", "llama3-8b", "--moe-shared-expert-intermediate-size", "1024"], "a shared expert .* needs a mixture"),
    (["--preset", "llama3-8b", "--kv-lora-rank", "512", "--q-lora-rank", "1536"], "as many key/value heads as query"),
    (["--preset", "llama3-8b", "--q-lora-rank", "1536"], "needs kv_lora_rank > 0"),
    (["--preset", "llama3-8b", "--dense-layers", "1"], "describe the dense layers of a mixture-of-experts model"),
    (["--preset", "mixtral-8x7b", "--layers", "2", "--dense-layers", "2"], "leaves none of the 2 layers"),
    (["--preset", "mixtral-8x7b", "--layers", "2", "--moe-shared-expert-intermediate-size", "1001", "--tp", "2"],
     "shared expert FFN size 1001 is not divisible by tp=2"),
    (["--layers", "4", "--hidden", "256"], "the model needs num_heads, ffn_hidden_size, vocab_size, seq_len"),
    (["--preset", "llama3-8b", "--layout", "tp,dp"], "rank layout"),
    ([], "give a model"),
])
def test_bad_input_errors(tmp_path: Path, argv: list[str], message: str) -> None:
    with pytest.raises(InputError, match=message) as e:
        _main([*argv, "-o", str(tmp_path)])
    assert "\n" not in str(e.value)


def test_model_file_and_overrides(tmp_path: Path) -> None:
    yml = tmp_path / "m.yml"
    yml.write_text("preset: llama3-8b\nnum_layers: 2\nseq_len: 128\n")
    _main(["--model-file", str(yml), "--hidden", "512", "--heads", "16", "--ffn-hidden", "1024", "--vocab", "1000",
           "-o", str(tmp_path / "out"), "--name", "tiny"])
    t = load(str(tmp_path / "out" / "tiny"), 0, 1)
    qkv = next(n for n in t.compute() if n.name == "mb0.fwd.layer1.qkv")
    # 128 tokens x 512 -> (16 query + 2 x 8 kv heads of 32): GQA from the preset, shapes from the flags
    assert qkv.attrs["num_ops"] == 2 * 128 * 512 * (16 + 2 * 8) * 32
    assert not any("layer2" in n.name for n in t.nodes)
    yml.write_text("num_layers: 2\nwidth: 3\n")
    with pytest.raises(InputError, match="unknown model key"):
        _main(["--model-file", str(yml), "-o", str(tmp_path)])


@pytest.mark.slow
def test_generation_speed_llama3_8b_on_128_ranks(tmp_path: Path) -> None:
    started = time.perf_counter()
    _main(["--preset", "llama3-8b", "--dp", "8", "--tp", "4", "--pp", "4", "--global-batch", "64",
           "-o", str(tmp_path)])
    assert time.perf_counter() - started < 10
    assert len(list(tmp_path.iterdir())) == 128


def test_uneven_pipeline_stages_shorten_the_first_and_last() -> None:
    """Layers that pp does not divide: ceil(L / pp) per stage, one fewer on the first and last stages first (Llama 3
    405B: 126 layers on 16 stages, 7 on the first and last); every layer in exactly one stage, in order."""
    from workload.llm.plan import stage_layers

    assert [len(stage_layers(126, 16, s)) for s in range(16)] == [7] + [8] * 14 + [7]
    for layers, pp in ((40, 3), (10, 4), (5, 4), (96, 8), (7, 7)):
        stages = [stage_layers(layers, pp, s) for s in range(pp)]
        assert [x for r in stages for x in r] == list(range(layers))
        assert max(map(len, stages)) - min(map(len, stages)) <= 1
    programs = build_programs(replace(SMALL, num_layers=5), ParallelPlan(pp=4, num_micro_batches=2))
    assert [p.layers for p in programs] == [range(0, 1), range(1, 2), range(2, 4), range(4, 5)]
