"""Where the mixture-of-experts rows' error sits: each published MoE run's simulated step split into its experts'
part and the rest, and how far one factor on one part takes the rows of both validation tables.

    python benchmarks/moe_gap.py                    # report from benchmarks/data/moe_gap.json
    python benchmarks/moe_gap.py --refresh [-j 2]   # simulate the rows again first (about 30 min at -j 2)

The rows are the simulated MoE rows of benchmarks/data/training_validation.json (the shared tables) and
benchmarks/data/unseen_training_validation.json (the hold-out), planned and simulated as validate-training does.
On the slowest rank, compute is summed per kernel class for the experts' part (their grouped GEMMs; the
permutations, sorts, activations, casts and biases of the routed tokens: the generator's ``expert_*``, ``permute``,
``unpermute``, ``sort_chunks``, ``unsort_chunks``, ``rdma_staging`` nodes and the activation of a layer with
experts) and for the rest; the exposed expert-parallel exchange is the breakdown's ``ep*`` kinds.

A factor on one part changes a row's step as a surrogate does (benchmarks/training_calibration.py): that part's
time times the factor, compute amplified by the row's bubble, everything else kept. Each factor is fitted on the
shared tables' rows (least squares on log step time) and applied to both tables; a part whose fitted factor
improves the shared rows but not the hold-out ones is not where the error sits.

Last, the same published run on two GPU generations (Megatron-Bridge's rows of one release, model, GPU count and
precision on GB300 and GB200, B300 and B200): the simulated over the published ratio of their step times, dense
and MoE apart. An error the model makes alike on both GPUs cancels there; what remains is how the model's
generations differ on that kind of step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.training_validation import moe, tables
from simulator.tools.step_breakdown import NodeKinds, slowest_rank, slowest_rank_breakdown
from workload.schema import NodeType

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "moe_gap.json"
RUNS = {"shared": ROOT / "benchmarks" / "data" / "training_validation.json",
        "hold-out": ROOT / "benchmarks" / "data" / "unseen_training_validation.json"}
EXPERT_NODES = ("permute", "unpermute", "sort_chunks", "unsort_chunks", "rdma_staging")
PARTS = ("experts_matmul", "experts_memory", "ep_exchange")
FAMILIES = ("GPT_OSS", "Qwen3_30B", "Qwen3_235B", "Nemotron_3_Nano", "Nemotron_3_5", "Nemotron_3_Super",
            "DeepSeek", "Kimi")


def family(row_id: str) -> str:
    return next((f for f in FAMILIES if f.lower() in row_id.lower()), "other")


def expert_names(programs: Sequence[Any]) -> set[str]:
    """The names of the experts' compute nodes (see the module's docstring)."""
    moe_layers = {op.name.rsplit(".", 1)[0] for p in programs for op in p.ops
                  if op.name.rsplit(".", 1)[-1].startswith("expert_in")}
    out = set()
    for p in programs:
        for op in p.ops:
            if op.node_type != NodeType.COMP_NODE or op.host_us is not None:
                continue
            layer, short = op.name.rsplit(".", 1) if "." in op.name else ("", op.name)
            if short.startswith("expert_") or short in EXPERT_NODES or (
                    short.startswith("activation") and layer in moe_layers):
                out.add(op.name)
    return out


def split(sim: Any, result: Any, programs: Sequence[Any]) -> dict[str, Any]:
    """The slowest rank's breakdown, and its compute per kernel class in the experts' part and in the rest."""
    kinds = NodeKinds.of_programs(list(programs))
    breakdown = slowest_rank_breakdown(sim, result, kinds)
    _, workload = slowest_rank(sim, result)
    experts = expert_names(programs)
    parts: dict[str, dict[str, int]] = {"experts": defaultdict(int), "rest": defaultdict(int)}
    for i, start, end in workload.timeline.spans:
        name = workload.graph.name(i)
        kind = kinds.kinds.get(name)
        if kind is not None and kind[0] == "compute":
            parts["experts" if name in experts else "rest"][kind[1]] += end - start
    return {"breakdown": breakdown, "compute_ns": {k: dict(sorted(v.items())) for k, v in parts.items()}}


def simulate(job: tuple[str, str, list[str]]) -> dict[str, Any]:
    """One row (``table``, ``row_id``, the tables to read it from) simulated as validate-training does."""
    from simulator.tools.step_run import simulate_iteration
    from simulator.tools.training_layout import plan_row
    from simulator.tools.training_table import read_tables

    table, row_id, paths = job
    row = next(r for r in read_tables(paths) if r.row_id == row_id)
    plan = plan_row(row)
    got: dict[str, Any] = {}
    it = simulate_iteration(plan.spec, plan.network, plan.profile, plan.device,
                            warn=lambda _: None, inspect=lambda s, r, p: got.update(split(s, r, p)))
    g = plan.spec
    return {"table": table, "row_id": row_id, "device": plan.device, "family": family(row_id),
            "local_experts": int(g["num_experts"]) // int(g.get("ep", 1)), "step_ns": it.step_time_ns, **got}


def refresh(jobs: int, pattern: str | None, shared: Path, kept: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The validation runs' MoE rows (those matching ``pattern``) simulated again; the other rows from ``kept``."""
    rows = [(table, r["row_id"], tables(shared, unseen=table == "hold-out")) for table, path in RUNS.items()
            for r in json.loads(path.read_text())["rows"] if r["status"] == "simulated" and moe(r)]
    todo = [job for job in rows if pattern is None or re.search(pattern, job[1])]
    got = {(r["table"], r["row_id"]): r for r in kept}
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for rec in pool.map(simulate, todo):
            got[rec["table"], rec["row_id"]] = rec
            print(f"{rec['table']:8s} {rec['row_id'][:70]:70s} {rec['step_ns'] / 1e9:8.3f} s", flush=True)
    return [got[table, row_id] for table, row_id, _ in rows if (table, row_id) in got]


