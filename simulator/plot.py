"""``astrasim-py plot DIR --x SETTING --y METRIC [--hue SETTING] [--where SETTING=VALUE ...]``: sweep charts."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from simulator.sweep.store import ResultStore
from simulator.sweep.worker import METRICS
from simulator.units import current_key, labelled
from workload.errors import ConfigError, InputError, shown
from workload.files import contained_path, parse_yaml
from workload.optional import pyplot

PROG = "astrasim-py plot"
_NOT_SETTINGS = {"key", "idx", "status", "error", "warnings", "version", *METRICS}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Chart a sweep's results: one line per --hue value.")
    p.add_argument("dir", help="the sweep's results folder (--out of astrasim-py sweep; read only)")
    p.add_argument("--x", required=True, metavar="SETTING", help="swept setting on the x axis")
    p.add_argument("--y", default="finish_ns", metavar="METRIC",
                   help="metric on the y axis (default finish_ns; times in ns, busbw_GBps and algbw_GBps in GB/s with "
                        "GB = 10^9 B)")
    p.add_argument("--hue", metavar="SETTING", help="swept setting that tells lines apart")
    p.add_argument("--where", action="append", default=[], metavar="SETTING=VALUE",
                   help="keep only points with this value (repeatable); a list value as written in the sweep or "
                        "plainly: system.all-reduce-implementation=ring,direct or =[ring, direct]")
    p.add_argument("--out", metavar="FILE.png", help="image to write (default DIR/<y>_by_<x>.png)")
    p.add_argument("--logx", action="store_true", help="logarithmic x axis")
    p.add_argument("--logy", action="store_true", help="logarithmic y axis")
    return p


def _spellings(text: str) -> list[Any]:
    """What a --where value may mean: the text, a number or list as YAML/JSON reads it, a comma-separated list."""
    values: list[Any] = [text]
    with contextlib.suppress(ValueError):
        values.append(json.loads(text))
    with contextlib.suppress(ConfigError):
        values.append(parse_yaml(text, "--where"))
    if "," in text and not text.lstrip().startswith(("[", "{")):
        values.append([_scalar(item.strip()) for item in text.split(",")])
    return values


def _scalar(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (int, float)) else text


def _parsed(cell: Any) -> Any:
    """A stored setting as its value (lists and mappings are stored as JSON)."""
    if isinstance(cell, str) and cell[:1] in "[{":
        try:
            return json.loads(cell)
        except ValueError:
            return cell
    return cell


def _matches(cell: Any, wanted: list[Any]) -> bool:
    """Whether a stored setting is one of the spellings (booleans are stored as 0/1, and match true/false)."""
    value = _parsed(cell)
    return str(cell) == wanted[0] or any(value == w for w in wanted)


def select(store: ResultStore, x: str, y: str, hue: str | None, where: list[str]
           ) -> dict[Any, list[tuple[Any, Any]]]:
    """{hue value: [(x, y), ...] in sweep order} over the ok points. Metrics may be named as earlier versions
    named them (busbw_gbps for busbw_GBps)."""
    x, y = current_key(x), current_key(y)
    names, rows = store.rows("WHERE status = 'ok'")
    settings = [n for n in names if n not in _NOT_SETTINGS and not n.startswith("config_")]
    numeric = [m for m, t in METRICS.items() if t != "TEXT"]
    if x not in settings and x not in numeric:
        raise InputError(f"--x {x!r} is neither a swept setting ({', '.join(settings)}) nor a metric "
                         f"({', '.join(numeric)})")
    if hue is not None and hue not in settings:
        raise InputError(f"--hue {hue!r} is not a swept setting; the sweep's settings: {', '.join(settings)}")
    if y not in numeric:
        raise InputError(f"--y {y!r} is not a metric; valid: {', '.join(numeric)}")
    col = {n: i for i, n in enumerate(names)}
    if not rows:
        raise InputError(f"{store.path}: no successful points")
    for k, clause in enumerate(where):
        name, sep, text = clause.partition("=")
        if not sep or name not in settings:
            raise InputError(f"--where {shown(clause)}: expected SETTING=VALUE with SETTING one of "
                             f"{', '.join(settings)}")
        wanted = _spellings(text)
        kept = [r for r in rows if _matches(r[col[name]], wanted)]
        if not kept:
            values = list(dict.fromkeys(r[col[name]] for r in rows))
            listed = ", ".join(shown(_parsed(v), 60) for v in values[:20]) + (" ..." if len(values) > 20 else "")
            within = " (among the points the --where before it keeps)" if k else ""
            raise InputError(f"--where {shown(clause)}: no successful point has {name} = {shown(text, 60)}; its "
                             f"values{within}: {listed}")
        rows = kept
    fixed = {x, hue} | {c.partition("=")[0] for c in where}
    varying = [s for s in settings if s not in fixed and len({r[col[s]] for r in rows}) > 1]
    seen: dict[tuple[Any, Any], int] = {}
    for r in rows:
        k = (r[col[hue]] if hue else None, r[col[x]])
        seen[k] = seen.get(k, 0) + 1
    if max(seen.values()) > 1:
        raise InputError(f"several points share each x{' and hue' if hue else ''} value because "
                         f"{', '.join(varying)} also var{'y' if len(varying) > 1 else 'ies'}: fix "
                         f"{'them' if len(varying) > 1 else 'it'} with --where SETTING=VALUE, or use one as --hue")
    lines: dict[Any, list[tuple[Any, Any]]] = {}
    for r in rows:
        lines.setdefault(r[col[hue]] if hue else None, []).append((r[col[x]], r[col[y]]))
    return lines


def _scale(metric: str, values: list[float]) -> tuple[float, str]:
    """How to divide a metric's values for its axis, and the axis label with the unit."""
    if not metric.endswith("_ns"):
        return 1.0, labelled(metric)
    top = max((abs(v) for v in values if v is not None), default=0)
    for unit, factor in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if top >= factor:
            return factor, f"{metric.removesuffix('_ns')} ({unit})"
    return 1.0, f"{metric.removesuffix('_ns')} (ns)"


