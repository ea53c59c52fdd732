"""``astrasim-py trace jsonize``: a trace as one valid JSON document, or as JSON Lines.

Integers are plain JSON numbers (not strings as in protobuf's JSON mapping), bytes are base64,
non-finite floats are the strings "nan", "inf" and "-inf".
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from typing import Any, TextIO

from workload.errors import TraceError
from workload.graph import TraceGraph
from workload.schema import node_type_name


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def node_record(graph: TraceGraph, index: int) -> dict[str, Any]:
    t = int(graph.types[index])
    record: dict[str, Any] = {
        "id": graph.node_id(index),
        "name": graph.name(index),
        "type": node_type_name(t) if 0 <= t <= 7 else t,
        "ctrl_deps": graph.ctrl_deps_of(index),
        "data_deps": graph.data_deps_of(index),
        "start_time_micros": int(graph.start_time_micros[index]),
        "duration_micros": int(graph.duration_micros[index]),
    }
    for which in ("inputs", "outputs"):
        io = graph.io_info(index, which)
        if io is not None:
            record[which] = io
    record["attr"] = [{"name": name, **({kind: _plain(value)} if kind else {})}
                      for name, kind, value in graph.attributes(index)]
    return record


def metadata_record(graph: TraceGraph) -> dict[str, Any]:
    return {"version": graph.version, "attr": {k: _plain(v) for k, v in graph.metadata.items()}}


def file_order(graph: TraceGraph) -> list[int]:
    return graph.record.argsort(kind="stable").tolist()


def node_records(rank: int, path: str, graph: TraceGraph) -> Iterator[dict[str, Any]]:
    """The records of a rank's nodes in file order; a value that does not decode is a TraceError naming the
    file, rank and node."""
    try:
        for i in file_order(graph):
            yield node_record(graph, i)
    except TraceError as e:
        raise e.located(path=path, rank=rank) from None


def write_document(ranks: list[tuple[int, str, TraceGraph]], out: TextIO, indent: int | None = 1) -> None:
    """One JSON document: {"ranks": [{"rank", "file", "metadata", "nodes": [...]}, ...]}."""
    doc = {"ranks": [{"rank": rank, "file": path, "metadata": metadata_record(g),
                      "nodes": list(node_records(rank, path, g))} for rank, path, g in ranks]}
    json.dump(doc, out, indent=indent, allow_nan=False)
    out.write("\n")


def jsonl_records(ranks: list[tuple[int, str, TraceGraph]]) -> Iterator[dict[str, Any]]:
    """JSON Lines records: per rank a {"rank", "file", "metadata"} line, then one {"rank", "node"} per node."""
    for rank, path, g in ranks:
        yield {"rank": rank, "file": path, "metadata": metadata_record(g)}
        for record in node_records(rank, path, g):
            yield {"rank": rank, "node": record}


def write_jsonl(ranks: list[tuple[int, str, TraceGraph]], out: TextIO) -> None:
    for record in jsonl_records(ranks):
        out.write(json.dumps(record, allow_nan=False))
        out.write("\n")
