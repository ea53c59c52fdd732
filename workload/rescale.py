"""``astrasim-py trace rescale``: an N-rank data-parallel trace as an M-rank one.

Output rank r is input rank r mod N with its communicator groups re-tiled, its send/recv peers remapped
and its collective sizes adjusted (rescale_plan has the rules and the size table). ``--strong-scaling``
keeps the global batch: per-rank compute (duration_micros, num_ops, tensor_size) scales by N/M; the
default weak scaling keeps per-rank compute. What cannot be rescaled is reported (node ids and reasons)
and left as it was; ``--strict`` makes it an error. Groups come from the traces' METADATA nodes (rewritten
per output rank) or from ``--comm-groups`` (rescaled into ``PREFIX.comm_groups.json``). Send/recv sizes
and ``involved_dim`` are kept.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from workload.convert.text_build import Clock
from workload.errors import InputError, printable
from workload.graph import TraceGraph
from workload.groups import groups_file_beside, load_comm_groups, metadata_groups, process_groups_node
from workload.limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, add_output_limits, check_output, output_limits
from workload.protoscan import PADDING
from workload.rescale_plan import Tiling, classify, peer_offsets, size_factor
from workload.schema import NodeType
from workload.traceset import TraceLoader, resolve_workload
from workload.writer import make_node, write_trace

Warn = Callable[[str], None]
_SHOWN = 8


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Rescale an N-rank data-parallel trace to M ranks: output rank r runs input rank "
                          "r mod N with regular communicator groups re-tiled, ring send/recv peers remapped and "
                          "collective sizes adjusted; what cannot be rescaled is reported.")
    parser.add_argument("workload", metavar="INPUT", help="trace prefix (dir/trace for dir/trace.<r>.et) or folder")
    parser.add_argument("--npus", type=int, required=True, metavar="M", help="number of ranks to produce")
    parser.add_argument("--output", "-o", required=True, metavar="PREFIX",
                        help="writes PREFIX.0.et ... PREFIX.<M-1>.et")
    parser.add_argument("--strong-scaling", action="store_true",
                        help="keep the global batch: per-rank compute and activations scale by N/M (default: "
                             "weak scaling, per-rank work unchanged)")
    parser.add_argument("--strict", action="store_true", help="fail when anything cannot be rescaled")
    parser.add_argument("--comm-groups", metavar="FILE.json",
                        help="the input's communicator groups, when they are not in the traces; the rescaled "
                             "groups are written to PREFIX.comm_groups.json")
    add_output_limits(parser)


def main(args: argparse.Namespace, warn: Warn) -> None:
    for path in rescale(args.workload, args.output, args.npus, strong=args.strong_scaling, strict=args.strict,
                        comm_groups=args.comm_groups, warn=warn, limits=output_limits(args)):
        print(printable(path))


class _Report:
    """Rescaled counts and unrescalable items {reason: node ids}."""

    def __init__(self) -> None:
        self.issues: dict[str, set[int]] = {}
        self.collectives: set[int] = set()  # node ids
        self.resized: set[int] = set()
        self.rounded: set[int] = set()
        self.p2p: set[int] = set()
        self.tilings: dict[str, str] = {}

    def issue(self, node_id: int, reason: str) -> None:
        self.issues.setdefault(reason, set()).add(node_id)


class _Groups:
    """Output communicator groups, numbered 1, 2, ... in order of first use."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, ...], int] = {}

    def pg(self, members: tuple[int, ...]) -> str:
        return str(self.ids.setdefault(members, len(self.ids) + 1))


