"""Communicator groups: the comm-group JSON file, and the METADATA nodes that declare groups in a trace."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from workload import schema
from workload.errors import ConfigError, TraceError, shown
from workload.files import read_json
from workload.graph import TraceGraph
from workload.writer import make_node, set_attribute


def comm_groups_from_dict(data: Any, num_npus: int, path: str = "<memory>") -> dict[int, tuple[int, ...]]:
    """{group id (> 0): ranks in the listed order}, from ASTRA-sim's ``{"1": [0, 1, 2, 3], ...}``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object mapping group ids to lists of ranks")
    groups: dict[int, tuple[int, ...]] = {}
    for key, ranks in data.items():
        if not isinstance(key, str) or not key.strip().isdigit() or len(key) > 18:
            raise ConfigError(f"{path}: group id {shown(key)} is not a positive whole number")
        gid = int(key)
        if gid <= 0:
            raise ConfigError(f"{path}: group id {gid} must be positive (0 means all NPUs)")
        if not isinstance(ranks, list) or not ranks or not all(isinstance(r, int) and not isinstance(r, bool)
                                                               for r in ranks):
            raise ConfigError(f"{path}: group {gid} must be a non-empty list of ranks (got {shown(ranks)})")
        bad = [r for r in ranks if not 0 <= r < num_npus]
        if bad:
            raise ConfigError(f"{path}: group {gid} names rank(s) {shown(bad)} outside the {num_npus} NPUs of the "
                              "network")
        if len(set(ranks)) != len(ranks):
            raise ConfigError(f"{path}: group {gid} lists a rank more than once")
        groups[gid] = tuple(ranks)
    return groups


def load_comm_groups(path: str | os.PathLike[str], num_npus: int) -> dict[int, tuple[int, ...]]:
    path = os.fspath(path)
    return comm_groups_from_dict(read_json(path, "communicator group"), num_npus, path)


