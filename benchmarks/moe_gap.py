"""Where the mixture-of-experts rows' error sits: each published MoE run's simulated step split into its experts'
part and the rest, and how far one factor on one part takes the rows of both validation tables.

    python benchmarks/moe_gap.py

The rows are the simulated MoE rows of benchmarks/data/training_validation.json (the shared tables) and
benchmarks/data/unseen_training_validation.json (the hold-out), read as validate-training saved them: each row's
breakdown of its slowest rank holds the experts' part of the compute per kernel class (their grouped GEMMs; the
permutations, sorts, activations, casts and biases of the routed tokens: simulator/tools/step_breakdown.py), the
rest of the compute, and the exposed expert-parallel exchange (the breakdown's ``ep*`` kinds). Nothing is
simulated again.

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
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.training_validation import moe

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"shared": ROOT / "benchmarks" / "data" / "training_validation.json",
        "hold-out": ROOT / "benchmarks" / "data" / "unseen_training_validation.json"}
PARTS = ("experts_matmul", "experts_memory", "ep_exchange")
FAMILIES = ("GPT_OSS", "Qwen3_30B", "Qwen3_235B", "Nemotron_3_Nano", "Nemotron_3_5", "Nemotron_3_Super",
            "DeepSeek", "Kimi")


def family(row_id: str) -> str:
    return next((f for f in FAMILIES if f.lower() in row_id.lower()), "other")


def record(table: str, row: dict[str, Any]) -> dict[str, Any]:
    """A simulated MoE row of a validation run as the report uses it."""
    g = row["generator"]
    return {"table": table, "row_id": row["row_id"], "device": row["device"], "family": family(row["row_id"]),
            "local_experts": int(g["num_experts"]) // int(g.get("ep", 1)),
            "step_ns": round(row["predicted_step_time_s"] * 1e9),
            "published_step_time_s": row["published_step_time_s"], "breakdown": row["breakdown"]}


def part_ns(rec: dict[str, Any]) -> dict[str, float]:
    """The time of each part on the slowest rank's step, compute amplified by the bubble (it is other stages'
    compute) as the surrogate counts it."""
    b = rec["breakdown"]
    busy = b["compute_busy_ns"] or 1
    amplify = (busy + b["bubble_ns"]) / busy
    experts = b["expert_compute_ns_by_class"]
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
    p.parse_args(argv)
    validated = {table: json.loads(path.read_text())["rows"] for table, path in RUNS.items()}
    moe_rows = [(table, r) for table, rows in validated.items() for r in rows if r["status"] == "simulated" and moe(r)]
    unsplit = [r["row_id"] for _, r in moe_rows if "expert_compute_ns_by_class" not in r["breakdown"]]
    if unsplit:
        return (f"moe_gap.py: error: {len(unsplit)} MoE rows were saved without their experts' compute (first: "
                f"{unsplit[0]}); run benchmarks/training_validation.py on them again")
    recs = [record(table, r) for table, r in moe_rows]
    print("\n".join(report(recs) + generation_pairs([r for rows in validated.values() for r in rows])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
