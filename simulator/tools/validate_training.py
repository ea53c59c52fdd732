"""``astrasim-py validate-training``: predicted training steps against published runs, with no fitting.

    astrasim-py validate-training --tables T.tsv [...] [--hw-profile P] [--json FILE] [--plot FILE]

For each row of the tables (the columns of ``../shared/reference/hardware/training/*.tsv``): build the layout it
states (blank fields take the framework's documented defaults, listed in ``defaults_used``), pick the shipped
hardware profile matching its machine (or ``--hw-profile``), generate the iteration in memory, simulate it once
with the NCCL-like collective model and the best compute model available, and compare with the published
figure in the row's own metric (error = predicted / published - 1) and as a step time. Rows needing what the
generator cannot express, or a machine without a profile, are reported with the reason; ``--approximate``
simulates the former without the missing features, marked as such and kept out of the exact statistics.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import wait
from typing import Any

from simulator.sweep.executors import capped_jobs
from simulator.tools.step_breakdown import PP
from simulator.tools.step_run import (
    Iteration,
    LimitedRun,
    check_layout,
    default_memory_gib,
    iteration_nodes,
    start_limited,
)
from simulator.tools.training_consistency import disagreements, format_disagreements
from simulator.tools.training_layout import NEEDS, READY, UNSUPPORTED, RowPlan, plan_row
from simulator.tools.training_metrics import METRICS
from simulator.tools.training_table import TrainingRow, read_tables
from workload.errors import InputError
from workload.optional import pyplot

PROG = "astrasim-py validate-training"
SIMULATED, APPROXIMATE, FAILED = "simulated", "approximate", "not finished"
RowDone = Callable[[dict[str, Any], list[dict[str, Any]]], None]  # a row done, and every row done so far


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Simulate one iteration of every published training run in "
                                "the tables and compare with the published step time or throughput. No fitting.")
    p.add_argument("--tables", required=True, nargs="+", metavar="T.tsv",
                   help="training tables (the columns of ../shared/reference/hardware/training/*.tsv)")
    p.add_argument("--hw-profile", metavar="NAME|FILE.yml", help="use this hardware profile for every row instead of "
                                                                 "the shipped one matching the row's machine")
    p.add_argument("--rows", metavar="REGEX", help="only rows whose row_id matches")
    p.add_argument("--approximate", action="store_true",
                   help="also simulate rows that need generator features not available yet, without them (reported "
                        "as approximate, kept out of the exact statistics)")
    p.add_argument("--plan-only", action="store_true", help="only show how each row would be run")
    p.add_argument("--code-values", action="store_true",
                   help="where a row prints another layout or batch than its release's code states (the recipes' "
                        "code_states), simulate the code's (default: the printed ones, as the row states them)")
    p.add_argument("--time-limit", type=float, default=600.0, metavar="SECONDS",
                   help="CPU-time limit of each row's simulation (default 600; 0 = none)")
    p.add_argument("--memory-limit", type=float, default=None, metavar="GiB",
                   help="address-space limit per row's simulation (default: three quarters of this machine's "
                        f"memory, here {default_memory_gib():g}, shared by the --jobs; 0 = none)")
    p.add_argument("--json", metavar="FILE", help="write rows and per-table summaries as JSON (rewritten as each row "
                                                  "finishes: an interrupted run keeps the rows it did)")
    p.add_argument("--resume", metavar="FILE", help="keep the rows a previous --json FILE simulated exactly as they "
                                                    "would be now (same layout, profile and device); simulate the rest")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="rows simulated at once, each in its own process (default 1; at most the cores here); "
                        "the default memory limit is shared between them, and a row over its share runs again "
                        "alone with all of it")
    p.add_argument("--plot", metavar="FILE.png", help="draw predicted vs published step time (needs matplotlib)")
    p.add_argument("-v", "--verbose", action="store_true", help="list every row's defaults and notes")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def row_json(plan: RowPlan, status: str, reason: str, iteration: Iteration | None) -> dict[str, Any]:
    """A row of the report (times in s; ``run`` holds what depends on the machine that ran it)."""
    m = plan.metric
    out: dict[str, Any] = {
        "row_id": plan.row.row_id, "table": plan.row.table, "source_id": plan.row.source_id,
        "model": plan.row.text("model"), "n_gpus": plan.n_gpus, "layout": plan.layout, "status": status,
        "reason": reason, "needs": plan.needs, "left_out": list(plan.left_out), "metric": m.name if m else None,
        "published": m.published if m else None, "predicted": None, "error": None,
        "published_step_time_s": _sig(m.published_step_time_s) if m else None,
        "published_step_time_note": m.step_note if m else "", "predicted_step_time_s": None,
        "step_time_error": None, "defaults_used": plan.defaults_used, "notes": plan.notes,
        "code_states": plan.code_states, "code_values": plan.code_values,
        "hw_profile": plan.profile or None, "device": plan.device or None, "collective_model": "nccl",
        "generator": plan.spec,
    }
    if iteration is not None and m is not None:
        step = iteration.step_time_ns / 1e9
        predicted = m.predicted(step)
        out.update(predicted=_sig(predicted), error=_sig(predicted / m.published - 1), predicted_step_time_s=step,
                   step_time_error=_sig(step / m.published_step_time_s - 1),
                   compute_model=iteration.compute_model, engine=iteration.engine,
                   simulated_ranks=iteration.simulated_ranks, breakdown=iteration.breakdown,
                   collectives=iteration.collectives,
                   run={"cpu_time_s": round(iteration.cpu_time_s, 2), "peak_rss_MB": iteration.peak_rss_MB,
                        "engine_reason": iteration.engine_reason},
                   notes=plan.notes + [f"simulator: {w}" for w in iteration.warnings])
        if status == APPROXIMATE:
            out["left_out"] = plan.needs + out["left_out"]
    return out


def _sig(value: float) -> float:
    """``value`` to 7 significant digits (what the JSON keeps of a ratio or a derived time)."""
    return float(f"{value:.7g}")


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean_abs": None, "max_abs": None, "mean": None}
    return {"mean_abs": _sig(sum(abs(v) for v in values) / len(values)), "max_abs": _sig(max(abs(v) for v in values)),
            "mean": _sig(sum(values) / len(values))}


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per table: row counts by status, and mean / max |error| (row metric and step time) over exact rows."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        tables.setdefault(r["table"], []).append(r)
    out = []
    for table, group in tables.items():
        exact = [r for r in group if r["status"] == SIMULATED]
        approx = [r for r in group if r["status"] == APPROXIMATE]
        counts: dict[str, int] = {}
        for r in group:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        out.append({"table": table, "rows": len(group), "by_status": counts,
                    "error": _stats([r["error"] for r in exact]),
                    "step_time_error": _stats([r["step_time_error"] for r in exact]),
                    "approximate_step_time_error": _stats([r["step_time_error"] for r in approx])})
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def _value(v: float | None, metric: str | None) -> str:
    if v is None:
        return "-"
    if metric == "mfu":
        return f"{v:.1%}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def format_row(r: dict[str, Any], verbose: bool, width: int) -> list[str]:
    label = METRICS[r["metric"]][0] if r["metric"] else "-"
    head = f"{r['row_id'][:width]:<{width}} {r['n_gpus']:>5} {r['layout'][:22]:<22} "
    if r["predicted"] is None:
        lines = [head + (f"{r['status']}: {r['reason']}" if r["reason"] else r["status"])]
    else:
        published, predicted = _value(r["published"], r["metric"]), _value(r["predicted"], r["metric"])
        lines = [head + f"{label:<16} {published:>9} {predicted:>9} {_pct(r['error']):>7}  step "
                 f"{r['published_step_time_s']:.4g} s -> {r['predicted_step_time_s']:.4g} s "
                 f"({_pct(r['step_time_error'])})" + ("  APPROXIMATE" if r["status"] == APPROXIMATE else "")]
        b = r["breakdown"]
        step = b["step_ns"] or 1
        classes = ", ".join(f"{k} {v / step:.0%}" for k, v in b["compute_ns_by_class"].items())
        comm = ", ".join(f"{k} {v / step:.0%}" for k, v in b["exposed_comm_ns_by_kind"].items() if v and k != PP)
        lines.append(f"{'':>8}compute {b['compute_busy_ns'] / step:.0%} ({classes}); exposed comm "
                     f"{b['exposed_collectives_ns'] / step:.0%}" + (f" ({comm})" if comm else "")
                     + (f"; exposed host {b['exposed_host_ns'] / step:.0%}" if b.get("exposed_host_ns") else "")
                     + f"; bubble {b['bubble_ns'] / step:.0%}; {r['hw_profile']}, {r['compute_model']} compute, "
                     f"{r['simulated_ranks']} of {r['n_gpus']} ranks simulated")
        if r["left_out"]:
            lines.append(f"{'':>8}left out (no generator option): {'; '.join(r['left_out'])}")
    if verbose:
        if r.get("run"):
            run = r["run"]
            lines.append(f"{'':>8}run: {run['cpu_time_s']:g} s CPU, peak RSS {run['peak_rss_MB']:,} MB; engine: "
                         f"{run['engine_reason']}")
        lines += [f"{'':>8}default: {d}" for d in r["defaults_used"]]
        lines += [f"{'':>8}note: {n}" for n in r["notes"]]
    else:
        if r["defaults_used"] and r["predicted"] is not None:
            lines.append(f"{'':>8}{len(r['defaults_used'])} default(s) used (-v lists them)")
        if r.get("code_states"):  # the published number may be of another run than the row prints
            code = ", ".join(f"{k} {v}" for k, v in r["code_states"].items())
            lines.append(f"{'':>8}its release's code states {code}, not the printed values (-v: the note)")
        if r.get("code_values"):  # --code-values: not the row as printed
            code = ", ".join(f"{k} {v}" for k, v in r["code_values"].items())
            lines.append(f"{'':>8}simulated with its release's code values {code} (-v: the printed ones)")
    return lines


def format_summary(tables: Sequence[dict[str, Any]]) -> list[str]:
    lines = [f"{'table':<28} {'rows':>4} {'exact':>5} {'mean|err|':>9} {'max|err|':>9} {'mean|step err|':>14} "
             f"{'approx':>6} {'mean|step err|':>14}  not simulated"]
    for t in tables:
        c = t["by_status"]
        rest = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k not in (SIMULATED, APPROXIMATE))
        e, s, a = t["error"], t["step_time_error"], t["approximate_step_time_error"]
        lines.append(f"{t['table'][:28]:<28} {t['rows']:>4} {c.get(SIMULATED, 0):>5} {_abs(e['mean_abs']):>9} "
                     f"{_abs(e['max_abs']):>9} {_abs(s['mean_abs']):>14} {c.get(APPROXIMATE, 0):>6} "
                     f"{_abs(a['mean_abs']):>14}  {rest or '-'}")
    return lines


def _abs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def draw(path: str, rows: Sequence[dict[str, Any]]) -> None:
    plt = pyplot("validate-training --plot")
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    shown = [r for r in rows if r["predicted_step_time_s"] is not None]
    tables = sorted({r["table"] for r in shown})
    for i, table in enumerate(tables):
        for status, face in ((SIMULATED, colors[i % len(colors)]), (APPROXIMATE, "none")):
            pts = [r for r in shown if r["table"] == table and r["status"] == status]
            if pts:
                ax.scatter([r["published_step_time_s"] for r in pts], [r["predicted_step_time_s"] for r in pts],
                           facecolors=face, edgecolors=colors[i % len(colors)], s=36,
                           label=table.removesuffix(".tsv") + (" (approximate)" if status == APPROXIMATE else ""))
    values = [v for r in shown for v in (r["published_step_time_s"], r["predicted_step_time_s"])] or [0.1, 10]
    low, high = min(values) / 1.5, max(values) * 1.5
    ax.plot([low, high], [low, high], "k-", linewidth=0.8)
    ax.fill_between([low, high], [low * 0.9, high * 0.9], [low * 1.1, high * 1.1], color="grey", alpha=0.15,
                    label="within 10%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("published step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("validate-training: predicted vs published")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def same_run(saved: Mapping[str, Any], plan: RowPlan) -> bool:
    """Whether a saved report row was simulated as ``plan`` would be: same generator mapping, profile and device."""
    def canonical(value: object) -> str:
        return json.dumps(value, sort_keys=True)

    return (saved.get("status") in (SIMULATED, APPROXIMATE) and saved.get("hw_profile") == (plan.profile or None)
            and saved.get("device") == (plan.device or None)
            and canonical(saved.get("generator")) == canonical(json.loads(json.dumps(plan.spec))))


def evaluate_rows(rows: Sequence[TrainingRow], hw_profile: str | None = None, *, approximate: bool = False,
                  plan_only: bool = False, time_limit_s: float = 600.0, memory_gib: float | None = None,
                  quiet: bool = True, devices: Mapping[str, str] | None = None, jobs: int = 1,
                  saved: Mapping[str, Mapping[str, Any]] | None = None,
                  on_row: RowDone | None = None, code_values: bool = False) -> list[dict[str, Any]]:
    """Plan and (unless ``plan_only``) simulate every row; the report's rows, in the tables' order.

    ``jobs`` rows simulate at once, each in its own process; ``memory_gib`` is each one's limit (None: three
    quarters of the machine's memory shared between the ``jobs``, and a row over its share runs again alone, with
    all of it, once the others are done). A row of ``saved`` (report rows by row_id) that
    was simulated exactly as planned now is kept instead of simulated again. ``on_row(row, done)`` hears of each
    row as it is done, with every row done so far in the tables' order (for saving as the run goes). ``devices``
    maps a shipped device name to a device file to use instead (a calibration trying other device-level knobs).
    ``code_values``: plan_row's (the release's code's layout and batch where the row prints others)."""
    alone_gib = None  # the limit of a row that went over its share of the default one, run again by itself
    if memory_gib is None:
        memory_gib = default_memory_gib() / max(1, jobs)
        alone_gib = default_memory_gib() if jobs > 1 else None
    results: list[dict[str, Any] | None] = [None] * len(rows)

    def done(i: int, row: dict[str, Any]) -> None:
        results[i] = row
        if on_row is not None:
            on_row(row, [r for r in results if r is not None])

    pending: list[tuple[int, RowPlan]] = []
    for i, row in enumerate(rows):
        plan = plan_row(row, hw_profile, code_values)
        runnable = plan.status == READY or (approximate and plan.status == NEEDS and plan.approximable)
        status, reason = plan.status, plan.reason
        if runnable:
            try:
                check_layout(plan.spec, row.row_id)
                status = "planned" if plan.status == READY else "planned (approximate)"
            except InputError as e:  # the generator refuses the layout (e.g. layers that do not split evenly)
                runnable, status, reason = False, UNSUPPORTED, str(e)
        kept = (saved or {}).get(row.row_id)
        if runnable and not plan_only and kept is not None and same_run(kept, plan):
            done(i, dict(kept))
        elif runnable and not plan_only:
            pending.append((i, plan))
        else:
            done(i, row_json(plan, status, reason, None) | {"trace_nodes": None})
    def start(i: int, plan: RowPlan, gib: float, again: str = "") -> LimitedRun:
        if not quiet:
            print(f"[{i + 1}/{len(rows)}] {plan.row.row_id}: simulating {plan.n_gpus} ranks{again} ...",
                  file=sys.stderr)
        device = (devices or {}).get(plan.device, plan.device)
        return start_limited(plan.spec, plan.network, plan.profile, device, plan.row.row_id,  # type: ignore[arg-type]
                             time_limit_s, int(gib * 2**30))

    running: dict[Any, tuple[int, RowPlan, LimitedRun]] = {}
    over_share: list[tuple[int, RowPlan]] = []
    while pending or running:
        while pending and len(running) < max(1, jobs):
            i, plan = pending.pop(0)
            run = start(i, plan, memory_gib)
            running[run.connection] = (i, plan, run)
        for connection in wait(list(running)):
            i, plan, run = running.pop(connection)
            got = run.result()
            if alone_gib is not None and isinstance(got, str) and got.startswith("over the memory limit"):
                over_share.append((i, plan))
            else:
                done(i, _simulated_row(plan, got))
    for i, plan in over_share:
        done(i, _simulated_row(plan, start(i, plan, alone_gib, f" alone ({alone_gib:g} GiB)").result()))  # type: ignore[arg-type]
    return [r for r in results if r is not None]


