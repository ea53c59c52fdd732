"""Training steps against the published runs: every plannable row of the shared training tables simulated with
``--compute-model kernels`` and the NCCL-like collectives, one line per row with its error and where the step went,
and the plot of predicted vs published step time.

    python benchmarks/training_validation.py [--shared ../shared] [--unseen] [--rows REGEX] [--time-limit S]
                                             [--save FILE.json] [--resume FILE.json] [--jobs N]
                                             [--plot docs/FILE.png]
    python benchmarks/training_validation.py --from-json benchmarks/data/training_validation.json [--plot ...]

The run committed in benchmarks/data/training_validation.json (rows that fit the limits of one run here: 300 s of
CPU, three quarters of the machine's 24 GB of memory) is what the documentation quotes; ``--from-json`` reprints it
without simulating.

Columns: published and predicted step time (s), error = predicted / published - 1, and on the slowest rank the
shares of the step: GEMMs (mm), attention (at), memory-bound kernels (el), the optimizer step (op), exposed
communication by group kind (tp, dp, ep, cp, ...; what runs while no kernel does) and the pipeline bubble with
send/receive waits (bub). ``--save`` keeps the run (rows, breakdowns, errors) so that ``--from-json`` reprints it
and the calibration (benchmarks/training_calibration.py) reads it without simulating again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from simulator.tools.step_breakdown import PP
from simulator.tools.training_table import read_tables
from simulator.tools.validate_training import SIMULATED, draw, evaluate_rows, read_report
from workload.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
CLASSES = (("matmul", "mm"), ("attention", "at"), ("elementwise", "el"), ("optimizer", "op"))


UNSEEN = ROOT / "benchmarks" / "data" / "unseen_training"


def tables(shared: Path, unseen: bool = False) -> list[str]:
    """The shared calibration tables, or with ``unseen`` the published runs kept out of calibration."""
    folder = UNSEEN if unseen else shared / "reference" / "hardware" / "training"
    return sorted(str(p) for p in folder.glob("*.tsv"))


def shares(r: dict[str, Any]) -> str:
    """Where the slowest rank's step went, in % of the step."""
    b = r["breakdown"]
    step = b["step_ns"] or 1
    parts = [f"{short} {b['compute_ns_by_class'].get(name, 0) / step:4.0%}" for name, short in CLASSES]
    if b["compute_ns_by_class"].get("scan"):  # a hybrid model's Mamba-2 scan kernels
        parts.insert(2, f"ssd {b['compute_ns_by_class']['scan'] / step:4.0%}")
    comm = sorted(((v, k) for k, v in b["exposed_comm_ns_by_kind"].items() if k != PP and v / step >= 0.005),
                  reverse=True)
    parts.append("comm " + (" ".join(f"{k} {v / step:.0%}" for v, k in comm) or "-"))
    if b.get("exposed_host_ns"):
        parts.append(f"host {b['exposed_host_ns'] / step:.0%}")
    parts.append(f"bub {b['bubble_ns'] / step:.0%}")
    return "  ".join(parts)


def row_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    width = 44
    lines = [f"{'row':<{width}} {'GPUs':>5} {'layout':<22} {'dev':<5} {'pub s':>8} {'pred s':>8} {'error':>7}  "
             "slowest rank: share of the step"]
    for r in rows:
        name = r["row_id"].replace("Pre-Training_DGX-", "")[:width]
        head = f"{name:<{width}} {r['n_gpus']:>5} {r['layout'][:22]:<22} {(r['device'] or '-')[:5]:<5} "
        if r["status"] != SIMULATED:
            lines.append(head + f"{r['status']}: {r['reason'][:110]}")
            continue
        lines.append(head + f"{r['published_step_time_s']:>8.4g} {r['predicted_step_time_s']:>8.4g} "
                            f"{r['step_time_error']:>+7.1%}  {shares(r)}")
    return lines


def moe(r: dict[str, Any]) -> bool:
    return int(r["generator"].get("num_experts", 1)) > 1