def metadata_groups(graph: TraceGraph, index: int) -> list[tuple[str, list[int]]] | None:
    """Process groups a METADATA node declares in ``inputs.values`` (PyTorch converter format), or None.

    The value is the Python text of a one-element list holding a JSON list of {"pg_name", "ranks"}; as
    ASTRA-sim does, two characters are cut from each end before parsing.
    """
    if int(graph.types[index]) != schema.NodeType.METADATA_NODE:
        return None
    io = graph.io_info(index, "inputs")
    if not io or not io["values"]:
        return None
    text = io["values"][2:-2]
    try:
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            try:
                items = json.loads(text.encode().decode("unicode_escape"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                return None
    except RecursionError:
        raise TraceError("the process-group list of this METADATA node is nested too deeply",
                         node_id=graph.node_id(index)) from None
    if not isinstance(items, list):
        return None
    out = []
    for item in items:
        if not (isinstance(item, dict) and "pg_name" in item and "ranks" in item):
            continue
        ranks = item["ranks"]
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0
                                                  for r in ranks):
            raise TraceError(f"process group {shown(item['pg_name'])}: 'ranks' must be a list of rank numbers "
                             f"(got {shown(ranks)})", node_id=graph.node_id(index))
        out.append((str(item["pg_name"]), ranks))
    return out


def process_groups_node(node_id: int, groups: Mapping[Any, Sequence[int]], name: str = "process_groups",
                        **node_args: Any) -> Any:
    """A METADATA node declaring communicator groups {pg_name: ranks} the way the PyTorch converter does
    (``inputs.values`` is the Python text of a one-element list holding the JSON list of groups)."""
    text = json.dumps([{"pg_name": str(pg), "ranks": [int(r) for r in ranks]} for pg, ranks in groups.items()],
                      separators=(",", ":"))
    return make_node(node_id, name, schema.NodeType.METADATA_NODE, inputs={"values": str([text]), "shapes": "",
                                                                           "types": ""}, **node_args)


GROUPS_FILE_HELP = ("write the communicator groups to PREFIX.comm_groups.json (ASTRA-sim's --comm-group-configuration) "
                    "instead of a METADATA node in every trace: ASTRA-sim 2.x stops at METADATA nodes; simulate "
                    "here with --comm-groups PREFIX.comm_groups.json")


def _unnamed_collectives(graph: TraceGraph) -> list[int]:
    """Node indices of the collectives over every rank that name no group (no ``pg_name``, or "0") and no
    ``involved_dim`` (a group plan involves every dimension, so one that lists them keeps its own)."""
    found = []
    for i in (graph.types == schema.NodeType.COMM_COLL_NODE).nonzero()[0].tolist():
        if str(graph.attribute(i, "pg_name", "") or "") in ("", "0") and graph.attribute(i, "involved_dim") is None:
            found.append(i)
    return found


def groups_file_beside(trace_path: str) -> str | None:
    """The ``PREFIX.comm_groups.json`` that ``--groups-file`` writes beside ``PREFIX.<rank>.et``, if it is there."""
    name = os.path.basename(trace_path)
    for ending in (".et.gz", ".et", ".gz"):
        if name.endswith(ending):
            name = name[: -len(ending)]
            break
    prefix, dot, rank = name.rpartition(".")
    path = os.path.join(os.path.dirname(trace_path), f"{prefix}.comm_groups.json")
    return path if dot and rank.isdigit() and os.path.isfile(path) else None


def missing_groups_hint(trace_path: str) -> str:
    """What to do about a group no trace declares; names the file of groups beside the traces when there is one
    (the usual cause: generated with --groups-file, then run without --comm-groups)."""
    beside = groups_file_beside(trace_path)
    if beside:
        return f"give it with --comm-groups {beside}, the file of groups beside these traces"
    return "give it with --comm-groups, or in a METADATA node of the trace"


def move_groups_to_file(paths: Sequence[str], out: str) -> dict[str, list[int]]:
    """Rewrite the traces at ``paths`` (one per rank) without their METADATA nodes and write the groups those
    declared to ``out`` as a comm-group JSON ({"pg": [ranks]}); a group declared differently by two traces is an
    error. Collectives over every rank that name no group get a group of every rank, numbered after the others:
    ASTRA-sim 2.x numbers an unnamed collective by the rank's count of every chunk-stream it started, group
    collectives included, so ranks that ran different group collectives before it would never pair it (a group of
    every rank runs as the unnamed collective does, on every dimension)."""
    from workload.protoscan import PADDING
    from workload.reader import decode_trace
    from workload.wire import read_trace_buffer
    from workload.writer import graph_messages, write_trace

    groups: dict[str, list[int]] = {}
    rewrite: list[str] = []
    for path in paths:
        graph = decode_trace(read_trace_buffer(path, PADDING), path)
        metadata = (graph.types == schema.NodeType.METADATA_NODE).nonzero()[0].tolist()
        for i in metadata:
            for name, ranks in metadata_groups(graph, i) or ():
                listed = [int(r) for r in ranks]
                if groups.setdefault(str(name), listed) != listed:
                    raise TraceError(f"process group {shown(name)} lists ranks {shown(listed)} here but "
                                     f"{shown(groups[str(name)])} in another trace", path=path)
        if metadata or _unnamed_collectives(graph):
            rewrite.append(path)
    world = str(max((int(n) for n in groups if n.isdigit()), default=0) + 1)
    for path in rewrite:
        graph = decode_trace(read_trace_buffer(path, PADDING), path)
        removed = {graph.node_id(int(i)) for i in (graph.types == schema.NodeType.METADATA_NODE).nonzero()[0]}
        unnamed = {graph.node_id(i) for i in _unnamed_collectives(graph)}
        kept = []
        for node in graph_messages(graph):
            if node.id in removed:
                continue
            if removed & set(node.data_deps) or removed & set(node.ctrl_deps):
                node.data_deps[:] = [d for d in node.data_deps if d not in removed]
                node.ctrl_deps[:] = [d for d in node.ctrl_deps if d not in removed]
            if node.id in unnamed:
                named = [a for a in node.attr if a.name == "pg_name"]
                if named:
                    named[0].string_val = world
                else:
                    set_attribute(node.attr.add(), "pg_name", world)
                groups[world] = list(range(len(paths)))
            kept.append(node)
        write_trace(path, kept, version=graph.version or "1.0.0", metadata=graph.metadata.get("attr") or None)
    ordered = dict(sorted(groups.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0,
                                                          kv[0])))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(ordered, f)
        f.write("\n")
    return ordered