def part_ns(rec: dict[str, Any]) -> dict[str, float]:
    """The time of each part on the slowest rank's step, compute amplified by the bubble (it is other stages'
    compute) as the surrogate counts it."""
    b = rec["breakdown"]
    busy = b["compute_busy_ns"] or 1
    amplify = (busy + b["bubble_ns"]) / busy
    experts = rec["compute_ns"]["experts"]
    return {"experts_matmul": amplify * experts.get("matmul", 0),
            "experts_memory": amplify * sum(v for k, v in experts.items() if k != "matmul"),
            "ep_exchange": float(sum(v for k, v in b["exposed_comm_ns_by_kind"].items() if k.startswith("ep")))}


def error(rec: dict[str, Any], factors: dict[str, float]) -> float:
    ns = part_ns(rec)
    step = rec["step_ns"] + sum((factors.get(p, 1.0) - 1.0) * ns[p] for p in PARTS)
    return step / (rec["published_step_time_s"] * 1e9) - 1


def fit(recs: Sequence[dict[str, Any]], part: str) -> float:
    """The factor on ``part`` minimising the squared log error of ``recs`` (golden-section search on [0.25, 4])."""
    def cost(f: float) -> float:
        return sum(math.log1p(error(r, {part: f})) ** 2 for r in recs)
    lo, hi = 0.25, 4.0
    g = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if cost(a) <= cost(b) else (a, hi)
    return round((lo + hi) / 2, 3)


def stats(errors: Sequence[float]) -> str:
    if not errors:
        return "      -"
    return f"{sum(map(abs, errors)) / len(errors):6.1%} ({sum(errors) / len(errors):+6.1%})"