def error_lines(rows: Sequence[dict[str, Any]], key: str = "step_time_error") -> list[str]:
    """Mean and max |error| by source and over all simulated rows, and apart those whose release's code states
    other values than they print."""
    done = [r for r in rows if r["status"] == SIMULATED]
    groups: dict[str, list[float]] = {}
    for r in done:
        groups.setdefault(r["source_id"], []).append(r[key])
    groups["dense models"] = [r[key] for r in done if not moe(r)]
    groups["mixture-of-experts"] = [r[key] for r in done if moe(r)]
    groups["all simulated rows"] = [r[key] for r in done]
    # rows whose release's code states another layout or batch than they print (configs/recipes, code_states)
    groups["code states otherwise"] = [r[key] for r in done if r.get("code_states")]
    if groups["code states otherwise"]:
        groups["the other rows"] = [r[key] for r in done if not r.get("code_states")]
    lines = [f"{'source':<24} {'rows':>4} {'mean|err|':>9} {'max|err|':>9} {'mean err':>9}"]
    for name, errs in groups.items():
        if errs:
            lines.append(f"{name:<24} {len(errs):>4} {sum(map(abs, errs)) / len(errs):>9.1%} "
                         f"{max(map(abs, errs)):>9.1%} {sum(errs) / len(errs):>+9.1%}")
    return lines


def status_line(rows: Sequence[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return f"{len(rows)} rows: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def save(path: str, rows: Sequence[dict[str, Any]]) -> None:
    """The rows without what depends on the machine that ran them (CPU time) or is only detail (collectives)."""
    kept = [{k: v for k, v in r.items() if k not in ("run", "collectives")} for r in rows]
    partial = Path(f"{path}.partial")  # replaced whole: a run stopped while saving keeps the last save
    partial.write_text(json.dumps({"rows": kept}, indent=1) + "\n")
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", default=str(ROOT.parent / "shared"))
    p.add_argument("--unseen", action="store_true",
                   help="the published runs kept out of calibration (benchmarks/data/unseen_training/) instead")
    p.add_argument("--rows", help="only rows whose row_id matches this regular expression")
    p.add_argument("--time-limit", type=float, default=300.0, help="CPU seconds per row (default 300)")
    p.add_argument("--save", metavar="FILE.json", help="keep the run's rows")
    p.add_argument("--from-json", metavar="FILE.json", nargs="+", help="reprint saved runs instead of simulating")
    p.add_argument("--resume", metavar="FILE.json",
                   help="keep the rows a saved run simulated as they would be now, simulate the others")
    p.add_argument("-j", "--jobs", type=int, default=1, help="rows simulated at once (default 1)")
    p.add_argument("--plot", metavar="FILE.png", help="predicted vs published step time (needs matplotlib)")
    args = p.parse_args(argv)
    if args.from_json:
        rows = [r for f in args.from_json for r in json.loads(Path(f).read_text())["rows"]]
        if args.save:  # several runs (e.g. of different tables) as one
            save(args.save, rows)
    else:
        import re

        chosen = read_tables(tables(Path(args.shared), args.unseen))
        if args.rows:
            chosen = [r for r in chosen if re.search(args.rows, r.row_id)]
        saved = {r["row_id"]: r for r in read_report(args.resume)} if args.resume else {}

        def keep(row: dict[str, Any], done: list[dict[str, Any]]) -> None:  # saved as it goes: stop and resume
            if args.save and row["status"] == SIMULATED:
                save(args.save, done)

        rows = evaluate_rows(chosen, time_limit_s=args.time_limit, quiet=False, jobs=args.jobs, saved=saved,
                             on_row=keep)
        if args.save:
            save(args.save, rows)
    runnable = [r for r in rows if r["status"] not in ("needs", "unsupported")]
    print("\n".join(row_lines(runnable)))
    print()
    print(status_line(rows))
    print("\n".join(error_lines(rows)))
    if args.plot:
        draw(args.plot, rows)
        print(args.plot)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as e:  # a file that is not a saved run, a pattern matching nothing: one line, no traceback
        sys.exit(f"training_validation.py: error: {e}")