def _simulated_row(plan: RowPlan, got: Iteration | str) -> dict[str, Any]:
    """The report row of a simulation that ran (``got``: its Iteration, or why it did not finish)."""
    if isinstance(got, str):
        reason = got
        nodes = None
        if "limit" in got:
            nodes, folded = iteration_nodes(plan.spec, plan.row.row_id)
            reason += (f" ({plan.n_gpus} ranks, {nodes:,} trace nodes, {folded:,} of them in one rank per pipeline "
                       "stage: beyond what one run simulates here)")
        return row_json(plan, FAILED, reason, None) | {"trace_nodes": nodes}
    status = SIMULATED if plan.status == READY else APPROXIMATE
    return row_json(plan, status, "", got) | {"trace_nodes": got.trace_nodes}


def write_report(path: str, results: Sequence[dict[str, Any]], rows: Sequence[TrainingRow]) -> None:
    """The report as JSON: rows, per-table summaries, and where published rows disagree; replaced whole, so that a
    reader never sees half a file."""
    by_id = {r["row_id"]: r["published_step_time_s"] for r in results}
    conflicts = disagreements([row for row in rows if row.row_id in by_id], by_id)
    doc = {"rows": list(results), "tables": summarize(results),
           "disagreements": [{"row_ids": list(d.row_ids), "published_step_time_s": list(d.published_step_time_s),
                              "least_error": _sig(d.least_error)} for d in conflicts]}
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(partial, path)