def rescale(source: str, prefix: str, npus: int, *, strong: bool = False, strict: bool = False,
            comm_groups: str | None = None, warn: Warn | None = None,
            limits: tuple[int, int] = (DEFAULT_MAX_FILES, DEFAULT_MAX_BYTES)) -> list[str]:
    """Write ``<prefix>.<r>.et`` for ``npus`` ranks; returns the prefix (and the comm-group file written).
    ``limits`` (max files, max bytes) bound the output, estimated before anything is written."""
    warn = warn or (lambda message: None)
    if npus < 1:
        raise InputError(f"--npus must be at least 1 (got {npus})")
    what = f"trace rescale to {npus:,} ranks"
    check_output(what, npus, None, limits)
    traces = resolve_workload(source)
    if traces.shared:
        raise InputError(f"{source} is one file run by every rank; rescaling needs the per-rank traces "
                         "<prefix>.<rank>.et")
    loader = TraceLoader(warn=warn)
    graphs = [loader.load(traces.file_for(r), r) for r in range(traces.num_ranks or 0)]
    old = len(graphs)
    sizes = [len(g.buf) - PADDING for g in graphs]  # an output rank is about as large as its input rank
    check_output(what, npus, (npus // old) * sum(sizes) + sum(sizes[: npus % old]), limits)
    declared = _input_groups(graphs, comm_groups, old)
    tilings = {pg: classify(members, old) for pg, members in declared.items()}
    offsets = peer_offsets(graphs)
    report, groups = _Report(), _Groups()
    written: list[str] = []
    directory = os.path.dirname(prefix)
    if directory:
        os.makedirs(directory, exist_ok=True)
    for rank in range(npus):
        g = graphs[rank % old]
        nodes = _rank_nodes(g, rank, npus, old, strong, declared, tilings, offsets, groups, report)
        metadata = {k: v for k, v in g.metadata.items() if v is not None} | {"rescaled_from_ranks": old}
        write_trace(f"{prefix}.{rank}.et", nodes, version=g.version or "1.0.0", metadata=metadata)
    written.append(prefix)
    if comm_groups:
        path = f"{prefix}.comm_groups.json"
        with open(path, "w", encoding="utf-8") as f:
            json.dump({str(gid): list(m) for m, gid in groups.ids.items()}, f, indent=1)
        written.append(path)
    beside = None if comm_groups else groups_file_beside(traces.file_for(0))
    if beside and any("is not declared" in reason for reason in report.issues):
        warn(f"{source}: the traces do not declare their communicator groups; {beside} beside them does: pass it "
             "with --comm-groups")
    _tell(report, source, old, npus, strong, strict, warn)
    return written


def _input_groups(graphs: list[TraceGraph], comm_groups: str | None, npus: int) -> dict[str, tuple[int, ...]]:
    """{pg_name: members} from --comm-groups and the traces' METADATA nodes."""
    out: dict[str, tuple[int, ...]] = {}
    if comm_groups:
        out.update({str(gid): m for gid, m in load_comm_groups(comm_groups, npus).items()})
    for g in graphs:
        for i in (i for i in range(g.num_nodes) if int(g.types[i]) == NodeType.METADATA_NODE):
            for name, ranks in metadata_groups(g, i) or ():
                out.setdefault(name, tuple(ranks) if ranks else tuple(range(npus)))
    return out


def _rank_nodes(g: TraceGraph, rank: int, npus: int, old: int, strong: bool, declared: dict[str, tuple[int, ...]],
                tilings: dict[str, Tiling | str], offsets: dict[int, int | str], groups: _Groups,
                report: _Report) -> list[Any]:
    clock = Clock()
    ratio = old / npus
    used: dict[str, tuple[int, ...]] = {}
    nodes: list[Any] = []
    metadata_at: list[int] = []
    order = g.record.argsort(kind="stable").tolist()
    for i in order:
        ntype, node_id = int(g.types[i]), g.node_id(i)
        changes: dict[str, Any] = {}
        duration = int(g.duration_micros[i])
        if ntype == NodeType.COMM_COLL_NODE and not g.attribute(i, "is_cpu_op", False):
            changes = _collective(g, i, rank, npus, old, strong, declared, tilings, groups, used, report)
        elif ntype in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
            offset = offsets.get(node_id, "it has no peer rank")
            send = ntype == NodeType.COMM_SEND_NODE
            peer = (rank + offset) % npus if isinstance(offset, int) else None
            if peer is None or peer == rank:
                report.issue(node_id, offset if isinstance(offset, str)
                             else f"peer offset {offset:+d} wraps onto the rank itself among {npus} ranks")
            else:
                report.p2p.add(offset)
                changes = {"comm_dst": peer, "comm_src": rank} if send else {"comm_src": peer, "comm_dst": rank}
        elif ntype == NodeType.COMP_NODE and strong:
            duration = clock.duration_us(duration * 1000 * ratio)
            for name in ("num_ops", "tensor_size"):
                value = g.attribute(i, name)
                if isinstance(value, int):
                    changes[name] = round(value * ratio)
        elif ntype == NodeType.METADATA_NODE and metadata_groups(g, i) is not None:
            metadata_at.append(len(nodes))
        nodes.append(_node(g, i, changes, duration))
    for k, at in enumerate(metadata_at):  # the first declares the output rank's groups, the others nothing
        node = nodes[at]
        decl = process_groups_node(node.id, used if k == 0 else {})
        node.inputs.values = decl.inputs.values
    return nodes


def _collective(g: TraceGraph, i: int, rank: int, npus: int, old: int, strong: bool,
                declared: dict[str, tuple[int, ...]], tilings: dict[str, Tiling | str], groups: _Groups,
                used: dict[str, tuple[int, ...]], report: _Report) -> dict[str, Any]:
    node_id = g.node_id(i)
    pg = str(g.attribute(i, "pg_name", "") or "")
    tiling: Tiling | str = Tiling("all") if pg in ("", "0") else tilings.get(
        pg, f"pg_name {pg} is not declared (in a METADATA node or --comm-groups)")
    if isinstance(tiling, Tiling) and tiling.fits(npus):
        tiling = f"pg_name {pg} ({tiling.describe()}): {tiling.fits(npus)}"
    elif isinstance(tiling, str) and pg in declared:
        tiling = f"pg_name {pg} = {list(declared[pg])}: {tiling}"
    if isinstance(tiling, str):
        report.issue(node_id, tiling)
        if pg in declared:  # keep the group as it was, renumbered like the others
            new = groups.pg(declared[pg])
            used[new] = declared[pg]
            return {"pg_name": new}
        return {}
    changes: dict[str, Any] = {}
    if tiling.kind != "all":
        members = tiling.members(rank, npus)
        new = groups.pg(members) if len(members) != npus else ""
        if new:
            used[new] = members
        changes["pg_name"] = new or None
        report.tilings[pg] = tiling.describe()
    elif pg:
        changes["pg_name"] = None
    size = g.attribute(i, "comm_size", 0)
    factor = size_factor(int(g.attribute(i, "comm_type", 0)), tiling.grows, strong, old, npus)
    report.collectives.add(node_id)
    if factor != 1.0 and isinstance(size, int):
        exact = size * factor
        changes["comm_size"] = round(exact)
        report.resized.add(node_id)
        if exact != round(exact):
            report.rounded.add(node_id)
    return changes


def _node(g: TraceGraph, i: int, changes: dict[str, Any], duration: int) -> Any:
    """The node's message with attribute values replaced (None drops one), types kept."""
    attrs: list[tuple[Any, ...]] = []
    for name, type_name, value in g.attributes(i):
        if name in changes:
            new = changes.pop(name)
            if new is not None:
                attrs.append((name, type_name, new))
        else:
            attrs.append((name, type_name, value))
    attrs += [(name, value) for name, value in changes.items() if value is not None]
    return make_node(g.node_id(i), g.name(i), int(g.types[i]), data_deps=g.data_deps_of(i),
                     ctrl_deps=g.ctrl_deps_of(i), duration_micros=duration,
                     start_time_micros=int(g.start_time_micros[i]), attrs=attrs, inputs=g.io_info(i, "inputs"),
                     outputs=g.io_info(i, "outputs"))


def _tell(report: _Report, source: str, old: int, npus: int, strong: bool, strict: bool, warn: Warn) -> None:
    lines = []
    for reason, ids in sorted(report.issues.items(), key=lambda item: (min(item[1]), item[0])):
        shown = ", ".join(map(str, sorted(ids)[:_SHOWN])) + (" ..." if len(ids) > _SHOWN else "")
        lines.append(f"{source}: not rescaled, node(s) {shown}: {reason}")
    if strict and lines:
        raise InputError(lines[0] + (f" (and {len(lines) - 1} more problem(s))" if len(lines) > 1 else ""))
    scaling = "strong scaling: per-rank compute x N/M" if strong else "weak scaling: per-rank compute kept"
    groups = "; ".join(f"pg {pg}: {how}" for pg, how in sorted(report.tilings.items()))
    summary = (f"{source}: rescaled {old} -> {npus} ranks ({scaling}); {len(report.collectives)} collective(s), "
               f"{len(report.resized)} resized" + (f" ({len(report.rounded)} rounded to whole bytes)"
                                                   if report.rounded else ""))
    if groups:
        summary += f"; groups re-tiled: {groups}"
    if report.p2p:
        summary += f"; send/recv peer offsets {', '.join(f'{k:+d}' for k in sorted(report.p2p))} remapped"
    warn(summary)
    for line in lines:
        warn(line)