def draw(path: str, lines: dict[Any, list[tuple[Any, Any]]], x: str, y: str, hue: str | None, logx: bool,
         logy: bool, title: str) -> None:
    plt = pyplot(PROG)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs_all = [px for points in lines.values() for px, _ in points]
    numeric = all(isinstance(v, (int, float)) for v in xs_all)
    categories = list(dict.fromkeys(xs_all))
    x, y = current_key(x), current_key(y)
    factor, label = _scale(y, [py for points in lines.values() for _, py in points])
    for value, points in lines.items():
        points = sorted(points, key=lambda p: p[0] if numeric else categories.index(p[0]))
        xs = [p[0] if numeric else categories.index(p[0]) for p in points]
        ax.plot(xs, [p[1] / factor if p[1] is not None else None for p in points], marker="o",
                label=None if hue is None else str(value))
    if not numeric:
        ax.set_xticks(range(len(categories)), [str(c) for c in categories], rotation=30 if len(categories) > 6 else 0)
    if logx and numeric:
        ax.set_xscale("log", base=2)
        if len(categories) <= 12:
            ax.set_xticks(sorted(categories), [f"{v:g}" for v in sorted(categories)])
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(labelled(x))
    ax.set_ylabel(label)
    if hue is not None:
        ax.legend(title=labelled(hue), fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(argv: list[str], warn: Callable[[str], None]) -> int:
    args = build_parser().parse_args(argv)
    store = ResultStore(args.dir, create=False)
    try:
        lines = select(store, args.x, args.y, args.hue, args.where)
    finally:
        store.close()
    out = args.out or contained_path(args.dir, f"{current_key(args.y)}_by_{current_key(args.x)}.png".replace("/", "_"),
                                     "chart name")
    title = os.path.basename(os.path.normpath(args.dir)) + ("" if not args.where else " (" + ", ".join(args.where)
                                                            + ")")
    draw(out, lines, args.x, args.y, args.hue, args.logx, args.logy, title)
    print(out)
    print(f"{PROG}: {sum(len(v) for v in lines.values())} points in {len(lines)} line(s)", file=sys.stderr)
    return 0