def read_report(path: str) -> list[dict[str, Any]]:
    """The rows of a report ``--json`` wrote; a one-line error when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)["rows"]
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "row_id" in r for r in rows):
            raise ValueError("rows without row_id")
    except OSError as e:
        raise InputError(f"--resume {path}: cannot read it: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"--resume {path}: not a validate-training --json report ({e})") from None
    return rows


def run(argv: list[str], warn: Callable[[str], None]) -> int:
    args = build_parser().parse_args(argv)
    if args.plot:
        pyplot("validate-training --plot")  # say it is missing before any work
    if args.time_limit < 0 or (args.memory_limit or 0) < 0:
        raise InputError("--time-limit and --memory-limit must be >= 0")
    rows = read_tables(args.tables)
    if args.rows:
        try:
            pattern = re.compile(args.rows)
        except re.error as e:
            raise InputError(f"--rows: not a regular expression: {e}") from None
        rows = [r for r in rows if pattern.search(r.row_id)]
        if not rows:
            raise InputError(f"--rows {args.rows!r} matches no row")
    jobs = capped_jobs(args.jobs, False, warn)
    saved: dict[str, dict[str, Any]] = {}
    if args.resume:
        saved = {r["row_id"]: r for r in read_report(args.resume)}

    def keep(row: dict[str, Any], done: list[dict[str, Any]]) -> None:  # the report so far, after each simulation
        if args.json and row["status"] in (SIMULATED, APPROXIMATE, FAILED):
            write_report(args.json, done, rows)

    results = evaluate_rows(rows, args.hw_profile, approximate=args.approximate, plan_only=args.plan_only,
                            time_limit_s=args.time_limit, memory_gib=args.memory_limit, quiet=args.quiet, jobs=jobs,
                            saved=saved, on_row=keep, code_values=args.code_values)
    tables = summarize(results)
    print("error = predicted / published - 1 in the row's metric; step: published (or derived) -> predicted step time")
    width = min(64, max(len(r["row_id"]) for r in results))
    print(f"{'row':<{width}} {'GPUs':>5} {'layout':<22} {'metric':<16} {'published':>9} {'predicted':>9} {'error':>7}")
    for r in results:
        print("\n".join(format_row(r, args.verbose, width)))
    print()
    print("\n".join(format_summary(tables)))
    conflicts = disagreements(rows, {r["row_id"]: r["published_step_time_s"] for r in results})
    if conflicts:
        print()
        print("\n".join(format_disagreements(conflicts)))
    if args.json:
        write_report(args.json, results, rows)
    if args.plot:
        draw(args.plot, results)
        print(args.plot)
    return 0