def report(recs: Sequence[dict[str, Any]]) -> list[str]:
    lines = [f"{'table':8s} {'run':58s} {'GPU':6s} {'local':>5s} {'error':>7s}  {'experts: GEMM':>13s} "
             f"{'memory':>7s}  {'exposed EP':>10s}"]
    for r in sorted(recs, key=lambda r: (r["table"] != "shared", error(r, {}))):
        ns, step = part_ns(r), r["step_ns"]
        lines.append(f"{r['table']:8s} {r['row_id'][:58]:58s} {r['device']:6s} {r['local_experts']:5d} "
                     f"{error(r, {}):+7.1%}  {ns['experts_matmul'] / step:13.0%} {ns['experts_memory'] / step:7.0%}"
                     f"  {ns['ep_exchange'] / step:10.0%}")
    shared = [r for r in recs if r["table"] == "shared"]
    fitted = {p: fit(shared, p) for p in PARTS}
    groups = sorted({(r["table"], r["family"]) for r in recs}, key=lambda g: (g[0] != "shared", g[1]))
    lines += ["", "mean |error| (mean error) by table and model family: as simulated, and with one factor on one part "
              "fitted on the shared rows",
              f"{'table':8s} {'family':18s} {'rows':>4s}  {'as simulated':>16s}" +
              "".join(f"  {p + ' x' + format(fitted[p], 'g'):>22s}" for p in PARTS)]
    for table, fam in [*groups, ("shared", "all"), ("hold-out", "all")]:
        sel = [r for r in recs if r["table"] == table and fam in ("all", r["family"])]
        lines.append(f"{table:8s} {fam:18s} {len(sel):4d}  {stats([error(r, {}) for r in sel]):>16s}" +
                     "".join(f"  {stats([error(r, {p: fitted[p]}) for r in sel]):>22s}" for p in PARTS))
    lines += ["", "mean |error| (mean error) by local experts per rank"]
    for n in sorted({r["local_experts"] for r in recs}):
        cells = [f"{t} {len(s):3d} rows {stats([error(r, {}) for r in s])}" for t in RUNS
                 for s in [[r for r in recs if r["table"] == t and r["local_experts"] == n]] if s]
        lines.append(f"  {n:3d}: " + ";  ".join(cells))
    return lines


GENERATION_PAIRS = (("GB300", "GB200"), ("B300", "B200"))


def same_run(row_id: str) -> str:
    """A Megatron-Bridge row's id without its GPU and table position: equal for one release, model, GPU count and
    precision on two GPUs."""
    return re.sub(r"_\d+$", "", re.sub(r"DGX-[A-Z0-9]+", "DGX", row_id))


def generation_pairs(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Per GPU pair and kind (dense, MoE): the pairs' mean |error| and mean error of the simulated step ratio
    against the published one."""
    runs: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        if r["row_id"].startswith("mbridge_") and r.get("predicted_step_time_s"):
            runs[same_run(r["row_id"])][r["device"]] = r
    lines = ["", "the same published run on two GPUs: simulated / published ratio of their steps, minus 1"]
    for new, old in GENERATION_PAIRS:
        for kind in ("dense", "MoE"):
            errors = [(a["predicted_step_time_s"] / b["predicted_step_time_s"]) /
                      (a["published_step_time_s"] / b["published_step_time_s"]) - 1
                      for pair in runs.values() if new in pair and old in pair
                      for a, b in [(pair[new], pair[old])] if moe(a) == (kind == "MoE")]
            if errors:
                lines.append(f"  {new:5s} over {old:5s} {kind:5s} {len(errors):3d} pairs  {stats(errors)}")
    return lines


def main(argv: list[str] | None = None) -> int | str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--refresh", action="store_true", help="simulate the rows again (writes the data file)")
    p.add_argument("--rows", help="with --refresh: only rows whose row_id matches this regular expression (the "
                   "others are kept as saved)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="rows simulated at once (default 1)")
    p.add_argument("--shared", default=str(ROOT.parent / "shared"))
    p.add_argument("--data", default=str(DATA), help=f"the split runs (default {DATA.relative_to(ROOT)})")
    args = p.parse_args(argv)
    validated = [r for path in RUNS.values() for r in json.loads(path.read_text())["rows"]]
    published = {r["row_id"]: r["published_step_time_s"] for r in validated if r.get("published_step_time_s")}
    data = Path(args.data)
    recs = json.loads(data.read_text())["rows"] if data.exists() else []
    if args.refresh:  # with --rows, the other rows are kept as saved
        recs = refresh(args.jobs, args.rows, Path(args.shared), recs)
        data.write_text(json.dumps({"rows": recs}, indent=1, sort_keys=True) + "\n")
    if not recs:
        return f"moe_gap.py: error: no split runs in {data} (make them with --refresh)"
    for r in recs:
        r["published_step_time_s"] = published[r["row_id"]]
    print("\n".join(report(recs) + generation_pairs(validated)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
