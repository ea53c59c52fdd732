"""CSV exports of a result: per-rank times, per-rank collective statistics, per-link usage, messages.

Cells a spreadsheet would run as a formula are made inert (they start with ').
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any

from simulator.breakdown import summarize_collectives
from simulator.results import RankStats, SimulationResult
from workload.files import inert_row

LINK_COLUMNS = ("link", "bytes", "messages", "busy_ns", "utilization", "max_queue")


def _note(message: str) -> None:
    print(f"astrasim-py: note: {message}", file=sys.stderr)


def _write(path: str, header: Iterable[Any], rows: Iterable[Iterable[Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(inert_row(header))
        writer.writerows(inert_row(row) for row in rows)


def _whole(count: float) -> float | int:
    """One rank's count of a collective: a whole number, written as one ('405', not '405.0')."""
    return int(count) if float(count).is_integer() else count


def _chosen(choices: Iterable[dict[str, Any]]) -> str:
    """The library's choices for a collective type, most frequent first: ``nvls/Simple x32; ring/LL x8``."""
    return "; ".join(f"{c['algorithm']}/{c['protocol']} x{c['channels']}" for c in choices)


def write_csvs(prefix: str, result: SimulationResult, workloads: list[Any], backend: Any = None,
               note: Callable[[str], None] = _note) -> list[str]:
    """Write PREFIX.ranks.csv, PREFIX.collectives.csv, PREFIX.links.csv (backends with a link model:
    analytical-aware, packet; otherwise ``note`` says why there is none) and, on the packet backend,
    PREFIX.messages.csv: every message's source, destination, bytes, start and end. Returns the paths."""
    paths = [f"{prefix}.ranks.csv", f"{prefix}.collectives.csv"]
    names = [x.name for x in fields(RankStats)]
    _write(paths[0], names, ([getattr(r, n) for n in names] for r in result.ranks))
    nccl = result.backend == "nccl"
    per_rank = {w.rank: summarize_collectives([w.collective_log]) for w in workloads}
    if result.representative:  # a folded run: each rank has its representative's figures
        per_rank = {r: per_rank[rep] for r, rep in enumerate(result.representative)}
    _write(paths[1], ["rank", "collective", "count", "bytes", "time_ns", "algbw_GBps", "busbw_GBps"]
           + (["chosen"] if nccl else []),
           ([rank, c.kind, _whole(c.count_per_rank), c.bytes_per_rank, c.time_ns_per_rank, round(c.algbw_GBps, 4),
             round(c.busbw_GBps, 4)] + ([_chosen(c.choices)] if nccl else [])
            for rank, summaries in per_rank.items() for c in summaries))
    if result.links or getattr(backend, "links", None) is not None:
        columns = list(result.links[0]) if result.links else list(LINK_COLUMNS)
        paths.append(f"{prefix}.links.csv")
        _write(paths[-1], columns, ([row.get(c) for c in columns] for row in result.links))
    elif nccl:
        note(f"{prefix}.links.csv not written: the NCCL-like collective model shares GPU ports and NICs, not the "
             "network file's links (per-link usage needs --collective-model astra-sim with --backend "
             "analytical-aware or packet)")
    else:
        note(f"{prefix}.links.csv not written: the {result.backend} network has no link model (per-link usage "
             "needs --backend analytical-aware or packet)")
    log = getattr(backend, "log", None)
    if log is not None:
        paths.append(f"{prefix}.messages.csv")
        _write(paths[-1], ["src", "dst", "bytes", "start_ns", "end_ns", "latency_ns"],
               ([src, dst, size, start, end, end - start] for src, dst, size, start, end
                in zip(log["src"], log["dst"], log["size"], log["start_ns"], log["end_ns"], strict=True)))
    return paths
