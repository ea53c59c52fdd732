"""CSV exports of a result: per-rank times, per-rank collective statistics, per-link usage."""

from __future__ import annotations

import csv
from dataclasses import asdict, fields
from typing import Any

from simulator.breakdown import summarize_collectives
from simulator.results import RankStats, SimulationResult


def write_csvs(prefix: str, result: SimulationResult, workloads: list[Any], backend: Any = None) -> list[str]:
    """Write PREFIX.ranks.csv, PREFIX.collectives.csv, (when there are links) PREFIX.links.csv and (packet
    backend) PREFIX.messages.csv: every message's source, destination, bytes, start and end."""
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
    log = getattr(backend, "log", None)
    if log is not None:
        paths.append(f"{prefix}.messages.csv")
        with open(paths[-1], "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["src", "dst", "bytes", "start_ns", "end_ns", "latency_ns"])
            for src, dst, size, start, end in zip(log["src"], log["dst"], log["size"], log["start_ns"], log["end_ns"],
                                                  strict=True):
                writer.writerow([src, dst, size, start, end, end - start])
    return paths
