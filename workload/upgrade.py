"""``astrasim-py trace upgrade``: traces of an earlier Chakra schema rewritten as Chakra 1.0 files.

Each file is read as the simulator reads it (workload/legacy.py: the schema's own fields, the reading of the
ASTRA-sim of its era where today's differs, each difference in a warning) and written back with today's field
numbers and a GlobalMetadata saying which schema it came from, so that ASTRA-sim 2.x and Chakra's tools read the
same trace. A 1.0 trace passes through unchanged apart from its metadata. The one thing 1.0 cannot hold is a run
time finer than a microsecond (schema 0.0.1 kept ns): such durations are rounded, and the warning says by how much.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from typing import Any

from workload.errors import printable
from workload.files import shown_path
from workload.graph import TraceGraph
from workload.limits import add_output_limits, check_output, output_limits
from workload.traceset import TraceLoader, resolve_workload
from workload.writer import graph_messages, write_trace

Warn = Callable[[str], None]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Rewrite traces of an earlier Chakra schema (0.0.1 .eg files, 0.0.4 with or without "
                          "GlobalMetadata) as Chakra 1.0 files that ASTRA-sim 2.x runs: read as astrasim-py reads "
                          "them, with a warning for every place the reading differs from today's ASTRA-sim.")
    parser.add_argument("workload", metavar="INPUT", help="trace prefix (dir/trace for dir/trace.<r>.et or .eg), "
                                                          "folder, or single file")
    parser.add_argument("--output", "-o", required=True, metavar="PREFIX",
                        help="writes PREFIX.0.et ... (PREFIX.et for a single file run by every rank)")
    add_output_limits(parser)


def main(args: argparse.Namespace, warn: Warn) -> None:
    for line in upgrade(args.workload, args.output, warn, output_limits(args)):
        print(printable(line))


def upgrade(workload: str, prefix: str, warn: Warn, limits: tuple[int, int]) -> Iterator[str]:
    """Write the upgraded files; yields one line per schema met (files, from which schema) after writing."""
    traces = resolve_workload(workload)
    count = len(traces.files)
    check_output(f"upgrading {shown_path(workload)}", count,
                 sum(os.path.getsize(f) for f in traces.files) * 2, limits)
    folder = os.path.dirname(prefix)
    if folder:  # as the generators, converters and rescale do
        os.makedirs(folder, exist_ok=True)
    loader = TraceLoader(warn=warn, checks=False)
    schemas: dict[str, int] = {}
    for rank, path in enumerate(traces.files):
        graph = loader.load(path, rank)
        out = f"{prefix}.et" if traces.shared else f"{prefix}.{rank}.et"
        write_trace(out, _messages(graph, warn), version="1.0.0", metadata=_metadata(graph))
        schemas[graph.version or "(none)"] = schemas.get(graph.version or "(none)", 0) + 1
    loader.report_repeats()
    target = f"{prefix}.et" if traces.shared else f"{prefix}.<rank>.et"
    for version, files in schemas.items():
        yield f"{files} file(s) of Chakra schema {version} -> 1.0.0: {target}"


def _metadata(graph: TraceGraph) -> dict[str, Any]:
    kept = {k: v for k, v in graph.metadata.items() if k != "upgraded_from"}
    return {**kept, "upgraded_from": graph.version or "(none)"}


def _messages(graph: TraceGraph, warn: Warn) -> Iterator[Any]:
    """The graph's nodes as 1.0 messages, run times held in ns rounded to the nearest µs (with one warning)."""
    exact = graph.duration_ns
    rounded, worst = 0, 0
    order = graph.record.argsort(kind="stable").tolist()
    messages = graph_messages(graph)
    for i, message in zip(order, messages, strict=True):
        if exact is not None:
            ns = int(exact[i])
            micros = (ns + 500) // 1000
            if micros * 1000 != ns:
                rounded += 1
                worst = max(worst, abs(micros * 1000 - ns))
                message.duration_micros = micros
        yield message
    if rounded:
        warn(f"{graph.path}: {rounded} run time(s) in ns are not whole microseconds, which Chakra 1.0 holds: "
             f"written rounded to the nearest µs (up to {worst} ns off per node); simulate the original file for "
             "the exact times")
