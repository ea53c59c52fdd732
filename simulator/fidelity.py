"""How closely a synthetic workload matches its original: node-type mix, value distributions (two-sample
Kolmogorov-Smirnov distance and quantiles), graph shape, and the iteration time both simulate to on one system.

An iteration time is only a fair comparison when the simulator could time the compute: GPU compute nodes with
no recorded duration (and no device to time them by) take about 0 ns. The report then says so, compares the
iteration times as communication only, and passes no overall verdict.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from network.config import NetworkConfig
from simulator.api import simulate
from simulator.results import format_ns
from workload.graph import TraceGraph
from workload.schema import NodeType
from workload.synthesis.stats import TraceStats, ks_distance, trace_stats
from workload.traceset import TraceLoader, resolve_workload

SHARE_TOLERANCE = 0.02  # absolute difference of a node type's share
KS_TOLERANCE = 0.15
KS_RESOLUTION = 0.02  # values within 2% of each other count as equal (profiles round values)
TIME_TOLERANCE = 0.10  # relative iteration-time difference, at the same size and rank count


@dataclass(slots=True)
class Metric:
    """One compared quantity: its original and synthetic value, their difference, and whether it is within the
    tolerance (None: informational)."""

    name: str
    original: float
    synthetic: float
    difference: float
    measure: str  # "share", "ks", "ratio", "relative"
    ok: bool | None = None


@dataclass(slots=True)
class FidelityReport:
    metrics: list[Metric] = field(default_factory=list)
    original_ns: int | None = None
    synthetic_ns: int | None = None
    expected_ratio: float = 1.0
    resolution: float = KS_RESOLUTION
    untimed_compute: int = 0  # GPU compute nodes of the two simulations that no model could time

    @property
    def time_error(self) -> float | None:
        """Synthetic iteration time relative to the original's times the expected ratio, minus 1."""
        if not self.original_ns or self.synthetic_ns is None:
            return None
        return self.synthetic_ns / (self.original_ns * self.expected_ratio) - 1.0

    @property
    def compute_timed(self) -> bool:
        return not self.untimed_compute

    @property
    def ok(self) -> bool:
        """Every metric within its tolerance, and the iteration times comparable (compute timed)."""
        return self.compute_timed and all(m.ok is not False for m in self.metrics)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "compute_timed": self.compute_timed, "untimed_compute_nodes": self.untimed_compute,
                "expected_ratio": self.expected_ratio, "ks_resolution": self.resolution,
                "original_ns": self.original_ns,
                "synthetic_ns": self.synthetic_ns, "time_error": self.time_error,
                "metrics": [asdict(m) for m in self.metrics]}

    def verdict(self) -> str:
        if not self.compute_timed:
            return (f"not judged: {self.untimed_compute:,} GPU compute node(s) could not be timed (no recorded "
                    "duration and no device), so the iteration times compare communication only; simulate with "
                    "--device NAME (e.g. --device H100)")
        return "within tolerance" if self.ok else "OUTSIDE tolerance"

    def format_text(self) -> str:
        rows = [("metric", "original", "synthetic", "difference", "")]
        for m in self.metrics:
            if m.name.startswith("iteration time"):
                orig, synth = format_ns(int(m.original)), format_ns(int(m.synthetic))
            else:
                orig, synth = _number(m.original), _number(m.synthetic)
            diff = {"share": f"{m.difference:+.3f}", "ks": f"KS {m.difference:.3f}",
                    "ratio": f"x{m.difference:.3f}", "relative": f"{m.difference:+.1%}"}[m.measure]
            mark = "" if m.ok is None else ("ok" if m.ok else "OFF")
            rows.append((m.name, orig, synth, diff, mark))
        widths = [max(len(r[k]) for r in rows) for k in range(5)]
        lines = ["  ".join(r[k].ljust(widths[k]) if k == 0 else r[k].rjust(widths[k]) for k in range(5)).rstrip()
                 for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        lines.append(f"KS: Kolmogorov-Smirnov distance, values within {self.resolution:.1%} counted as equal")
        lines.append(f"overall: {self.verdict()}")
        return "\n".join(lines)


def compare_stats(original: TraceStats, synthetic: TraceStats, expected_ratio: float = 1.0,
                  resolution: float = KS_RESOLUTION) -> FidelityReport:
    """The distribution and shape metrics of two workloads (no simulation). ``resolution``: the relative
    difference below which two values count as equal in the KS distances (at least the profile's rounding and
    noise, which change values on purpose)."""
    report = FidelityReport(expected_ratio=expected_ratio, resolution=resolution)
    add = report.metrics.append
    per_rank_o = original.nodes / max(1, original.ranks)
    per_rank_s = synthetic.nodes / max(1, synthetic.ranks)
    add(Metric("nodes per rank", per_rank_o, per_rank_s, _ratio(per_rank_s, per_rank_o * expected_ratio), "ratio"))
    shares_o, shares_s = original.type_shares(), synthetic.type_shares()
    for name in sorted(set(shares_o) | set(shares_s)):
        o, s = shares_o.get(name, 0.0), shares_s.get(name, 0.0)
        add(Metric(f"share {name}", o, s, s - o, "share", abs(s - o) <= SHARE_TOLERANCE))
    for name in sorted(set(original.collective_sizes) | set(synthetic.collective_sizes)):
        o_sizes, s_sizes = original.collective_sizes.get(name, []), synthetic.collective_sizes.get(name, [])
        _distribution(report, f"{name} size (median B)", o_sizes, s_sizes)
    if original.p2p_sizes or synthetic.p2p_sizes:
        _distribution(report, "send/recv size (median B)", original.p2p_sizes, synthetic.p2p_sizes)
    _distribution(report, "compute time (median µs)", original.compute_us, synthetic.compute_us)
    if original.compute_ops or synthetic.compute_ops:
        _distribution(report, "compute num_ops (median)", original.compute_ops, synthetic.compute_ops)
    for name, o_vals, s_vals in (("dependency depth (mean)", original.depth, synthetic.depth),
                                 ("fan-in (mean)", original.fan_in, synthetic.fan_in),
                                 ("fan-out (mean)", original.fan_out, synthetic.fan_out),
                                 ("critical-path phases (mean)", original.phases, synthetic.phases)):
        o, s = _mean(o_vals), _mean(s_vals)
        add(Metric(name, o, s, _ratio(s, o), "ratio"))
    return report


def compare_workloads(original: str | os.PathLike[str], synthetic: str | os.PathLike[str],
                      network: str | os.PathLike[str] | NetworkConfig | None = None,
                      system: str | os.PathLike[str] | None = None,
                      comm_groups: str | os.PathLike[str] | dict[int, tuple[int, ...]] | None = None,
                      expected_ratio: float = 1.0, num_ranks: int | None = None, resolution: float = KS_RESOLUTION,
                      warn: Callable[[str], None] | None = None, **options: Any) -> FidelityReport:
    """Compare two workloads (prefixes, folders or files); with a network, also simulate both on it (the original
    with ``comm_groups``, the synthetic one with the groups its traces declare). ``options`` are the simulator's
    RunOptions (``backend``, ``device``, ...)."""
    graphs_o, graphs_s = _graphs(original, num_ranks, warn), _graphs(synthetic, num_ranks, warn)
    report = compare_stats(trace_stats(graphs_o), trace_stats(graphs_s), expected_ratio, resolution)
    if network is not None:
        o = simulate(original, network, system, comm_groups=comm_groups, warn=warn, **options)
        s = simulate(synthetic, network, system, warn=warn, **options)
        report.original_ns, report.synthetic_ns = o.finish_ns, s.finish_ns
        report.untimed_compute = untimed_compute(graphs_o, o.config) + untimed_compute(graphs_s, s.config)
        error = report.time_error
        assert error is not None
        timed = report.compute_timed
        report.metrics.append(Metric("iteration time" if timed else "iteration time (communication only)",
                                     o.finish_ns, s.finish_ns, error, "relative",
                                     abs(error) <= TIME_TOLERANCE if timed else None))
    return report


def untimed_compute(graphs: Sequence[TraceGraph], config: dict[str, Any]) -> int:
    """GPU compute nodes a run with this configuration (its compute model) cannot time, over the distinct traces:
    without a roofline model those with no recorded duration, with one those with FLOPs but no bytes."""
    roofline = (config.get("compute") or {}).get("model") in ("roofline", "kernels")
    count = 0
    for graph in {id(g): g for g in graphs}.values():
        n = graph.num_nodes
        cpu, _ = graph.attrs.integers("is_cpu_op", n, strict=False)
        gpu = (graph.types == NodeType.COMP_NODE) & (cpu == 0)
        if roofline:
            ops, _ = graph.attrs.integers("num_ops", n, strict=False)
            size, _ = graph.attrs.integers("tensor_size", n, strict=False)
            count += int(np.count_nonzero(gpu & (ops > 0) & (size == 0)))
        else:
            count += int(np.count_nonzero(gpu & (graph.duration_micros == 0)))
    return count


def _graphs(workload: str | os.PathLike[str], num_ranks: int | None, warn: Callable[[str], None] | None
            ) -> list[TraceGraph]:
    traces = resolve_workload(os.fspath(workload))
    loader = TraceLoader(warn=warn)
    count = traces.num_ranks or num_ranks or 1
    return loader.load_set(traces, count)


def _distribution(report: FidelityReport, name: str, o: Sequence[int], s: Sequence[int]) -> None:
    ks = ks_distance(o, s, report.resolution)
    report.metrics.append(Metric(name, _median(o), _median(s), ks, "ks", ks <= KS_TOLERANCE))


def _median(values: Sequence[int]) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64))) if len(values) else 0.0


def _mean(values: Sequence[int]) -> float:
    return float(np.mean(np.asarray(values, dtype=np.float64))) if len(values) else 0.0


def _ratio(a: float, b: float) -> float:
    return a / b if b else (1.0 if a == b else float("inf"))


def _number(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:.4f}" if abs(value) < 1 else f"{value:,.2f}"
