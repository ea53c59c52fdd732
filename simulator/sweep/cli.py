"""``astrasim-py sweep SWEEP.yaml --out DIR`` and ``astrasim-py sweep export DIR --csv FILE``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Iterator

from simulator.sweep.executors import EXECUTORS, capped_jobs, default_jobs, run_points
from simulator.sweep.progress import Progress, format_duration
from simulator.sweep.scratch import Terminated, stop_signals_raise
from simulator.sweep.spec import DEFAULT_MAX_POINTS, Point, Sweep, load_sweep
from simulator.sweep.store import DB_NAME, ResultStore
from workload.errors import InputError, shown
from workload.files import shown_path
from workload.tools.generate import parse_size

PROG = "astrasim-py sweep"
EXAMPLES = 20  # points a dry run lists


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Run every point of a sweep file (base run x axes) into DIR/results.db (SQLite). "
                               "Running it again runs only the points that are missing or failed; sweeps run "
                               "at the same time on one DIR share the work (each point runs once). "
                               f"Also: {PROG} export DIR --csv FILE")
    p.add_argument("sweep", help="sweep YAML (see configs/sweeps/)")
    p.add_argument("--out", required=True, metavar="DIR", help="results folder (DIR/results.db)")
    p.add_argument("--jobs", "-j", type=int,
                   help=f"points run at once, at most the cores this process may use (default: all, here "
                        f"{default_jobs()})")
    p.add_argument("--force-jobs", action="store_true", help="run --jobs points at once even above the core count")
    p.add_argument("--worker-memory", metavar="SIZE",
                   help="address-space limit of each local worker process, e.g. 8GiB: a point that needs more "
                        "fails with 'out of memory' instead of pushing the machine into swap (default: no limit)")
    p.add_argument("--max-points", type=int, default=DEFAULT_MAX_POINTS, metavar="N",
                   help=f"refuse a sweep of more points than this (default {DEFAULT_MAX_POINTS:,}); the count is "
                        "the product of the axis lengths, known before any point is built")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: worker processes on this machine (default); ray: tasks on a Ray cluster")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster to join (default: start a local instance, listening on 127.0.0.1 only)")
    p.add_argument("--dry-run", action="store_true",
                   help="count the points, list the first ones and what is left to run; run nothing")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    return p


def run(argv: list[str], warn: Callable[[str], None]) -> int:
    if argv[:1] == ["export"]:
        return export(argv[1:])
    args = build_parser().parse_args(argv)
    if args.ray_address and args.executor != "ray":
        raise InputError("--ray-address needs --executor ray")
    if args.max_points < 1:
        raise InputError("--max-points must be at least 1")
    # a cluster's size is its own; only work on this machine is capped at its cores
    jobs = (args.jobs or default_jobs()) if args.ray_address else capped_jobs(args.jobs, args.force_jobs, warn)
    memory = _size(args.worker_memory) if args.worker_memory else None
    if memory and args.executor != "local":
        warn("--worker-memory applies to local workers only; Ray workers run under the cluster's limits")
    sweep = load_sweep(args.sweep)
    where = f"{jobs} local worker(s)" if args.executor == "local" else (
        f"Ray at {args.ray_address}" if args.ray_address else f"a local Ray instance ({jobs} CPUs)")
    if args.dry_run:
        return _dry_run(sweep, args.out, args.max_points, where, warn)
    sweep.check_size(args.max_points)
    points = _unique(sweep.iter_points(), sweep.count, warn)
    try:
        with stop_signals_raise():
            return _run(sweep, points, args, jobs, memory, where)
    except Terminated as stop:  # the signal came outside the run (while opening the results, say)
        return 128 + stop.signum


def _run(sweep: Sweep, points: list[Point], args: argparse.Namespace, jobs: int, memory: int | None,
         where: str) -> int:
    store = ResultStore(args.out)
    try:
        store.add_setting_columns(s.name for s in sweep.settings)
        store.set_meta(sweep_file=os.path.abspath(args.sweep), sweep_text=sweep.text, name=sweep.name)
        status = store.status()
        todo = [p for p in points if status.get(p.key) != "ok"]
        print(f"{PROG}: {sweep.name}: {len(points)} points, {len(points) - len(todo)} already done, {len(todo)} to "
              f"run on {where} -> {shown_path(store.path)}", file=sys.stderr)
        progress = Progress(len(todo), sweep.name, enabled=not args.quiet)
        held: list[Point] = []
        claimed = _claimed(todo, store, progress, held)
        try:
            for point, outcome in run_points(claimed, args.executor, jobs, args.ray_address, memory,
                                             store.renew_claims):
                store.record(point, outcome)
                progress.update(outcome["status"] == "ok")
        except (KeyboardInterrupt, Terminated) as stop:
            progress.close()
            how = "interrupted" if isinstance(stop, KeyboardInterrupt) else f"stopped by {stop}"
            print(f"{PROG}: {how} after {progress.done} of {len(todo)} points (all recorded in "
                  f"{shown_path(store.path)}); run the same command again to run the rest", file=sys.stderr)
            return 130 if isinstance(stop, KeyboardInterrupt) else 128 + stop.signum
        return _summary(store, points, held, args.out, progress)
    finally:
        try:
            store.release_claims()
        finally:
            store.close()


def _claimed(todo: list[Point], store: ResultStore, progress: Progress, held: list[Point]) -> Iterator[Point]:
    """The points this process takes, each claimed just before it runs: another sweep on the same folder may
    have finished or taken it meanwhile."""
    for point in todo:
        state = store.claim(point.key)
        if state == "claimed":
            yield point
            continue
        progress.skip()
        if state == "held":
            held.append(point)


def _size(text: str) -> int:
    try:
        size = parse_size(text)
    except ValueError as e:
        raise InputError(f"--worker-memory: {e}") from None
    if size < 64 << 20:
        raise InputError(f"--worker-memory {shown(text)}: a worker needs at least 64MiB")
    return size


def _unique(points: Iterable[Point], count: int, warn: Callable[[str], None]) -> list[Point]:
    seen: dict[str, Point] = {}
    for p in points:
        seen.setdefault(p.key, p)
    if len(seen) < count:
        warn(f"{count - len(seen)} point(s) resolve to the same run as an earlier point (axes that set the "
             "same thing?); each distinct run is simulated once")
    return list(seen.values())


def _dry_run(sweep: Sweep, out: str, max_points: int, where: str, warn: Callable[[str], None]) -> int:
    """What a run would do, without building more points than it lists when the sweep is over the limit."""
    status: dict[str, str] = {}
    if os.path.exists(os.path.join(out, DB_NAME)):
        store = ResultStore(out, create=False)
        try:
            status = store.status()
        finally:
            store.close()
    if sweep.count > max_points:
        print(f"{PROG}: {sweep.name}: {sweep.count:,} points ({sweep.shape()}), more than --max-points "
              f"{max_points:,}: a run would stop before building them", file=sys.stderr)
        listed = [sweep.point(i) for i in range(min(EXAMPLES, sweep.count))]
        more = sweep.count - len(listed)
    else:
        points = _unique(sweep.iter_points(), sweep.count, warn)
        todo = [p for p in points if status.get(p.key) != "ok"]
        print(f"{PROG}: {sweep.name}: {len(points)} points, {len(points) - len(todo)} already done, {len(todo)} to "
              f"run on {where} -> {shown_path(os.path.join(out, DB_NAME))}", file=sys.stderr)
        listed, more = todo[:EXAMPLES], len(todo) - EXAMPLES
    for p in listed:
        print(f"  #{p.index}: {_describe(p)}")
    if more > 0:
        print(f"  ... and {more:,} more")
    return 0


def _describe(p: Point) -> str:
    return ", ".join(f"{k}={shown(v, 60)}" for k, v in p.settings.items()) or "(the base run)"


def _summary(store: ResultStore, points: list[Point], held: list[Point], out: str, progress: Progress) -> int:
    status = store.status()
    elsewhere = [p for p in held if status.get(p.key) != "ok"]
    others = {p.key for p in elsewhere}
    failed = [p for p in points if status.get(p.key) != "ok" and p.key not in others]
    elapsed = format_duration(progress.elapsed_s())
    print(f"{PROG}: {len(points) - len(failed) - len(elsewhere)} of {len(points)} points ok, {len(failed)} failed"
          + (f", {len(elsewhere)} running in another sweep process on this folder" if elsewhere else "")
          + f" ({progress.done} run now in {elapsed}); results in {shown_path(store.path)}", file=sys.stderr)
    if failed:
        names, rows = store.rows("WHERE status != 'ok'")
        errors = {row[names.index("key")]: row[names.index("error")] or "" for row in rows}
        for p in failed[:5]:
            first = (errors.get(p.key) or "not run").splitlines()[0]
            print(f"  failed #{p.index} ({_describe(p)}): {first}", file=sys.stderr)
        if len(failed) > 5:
            print(f"  ... and {len(failed) - 5} more (the 'error' column has every message)", file=sys.stderr)
    _warned(store, points)
    print(f"export: astrasim-py sweep export {shown_path(out)} --csv results.csv; "
          f"plot: astrasim-py plot {shown_path(out)} --x SETTING --y finish_ns", file=sys.stderr)
    return 1 if failed else 0


def _warned(store: ResultStore, points: list[Point], shown_lines: int = 3) -> None:
    """Say that points ran with warnings, with the first few (they were only in the database: a sweep of generated
    LLM layouts without a device, each computing in about 0 ns, said '2 of 2 points ok' and nothing else)."""
    by_key = {p.key: p for p in points}
    names, rows = store.rows("WHERE status = 'ok' AND warnings IS NOT NULL")
    key, text = names.index("key"), names.index("warnings")
    warned = sorted(((by_key[row[key]], row[text]) for row in rows if row[key] in by_key), key=lambda w: w[0].index)
    if not warned:
        return
    first: dict[str, Point] = {}
    for p, lines in warned:
        for line in lines.splitlines():
            first.setdefault(line, p)
    print(f"{PROG}: {len(warned)} of the points ok ran with warnings (the 'warnings' column has every one):",
          file=sys.stderr)
    for line, p in list(first.items())[:shown_lines]:
        print(f"  #{p.index}: {line}", file=sys.stderr)
    if len(first) > shown_lines:
        print(f"  ... and {len(first) - shown_lines} more", file=sys.stderr)


def export(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=f"{PROG} export",
                                description="Write a sweep's results as CSV (read-only: the results folder may be "
                                            "read-only; cells a spreadsheet would run as a formula start with ').")
    p.add_argument("dir", help="the sweep's results folder (--out)")
    p.add_argument("--csv", required=True, metavar="FILE", help="CSV file to write ('-' for standard output)")
    args = p.parse_args(argv)
    store = ResultStore(args.dir, create=False)
    try:
        count = store.export_csv(args.csv)
    finally:
        store.close()
    if args.csv != "-":
        print(f"{shown_path(args.csv)}: {count} points from {shown_path(os.path.join(args.dir, DB_NAME))}",
              file=sys.stderr)
    return 0

