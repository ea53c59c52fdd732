"""``astrasim-py sweep SWEEP.yaml --out DIR`` and ``astrasim-py sweep export DIR --csv FILE``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from simulator.sweep.executors import EXECUTORS, default_jobs, run_points
from simulator.sweep.progress import Progress, format_duration
from simulator.sweep.spec import Point, load_sweep
from simulator.sweep.store import DB_NAME, ResultStore
from workload.errors import InputError

PROG = "astrasim-py sweep"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Run every point of a sweep file (base run x axes) into DIR/results.db (SQLite). "
                               "Running it again runs only the points that are missing or failed. "
                               f"Also: {PROG} export DIR --csv FILE")
    p.add_argument("sweep", help="sweep YAML (see configs/sweeps/)")
    p.add_argument("--out", required=True, metavar="DIR", help="results folder (DIR/results.db)")
    p.add_argument("--jobs", "-j", type=int, help=f"points run at once (default: all cores, here {default_jobs()})")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: worker processes on this machine (default); ray: tasks on a Ray cluster")
    p.add_argument("--ray-address", metavar="ADDR", help="Ray cluster to join (default: start a local instance)")
    p.add_argument("--dry-run", action="store_true", help="list the points and what is left to run; run nothing")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    return p


def run(argv: list[str], warn: Callable[[str], None]) -> int:
    if argv[:1] == ["export"]:
        return export(argv[1:])
    args = build_parser().parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        raise InputError("--jobs must be at least 1")
    if args.ray_address and args.executor != "ray":
        raise InputError("--ray-address needs --executor ray")
    sweep = load_sweep(args.sweep)
    points = _unique(sweep.points, warn)
    store = ResultStore(args.out)
    try:
        store.add_setting_columns(s.name for s in sweep.settings)
        store.set_meta(sweep_file=os.path.abspath(args.sweep), sweep_text=sweep.text, name=sweep.name)
        status = store.status()
        todo = [p for p in points if status.get(p.key) != "ok"]
        done = len(points) - len(todo)
        jobs = args.jobs or default_jobs()
        where = f"{jobs} local worker(s)" if args.executor == "local" else (
            f"Ray at {args.ray_address}" if args.ray_address else f"a local Ray instance ({jobs} CPUs)")
        print(f"{PROG}: {sweep.name}: {len(points)} points, {done} already done, {len(todo)} to run "
              f"on {where} -> {store.path}", file=sys.stderr)
        if args.dry_run:
            for p in todo[:20]:
                print(f"  #{p.index}: {_describe(p)}")
            if len(todo) > 20:
                print(f"  ... and {len(todo) - 20} more")
            return 0
        progress = Progress(len(todo), sweep.name, enabled=not args.quiet)
        try:
            for point, outcome in run_points(todo, args.executor, jobs, args.ray_address):
                store.record(point, outcome)
                progress.update(outcome["status"] == "ok")
        except KeyboardInterrupt:
            progress.close()
            print(f"{PROG}: interrupted after {progress.done} of {len(todo)} points (all recorded in {store.path}); "
                  "run the same command again to run the rest", file=sys.stderr)
            return 130
        return _summary(store, points, args.out, progress)
    finally:
        store.close()


def _unique(points: tuple[Point, ...], warn: Callable[[str], None]) -> list[Point]:
    seen: dict[str, Point] = {}
    for p in points:
        if p.key in seen:
            continue
        seen[p.key] = p
    if len(seen) < len(points):
        warn(f"{len(points) - len(seen)} point(s) resolve to the same run as an earlier point (axes that set the "
             "same thing?); each distinct run is simulated once")
    return list(seen.values())


def _describe(p: Point) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.settings.items()) or "(the base run)"


def _summary(store: ResultStore, points: list[Point], out: str, progress: Progress) -> int:
    status = store.status()
    failed = [p for p in points if status.get(p.key) != "ok"]
    elapsed = format_duration(progress.elapsed_s())
    print(f"{PROG}: {len(points) - len(failed)} of {len(points)} points ok, {len(failed)} failed "
          f"({progress.done} run now in {elapsed}); results in {store.path}", file=sys.stderr)
    if failed:
        names, rows = store.rows("WHERE status != 'ok'")
        errors = {row[names.index("key")]: row[names.index("error")] or "" for row in rows}
        for p in failed[:5]:
            first = (errors.get(p.key) or "not run").splitlines()[0]
            print(f"  failed #{p.index} ({_describe(p)}): {first}", file=sys.stderr)
        if len(failed) > 5:
            print(f"  ... and {len(failed) - 5} more (the 'error' column has every message)", file=sys.stderr)
    print(f"export: astrasim-py sweep export {out} --csv results.csv; "
          f"plot: astrasim-py plot {out} --x SETTING --y finish_ns", file=sys.stderr)
    return 1 if failed else 0


def export(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=f"{PROG} export", description="Write a sweep's results as CSV.")
    p.add_argument("dir", help="the sweep's results folder (--out)")
    p.add_argument("--csv", required=True, metavar="FILE", help="CSV file to write ('-' for standard output)")
    args = p.parse_args(argv)
    store = ResultStore(args.dir, create=False)
    try:
        count = store.export_csv(args.csv)
    finally:
        store.close()
    if args.csv != "-":
        print(f"{args.csv}: {count} points from {os.path.join(args.dir, DB_NAME)}", file=sys.stderr)
    return 0
