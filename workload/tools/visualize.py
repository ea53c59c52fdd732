"""``astrasim-py trace visualize``: the dependency graph as GraphML (via networkx) or Graphviz DOT text.

Names come from the trace and may hold anything: they are written with control and format characters escaped,
so the GraphML is well-formed XML 1.0 and the DOT file a valid Graphviz graph.
"""

from __future__ import annotations

import os
from typing import TextIO

import networkx as nx

from workload.errors import InputError, printable
from workload.files import shown_path
from workload.graph import TraceGraph
from workload.schema import NodeType, node_type_name

FORMATS = {".graphml": "graphml", ".dot": "dot", ".gv": "dot"}
_COLORS = {
    NodeType.COMP_NODE: "lightblue",
    NodeType.COMM_COLL_NODE: "orange",
    NodeType.COMM_SEND_NODE: "palegreen",
    NodeType.COMM_RECV_NODE: "palegreen",
    NodeType.MEM_LOAD_NODE: "khaki",
    NodeType.MEM_STORE_NODE: "khaki",
}


def output_format(path: str, given: str | None) -> str:
    """The format to write ``path`` in: ``given``, else the one its extension names; InputError otherwise."""
    if given:
        return given
    fmt = FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise InputError(f"{shown_path(path)}: cannot tell the graph format from the extension; supported: "
                         f"{', '.join(FORMATS)} (or give --format graphml|dot)")
    return fmt


def to_networkx(graph: TraceGraph) -> nx.MultiDiGraph:
    """Nodes keyed by Chakra id with name/type/duration attributes; edges parent -> child, kind data/ctrl."""
    g = nx.MultiDiGraph()
    for i in range(graph.num_nodes):
        g.add_node(graph.node_id(i), name=printable(graph.name(i)), type=node_type_name(int(graph.types[i])),
                   duration_micros=int(graph.duration_micros[i]))
    for i in range(graph.num_nodes):
        child = graph.node_id(i)
        for kind, parents in (("data", graph.data_deps_of(i)), ("ctrl", graph.ctrl_deps_of(i))):
            for p in parents:
                g.add_edge(p, child, kind=kind)
    return g


def write_graphml(graph: TraceGraph, path: str) -> None:
    nx.write_graphml(to_networkx(graph), path)


def _quote(*lines: str) -> str:
    """A DOT quoted string of ``lines`` (control characters escaped), joined with DOT's centred line break."""
    escaped = (printable(ln).replace("\\", "\\\\").replace('"', '\\"') for ln in lines)
    return '"' + "\\n".join(escaped) + '"'


def write_dot(graph: TraceGraph, out: TextIO, title: str = "trace") -> None:
    """Graphviz DOT text: data dependencies solid, control dependencies dashed."""
    out.write(f"digraph {_quote(title)} {{\n  rankdir=TB;\n  node [shape=box, style=filled];\n")
    for i in range(graph.num_nodes):
        t = int(graph.types[i])
        color = _COLORS.get(NodeType(t), "white") if 0 <= t <= max(NodeType) else "red"
        label = _quote(f"{graph.node_id(i)}: {graph.name(i)}", node_type_name(t))
        out.write(f"  n{graph.node_id(i)} [label={label}, fillcolor={color}];\n")
    for i in range(graph.num_nodes):
        child = graph.node_id(i)
        for p in graph.data_deps_of(i):
            out.write(f"  n{p} -> n{child};\n")
        for p in graph.ctrl_deps_of(i):
            out.write(f"  n{p} -> n{child} [style=dashed];\n")
    out.write("}\n")
