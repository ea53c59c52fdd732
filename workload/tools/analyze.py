"""``astrasim-py trace analyze``: per-rank compute and communication totals, and the imbalance of collective
message sizes across ranks, without simulating.

Collectives are lined up across ranks by (collective type, n-th such collective in id order on the rank):
the n-th all-reduce of every rank is the same step of the program, whichever communicator group instance it
runs on. With ``by_group`` they are lined up per group id instead.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from workload.errors import printable
from workload.graph import TraceGraph
from workload.optional import pyplot
from workload.schema import NodeType, collective_name
from workload.tools.inspect_trace import exact_sum

Slot = tuple[str, str, int]  # (group, collective, ordinal)


@dataclass(frozen=True, slots=True)
class RankTotals:
    rank: int
    compute_micros: int
    compute_ops: int
    collective_bytes: dict[str, int]  # "group/type" -> bytes
    send_bytes: int
    recv_bytes: int


@dataclass(frozen=True, slots=True)
class Imbalance:
    group: str
    collective: str
    ordinal: int
    min_bytes: int
    max_bytes: int
    ratio: float
    ranks_at_min: list[int]
    ranks_at_max: list[int]
    missing_on: list[int]  # ranks of the group's pattern that have no such collective


def _slots(graph: TraceGraph, by_group: bool = True) -> dict[Slot, int]:
    """This rank's collectives as {(group, type, ordinal): bytes} (group "*" unless ``by_group``)."""
    n = graph.num_nodes
    ctype, _ = graph.attrs.integers("comm_type", n, strict=False)
    size, _ = graph.attrs.integers("comm_size", n, strict=False)
    cpu, _ = graph.attrs.integers("is_cpu_op", n, strict=False)
    groups = graph.attrs.strings("pg_name", strict=False)
    seen: dict[tuple[str, str], int] = defaultdict(int)
    out: dict[Slot, int] = {}
    for i in np.flatnonzero((graph.types == NodeType.COMM_COLL_NODE) & (cpu == 0)).tolist():
        name = collective_name(int(ctype[i])).lower()
        group = (groups.get(i, "") or "all") if by_group else "*"
        k = seen[(group, name)]
        seen[(group, name)] += 1
        out[(group, name, k)] = int(size[i])
    return out


def rank_totals(rank: int, graph: TraceGraph) -> RankTotals:
    n = graph.num_nodes
    ops, _ = graph.attrs.integers("num_ops", n, strict=False)
    size, _ = graph.attrs.integers("comm_size", n, strict=False)
    comp = graph.types == NodeType.COMP_NODE
    per: dict[str, int] = defaultdict(int)
    for (group, name, _), nbytes in _slots(graph).items():
        per[f"{group}/{name}"] += nbytes
    return RankTotals(rank, exact_sum(graph.duration_micros[comp]), exact_sum(ops[comp]), dict(sorted(per.items())),
                      exact_sum(size[graph.types == NodeType.COMM_SEND_NODE]),
                      exact_sum(size[graph.types == NodeType.COMM_RECV_NODE]))


def imbalances(ranks: list[tuple[int, TraceGraph]], by_group: bool = False
               ) -> tuple[list[Imbalance], list[Slot], dict[int, dict[Slot, int]]]:
    """Collectives whose size differs between the ranks that have them, largest ratio first."""
    by_rank = {r: _slots(g, by_group) for r, g in ranks}
    slots = sorted({s for table in by_rank.values() for s in table})
    out = []
    for slot in slots:
        present = {r: table[slot] for r, table in by_rank.items() if slot in table}
        group_ranks = [r for r, table in by_rank.items() if any(s[0] == slot[0] and s[1] == slot[1] for s in table)]
        missing = sorted(set(group_ranks) - set(present))
        lo, hi = min(present.values()), max(present.values())
        if lo != hi or missing:
            out.append(Imbalance(slot[0], slot[1], slot[2], lo, hi, hi / lo if lo else float("inf"),
                                 sorted(r for r, v in present.items() if v == lo),
                                 sorted(r for r, v in present.items() if v == hi), missing))
    out.sort(key=lambda x: (-x.ratio if x.ratio != float("inf") else float("-inf"), x.group, x.collective, x.ordinal))
    return out, slots, by_rank


def as_json(totals: list[RankTotals], found: list[Imbalance]) -> dict[str, Any]:
    """Valid JSON: the ratio of a collective absent (size 0) on some rank is null, not Infinity."""
    imbalances = [asdict(i) | ({"ratio": None} if i.ratio == float("inf") else {}) for i in found]
    return {"ranks": [asdict(t) for t in totals], "imbalances": imbalances}


def format_text(totals: list[RankTotals], found: list[Imbalance], top: int = 20) -> str:
    lines = [f"{'rank':>5} {'compute µs':>12} {'compute ops':>12} {'send B':>12} {'recv B':>12}  collective bytes"]
    for t in totals:
        colls = printable(", ".join(f"{k} {v}" for k, v in t.collective_bytes.items()))
        lines.append(f"{t.rank:>5} {t.compute_micros:>12} {t.compute_ops:>12.3e} {t.send_bytes:>12} "
                     f"{t.recv_bytes:>12}  {colls}")
    lines.append("")
    if not found:
        lines.append("collective sizes agree across ranks")
        return "\n".join(lines)
    lines.append(f"{len(found)} collective(s) differ between ranks (largest ratio first):")
    for i in found[:top]:
        missing = f"; absent on rank(s) {i.missing_on}" if i.missing_on else ""
        group = f"group {printable(i.group)} " if i.group != "*" else ""
        lines.append(f"  {group}{i.collective} #{i.ordinal}: {i.min_bytes} B (ranks {i.ranks_at_min[:8]}) "
                     f"to {i.max_bytes} B (ranks {i.ranks_at_max[:8]}), x{i.ratio:.3g}{missing}")
    if len(found) > top:
        lines.append(f"  ... and {len(found) - top} more (--json for all)")
    return "\n".join(lines)


def write_heatmap(path: str, slots: list[Slot], by_rank: dict[int, dict[Slot, int]]) -> None:
    """Ranks x collectives, coloured by size relative to the median of that collective across ranks."""
    plt = pyplot("--heatmap")
    ranks = sorted(by_rank)
    grid = np.full((len(ranks), max(len(slots), 1)), np.nan)
    for col, slot in enumerate(slots):
        values = [by_rank[r][slot] for r in ranks if slot in by_rank[r]]
        median = float(np.median(values)) if values else 0.0
        for row, r in enumerate(ranks):
            if slot in by_rank[r] and median:
                grid[row, col] = by_rank[r][slot] / median
    fig, ax = plt.subplots(figsize=(min(4 + 0.12 * len(slots), 40), min(2 + 0.25 * len(ranks), 40)))
    image = ax.imshow(grid, aspect="auto", cmap="coolwarm", vmin=0, vmax=2, interpolation="nearest")
    ax.set_xlabel("collective (type / n-th, in order)")
    ax.set_ylabel("rank")
    if len(ranks) <= 64:
        ax.set_yticks(range(len(ranks)), [str(r) for r in ranks])
    if len(slots) <= 40:
        ax.set_xticks(range(len(slots)), [printable(f"{g}/{c}/{k}".lstrip("*/")) for g, c, k in slots],
                      rotation=90, fontsize=7)
    fig.colorbar(image, ax=ax, label="size / median over ranks (blank: absent)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
