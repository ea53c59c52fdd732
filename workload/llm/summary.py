"""What a generated iteration contains: parameters, FLOPs (by kind, per rank), bytes per communicator group
kind, node counts; as a dict (JSON-able) and as text."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields
from typing import Any

from compute.roofline import Roofline
from workload.llm.build import StageProgram
from workload.llm.memory import stage_memory
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import GROUP_DESCRIPTIONS, ParallelPlan, RankMap
from workload.schema import NodeType

CATEGORIES = ("matmul", "attention", "scan", "elementwise", "optimizer")
RING = "-ring"  # comm_bytes key suffix of point-to-point sends along a tensor- or context-parallel ring


def stage_flops(program: StageProgram) -> Counter[tuple[str, str]]:
    """FLOPs of one rank of the stage by (phase, category)."""
    out: Counter[tuple[str, str]] = Counter()
    for op in program.ops:
        if op.kernel is not None:
            out[op.phase, op.kernel.category] += op.kernel.flops
    return out


def summarize(model: ModelConfig, plan: ParallelPlan, programs: list[StageProgram], ranks: RankMap,
              roofline: Roofline | None = None, options: TrainingOptions | None = None) -> dict[str, Any]:
    """The summary of the iteration the programs describe (totals are over all ranks)."""
    options = options or TrainingOptions()
    per_stage = plan.dp * plan.tp * plan.cp
    tokens = plan.global_batch * model.seq_len
    by_kind: Counter[tuple[str, str]] = Counter()
    stage_totals, comm_bytes, comm_count, node_types = [], Counter(), Counter(), Counter()
    compute_us = []
    for program in programs:
        flops = stage_flops(program)
        for key, value in flops.items():
            by_kind[key] += value * per_stage
        stage_totals.append(sum(flops.values()))
        busy_ns = 0
        for op in program.ops:
            node_types[NodeType(op.node_type).name] += per_stage
            if op.node_type in (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE):
                ring = op.node_type == NodeType.COMM_SEND_NODE and op.group != "pp"
                kind = op.group + RING if ring else op.group  # sends along a tp/cp ring, apart from collectives
                comm_bytes[kind] += op.size_bytes * per_stage
                comm_count[kind] += per_stage
            if roofline is not None and op.kernel is not None:
                busy_ns += roofline.time_ns(op.kernel.flops, op.kernel.size_bytes)
        compute_us.append(busy_ns / 1000)
    total = sum(by_kind.values())
    six_pt = 6 * model.active_params() * tokens
    result: dict[str, Any] = {
        "model": model.name,
        "params": model.total_params(),
        "active_params": model.active_params(),
        "matmul_params": model.matmul_params(),
        "plan": {"world_size": plan.world_size, "dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "ep": plan.ep,
                 "cp": plan.cp, "vp": plan.vp, "etp": plan.expert_tp, "cp_comm_type": plan.cp_comm_type,
                 "zero_stage": plan.zero_stage, "global_batch": plan.global_batch,
                 "micro_batch_size": plan.micro_batch_size, "micro_batches": plan.num_micro_batches,
                 "sequence_parallel": plan.sequence_parallel,
                 "activation_recompute": plan.recompute_mode == "full", "recompute": plan.recompute_mode,
                 "recompute_modules": sorted(plan.recomputed),
                 "layers_per_stage": plan.stage_layer_counts(model.num_layers),
                 "layout": ",".join(plan.full_layout if plan.cp > 1 else plan.layout)},
        "options": {f.name: getattr(options, f.name) for f in fields(options)},
        "tokens": tokens,
        "flops": {"total": total, **{c: sum(v for (_, cat), v in by_kind.items() if cat == c) for c in CATEGORIES},
                  "recompute": sum(v for (phase, _), v in by_kind.items() if phase == "recompute")},
        "flops_6pt": six_pt,
        "flops_per_rank_by_stage": stage_totals,
        "comm_bytes": dict(comm_bytes),
        "comm_count": dict(comm_count),
        "memory_by_stage": [{"stage": m.stage, "total_bytes": m.total_bytes, "weights_bytes": m.weights_bytes,
                             "grads_bytes": m.grads_bytes, "optimizer_bytes": m.optimizer_bytes,
                             "activations_bytes": m.activations_bytes, "runtime_bytes": m.runtime_bytes,
                             "forward_passes_held": m.in_flight} for m in stage_memory(model, plan, options)],
        "nodes": {"total": sum(node_types.values()) + sum(1 for r in range(plan.world_size) if ranks.rank_groups(r)),
                  "per_rank_by_stage": [len(p.ops) for p in programs], "by_type": dict(node_types)},
    }
    if roofline is not None:
        result["compute_us_per_rank_by_stage"] = compute_us
    return result


def _num(value: float) -> str:
    for unit, factor in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= factor:
            return f"{value / factor:.3f} {unit}"
    return f"{value:.0f} "


def _bytes(value: float) -> str:
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= factor:
            return f"{value / factor:.2f} {unit}"
    return f"{value:.0f} B"


def memory_lines(by_stage: list[dict[str, Any]]) -> list[str]:
    """The device-memory estimate (workload/llm/memory.py) as text: the stage needing the most, and every stage's
    total when there are several."""
    top = max(by_stage, key=lambda m: m["total_bytes"])
    lines = [f"device memory per rank (estimate): {_bytes(top['total_bytes'])} at most"
             + (f", on stage {top['stage']}" if len(by_stage) > 1 else "")
             + f": weights {_bytes(top['weights_bytes'])}, gradients {_bytes(top['grads_bytes'])}, optimizer states "
             f"{_bytes(top['optimizer_bytes'])}, activations {_bytes(top['activations_bytes'])} "
             f"({top['forward_passes_held']} forward pass(es) held), runtime {_bytes(top['runtime_bytes'])}"]
    if len(by_stage) > 1:
        lines.append("device memory per rank by stage: " + ", ".join(_bytes(m["total_bytes"]) for m in by_stage))
    return lines


def format_summary(s: dict[str, Any]) -> str:
    """The summary as text lines."""
    p, f = s["plan"], s["flops"]
    total = f["total"] or 1
    lines = [
        f"model {s['model']}: {s['params'] / 1e9:.3f}B parameters ({s['active_params'] / 1e9:.3f}B active per token, "
        f"{s['matmul_params'] / 1e9:.3f}B in matmuls)",
        f"plan: {p['world_size']} ranks = dp {p['dp']} x tp {p['tp']} x pp {p['pp']}"
        + (f" x cp {p['cp']} ({p['cp_comm_type']})" if p["cp"] > 1 else "") + f" (layout {p['layout']}), "
        f"ep {p['ep']}" + (f" (etp {p['etp']})" if p["ep"] > 1 and p["etp"] != p["tp"] else "")
        + f", ZeRO {p['zero_stage']}, global batch {p['global_batch']} = {p['micro_batches']} "
        f"micro-batches of {p['micro_batch_size']} per data-parallel rank"
        + (f", interleaved over {p['vp']} virtual stages" if p["vp"] > 1 else "")
        + (", sequence parallel" if p["sequence_parallel"] else "")
        + (", activation recompute" if p["recompute"] == "full" else "")
        + (f", selective recompute ({', '.join(p['recompute_modules'])})" if p["recompute"] == "selective" else ""),
        f"tokens per iteration: {s['tokens']}",
        f"FLOPs per iteration (all ranks): {_num(f['total'])}FLOP = {f['total'] / s['flops_6pt']:.3f} x 6PT "
        f"({_num(s['flops_6pt'])}FLOP)",
        f"  matmuls with parameters {_num(f['matmul'])}FLOP ({f['matmul'] / total:.1%}), attention scores "
        f"{_num(f['attention'])}FLOP ({f['attention'] / total:.1%}), "
        + (f"Mamba-2 scans {_num(f['scan'])}FLOP ({f['scan'] / total:.1%}), " if f["scan"] else "")
        + f"elementwise {_num(f['elementwise'])}FLOP "
        f"({f['elementwise'] / total:.2%}), optimizer {_num(f['optimizer'])}FLOP ({f['optimizer'] / total:.2%})"
        + (f"; recompute {_num(f['recompute'])}FLOP ({f['recompute'] / total:.1%})" if f["recompute"] else ""),
        "FLOPs per rank by pipeline stage: " + ", ".join(_num(v) + "FLOP" for v in s["flops_per_rank_by_stage"]),
    ]
    if p["pp"] > 1 and len(set(p["layers_per_stage"])) > 1:
        lines.append("layers per pipeline stage: " + ", ".join(map(str, p["layers_per_stage"])))
    o = s["options"]
    recipe = {"fp8": f"FP8 GEMMs ({o.get('fp8_recipe', 'delayed')} scaling)", "fp4": "NVFP4 GEMMs"}
    settings = [name for name, on in ((recipe.get(o["precision"] or "", ""), o["precision"] in recipe),
                                      ("gradients reduced in fp32", o["grad_reduce_in_fp32"]),
                                      ("TP communication overlapped", o["tp_comm_overlap"]),
                                      ("parameter all-gathers overlapped", o["overlap_param_gather"]),
                                      ("iteration tail", o["iteration_tail"])) if on]
    if o["bucket_size"] is not None:
        settings.append(f"gradient buckets {o['bucket_size']}")
    if settings:
        lines.append("step: " + ", ".join(settings))
    if "compute_us_per_rank_by_stage" in s:
        lines.append("roofline compute time per rank by stage: "
                     + ", ".join(f"{v / 1000:.2f} ms" for v in s["compute_us_per_rank_by_stage"]))
    if s["comm_bytes"]:
        lines.append("bytes communicated (comm_size summed over ranks; ALL_GATHER: per-rank input):")
        for kind in sorted(s["comm_bytes"], key=lambda k: -s["comm_bytes"][k]):
            sends = kind == "pp" or kind.endswith(RING)
            what = GROUP_DESCRIPTIONS[kind.removesuffix(RING)] + (" ring" if kind.endswith(RING) else "")
            lines.append(f"  {kind:4s} {what}: {_bytes(s['comm_bytes'][kind])} in "
                         f"{s['comm_count'][kind]} {'sends' if sends else 'collectives'}")
    n = s["nodes"]
    lines.append(f"nodes: {n['total']} in all, per rank by stage " + ", ".join(map(str, n["per_rank_by_stage"]))
                 + " (" + ", ".join(f"{k} {v}" for k, v in sorted(n["by_type"].items())) + ")")
    lines += memory_lines(s["memory_by_stage"])
    return "\n".join(lines)
