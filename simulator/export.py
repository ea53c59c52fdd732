"""CSV exports of a result: per-rank times, per-rank collective statistics, per-link usage."""

from __future__ import annotations

import csv
from dataclasses import asdict, fields
from typing import Any

from simulator.breakdown import summarize_collectives
from simulator.results import RankStats, SimulationResult


def write_csvs(prefix: str, result: SimulationResult, workloads: list[Any]) -> list[str]:
    """Write PREFIX.ranks.csv, PREFIX.collectives.csv and (when there are links) PREFIX.links.csv."""
    paths = [f"{prefix}.ranks.csv", f"{prefix}.collectives.csv"]
    with open(paths[0], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, [x.name for x in fields(RankStats)])
        writer.writeheader()
        writer.writerows(asdict(r) for r in result.ranks)
    with open(paths[1], "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["rank", "collective", "count", "bytes", "time_ns", "algbw_gbps", "busbw_gbps"])
        for w in workloads:
            for c in summarize_collectives([w.collective_log]):
                writer.writerow([w.rank, c.kind, c.count_per_rank, c.bytes_per_rank, c.time_ns_per_rank,
                                 round(c.algbw_gbps, 4), round(c.busbw_gbps, 4)])
    if result.links:
        paths.append(f"{prefix}.links.csv")
        with open(paths[2], "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, list(result.links[0]))
            writer.writeheader()
            writer.writerows(result.links)
    return paths
