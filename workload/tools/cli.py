"""The ``astrasim-py trace ...`` subcommands: inspect, analyze, jsonize, visualize, generate, convert, rescale,
upgrade, synthesize."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from workload.errors import InputError, TraceError, printable, shown
from workload.files import contained_path, shown_path
from workload.graph import TraceGraph
from workload.limits import add_output_limits, check_output, output_limits, parse_size, require_int
from workload.tools import analyze, inspect_trace, jsonize
from workload.tools import generate as gen
from workload.traceset import TraceLoader, check_rank_count, resolve_workload

Warn = Callable[[str], None]


def build_parser(prog: str = "astrasim-py trace") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Tools for Chakra execution traces.")
    sub = parser.add_subparsers(dest="tool", required=True, metavar="TOOL")

    p = sub.add_parser("inspect", help="ranks, node counts, collectives, bytes, compute time, dependency depth")
    _workload_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--per-rank", action="store_true", help="add a line per rank to the text output")

    p = sub.add_parser("analyze", help="per-rank compute and communication totals, and collective sizes that "
                                       "differ between ranks (no simulation)")
    _workload_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--heatmap", metavar="FILE.png", help="ranks x collectives heatmap (needs matplotlib)")
    p.add_argument("--top", type=int, default=20, help="differing collectives to list (default 20)")
    p.add_argument("--by-group", action="store_true",
                   help="line collectives up per communicator group id (default: by type and order only)")

    p = sub.add_parser("jsonize", help="the trace as one valid JSON document (or JSON Lines)")
    _workload_args(p)
    p.add_argument("--output", "-o", help="output file (default: standard output)")
    p.add_argument("--jsonl", action="store_true", help="JSON Lines: one record per line")
    p.add_argument("--rank", type=int, action="append", help="only this rank (repeatable)")

    p = sub.add_parser("visualize", help="the dependency graph as GraphML or Graphviz DOT text")
    _workload_args(p)
    p.add_argument("--output", "-o", required=True, help="FILE.graphml, FILE.dot or FILE.gv")
    p.add_argument("--format", choices=("graphml", "dot"),
                   help="default: from the output file's extension (.graphml; .dot or .gv)")
    p.add_argument("--rank", type=int, default=0, help="which rank's trace (default 0)")

    p = sub.add_parser("generate", help="microbenchmark or LLM training traces, one <name>.<rank>.et file per rank")
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    k = kinds.add_parser("collective", help="one collective per rank, for each type x size x NPU count; "
                                            "writes OUT/<type>/<npus>npus_<size>/<type>.<rank>.et")
    k.add_argument("--type", required=True, help=f"comma-separated: {', '.join(gen.COLLECTIVE_NAMES)}")
    k.add_argument("--size", required=True, help="comma-separated sizes, e.g. 1MiB,64MiB")
    k.add_argument("--npus", required=True, help="comma-separated NPU counts, e.g. 8,16")
    k.add_argument("--repeat", type=int, default=1, help="collectives per rank, issued one after another")
    k.add_argument("--pg-name", help="communicator group of the collectives (pg_name attribute)")
    k.add_argument("--output", "-o", required=True, help="output folder")
    add_output_limits(k)
    k = kinds.add_parser("compute", help="compute-only nodes; writes OUT/<name>.<rank>.et")
    k.add_argument("--npus", type=int, required=True, help="ranks (one trace file each)")
    k.add_argument("--count", type=int, default=1, help="compute nodes per rank")
    k.add_argument("--duration-us", type=int, default=0, help="recorded duration of each node (µs)")
    k.add_argument("--num-ops", type=int, default=0, help="operations per node (for the roofline model)")
    k.add_argument("--tensor-size", default="0", help="bytes touched per node (for the roofline model)")
    k.add_argument("--independent", action="store_true", help="no dependencies between the nodes")
    _output_args(k, "compute")
    k = kinds.add_parser("sendrecv", help="a send/recv ring: rank r sends to r+1, receives from r-1")
    k.add_argument("--npus", type=int, required=True, help="ranks in the ring (one trace file each)")
    k.add_argument("--size", required=True, help="message size, e.g. 1MiB")
    k.add_argument("--iterations", type=int, default=1, help="sends (and receives) per rank, one after another")
    _output_args(k, "sendrecv")
    k = kinds.add_parser("memory", help="remote-memory loads or stores")
    k.add_argument("--npus", type=int, required=True, help="ranks (one trace file each)")
    k.add_argument("--tensor-size", required=True, help="bytes per access, e.g. 1MiB")
    k.add_argument("--access", choices=("load", "store"), default="load", help="memory node type (default load)")
    k.add_argument("--count", type=int, default=1, help="accesses per rank, one after another")
    _output_args(k, "memory")
    k = kinds.add_parser("llm", help="one training iteration of a dense or MoE transformer under a parallelism "
                                     "plan (data, tensor, pipeline, expert, ZeRO); presets for GPT-3, Llama-3, "
                                     "Mixtral")
    _hook("llm").configure(k)

    p = sub.add_parser("convert", help="other workload formats into Chakra ET files")
    formats = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
    _hook("text").configure(formats.add_parser("text", help="ASTRA-sim 1.0 text workloads (every parallelism "
                                                            "keyword, HYBRID_TRANSFORMER included)"))
    _hook("pytorch").configure(formats.add_parser("pytorch", help="PyTorch execution traces (host JSON, "
                                                                  "optionally linked with a Kineto trace)"))
    _hook("rescale").configure(sub.add_parser("rescale", help="an N-rank data-parallel trace as an M-rank one"))
    _hook("upgrade").configure(sub.add_parser("upgrade", help="traces of an earlier Chakra schema (0.0.1 .eg, "
                                                              "0.0.4) as Chakra 1.0 files"))
    _hook("synthesize").configure(sub.add_parser(
        "synthesize", help="learn a statistical profile of traces and generate obfuscated look-alikes of any size"))
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give every tool without a description of its own its one-line help as one, so its --help says what it does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                if not child.description and helps.get(name):
                    child.description = helps[name][:1].upper() + helps[name][1:] + "."
                _describe(child)


# Tools in their own modules: each has configure(parser) and main(args, warn).
HOOKS = {"llm": "workload.llm.cli", "text": "workload.convert.text", "pytorch": "workload.convert.pytorch",
         "rescale": "workload.rescale", "upgrade": "workload.upgrade", "synthesize": "workload.synthesis.cli"}


def _hook(name: str) -> Any:
    return importlib.import_module(HOOKS[name])


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="trace prefix (dir/trace for dir/trace.<r>.et), folder, or single file")
    p.add_argument("--drop-dangling-deps", action="store_true",
                   help="as in a simulation: dependencies that can never be met (on nodes absent from the file, or "
                        "of a node on itself) do not count as a reason the trace would not simulate")


def _output_args(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--output", "-o", required=True, help="output folder")
    p.add_argument("--name", default=name, help=f"file name stem (default {name})")
    add_output_limits(p)


def _load(args: argparse.Namespace, warn: Warn, ranks: list[int] | None = None
          ) -> tuple[list[tuple[int, str, TraceGraph]], bool]:
    """The graphs of the wanted ranks, decoded without the simulation's checks: tools show any trace."""
    traces = resolve_workload(args.workload)
    loader = TraceLoader(warn=warn, checks=False)
    count = traces.num_ranks or 1
    wanted = ranks if ranks is not None else list(range(count))
    if traces.shared:
        wanted = [0]  # every rank runs the same file
    for r in wanted:
        if not 0 <= r < count:
            raise InputError(f"rank {r} is out of range: {traces.describe()}")
    check_rank_count(len(wanted), 0, f"workload {shown_path(traces.source)}")
    loaded = [(r, traces.file_for(r), loader.load(traces.file_for(r), r)) for r in wanted]
    loader.report_repeats()
    return loaded, traces.shared


def _inspect(args: argparse.Namespace, warn: Warn) -> None:
    ranks, shared = _load(args, warn)
    summaries = [inspect_trace.summarize_rank(r, path, g, args.drop_dangling_deps) for r, path, g in ranks]
    if args.json:
        json.dump(inspect_trace.as_json(summaries, shared), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(inspect_trace.format_text(summaries, shared, args.per_rank))


def _analyze(args: argparse.Namespace, warn: Warn) -> None:
    require_int("--top", args.top, 0)
    ranks, _ = _load(args, warn)
    graphs = [(r, g) for r, _, g in ranks]
    totals = [analyze.rank_totals(r, g) for r, g in graphs]
    found, slots, by_rank = analyze.imbalances(graphs, args.by_group)
    if args.heatmap:
        analyze.write_heatmap(args.heatmap, slots, by_rank)
    if args.json:
        json.dump(analyze.as_json(totals, found), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(analyze.format_text(totals, found, args.top))


def _jsonize(args: argparse.Namespace, warn: Warn) -> None:
    ranks, _ = _load(args, warn, args.rank)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout  # noqa: SIM115
    try:
        if args.jsonl:
            jsonize.write_jsonl(ranks, out)
        else:
            jsonize.write_document(ranks, out)
    finally:
        if args.output:
            out.close()


def _visualize(args: argparse.Namespace, warn: Warn) -> None:
    from workload.tools import visualize  # networkx is only needed here

    fmt = visualize.output_format(args.output, args.format)
    ((rank, path, graph),), _ = _load(args, warn, [args.rank])
    if graph.num_nodes > 100_000:
        warn(f"{path}: {graph.num_nodes} nodes; graph viewers struggle with graphs this large")
    try:
        if fmt == "graphml":
            visualize.write_graphml(graph, args.output)
        else:
            with open(args.output, "w", encoding="utf-8") as out:
                visualize.write_dot(graph, out, title=os.path.basename(path))
    except TraceError as e:
        raise e.located(path=path, rank=rank) from None
    print(printable(args.output))


def _sizes(flag: str, text: str) -> list[int]:
    try:
        return [parse_size(s) for s in text.split(",")]
    except ValueError as e:
        raise InputError(f"{flag}: {e}") from None


def _counts(flag: str, text: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",")]
    except ValueError:
        raise InputError(f"{flag}: not a list of NPU counts: {shown(text)}") from None
    if any(v < 1 for v in values):
        raise InputError(f"{flag}: NPU counts must be positive: {shown(text)}")
    return values


def _check_counts(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """The generator's whole-number flags within their ranges (gen.LIMITS), as one-line errors."""
    for name in names:
        low, high = gen.LIMITS[name]
        require_int(f"--{name.replace('_', '-')}", getattr(args, name), low, high)


def _generate(args: argparse.Namespace, warn: Warn) -> None:
    if args.kind == "llm":
        _hook("llm").main(args, warn)
        return
    limits = output_limits(args)
    jobs: list[tuple[str, gen.RankTraces]] = []
    if args.kind == "collective":
        types = [t.strip() for t in args.type.split(",")]
        for t in types:
            if t not in gen.COLLECTIVE_NAMES:
                raise InputError(f"unknown collective type {shown(t)}; valid: {', '.join(gen.COLLECTIVE_NAMES)}")
        _check_counts(args, ("repeat",))
        sizes, counts = _sizes("--size", args.size), _counts("--npus", args.npus)
        for t in types:
            for size in sizes:
                for npus in counts:
                    prefix = os.path.join(args.output, t, f"{npus}npus_{gen.size_label(size)}", t)
                    jobs.append((prefix, gen.collective(npus, gen.COLLECTIVE_NAMES[t], size, repeat=args.repeat,
                                                        pg_name=args.pg_name)))
    else:
        prefix = contained_path(args.output, args.name, "--name")
        (npus,) = _counts("--npus", str(args.npus))
        if args.kind == "compute":
            _check_counts(args, ("count", "duration_us", "num_ops"))
            (tensor,) = _sizes("--tensor-size", args.tensor_size)
            traces = gen.compute(npus, args.count, duration_micros=args.duration_us, num_ops=args.num_ops,
                                 tensor_size=tensor, independent=args.independent)
        elif args.kind == "sendrecv":
            _check_counts(args, ("iterations",))
            (size,) = _sizes("--size", args.size)
            if npus < 2:
                raise InputError("--npus: a send/recv ring needs at least 2 NPUs")
            traces = gen.sendrecv_ring(npus, size, iterations=args.iterations)
        else:
            _check_counts(args, ("count",))
            (tensor,) = _sizes("--tensor-size", args.tensor_size)
            traces = gen.memory(npus, tensor, kind=args.access, count=args.count)
        jobs.append((prefix, traces))
    check_output(f"trace generate {args.kind}", sum(len(t) for _, t in jobs),
                 sum(t.estimated_bytes() for _, t in jobs), limits)
    for prefix, traces in jobs:
        gen.write_rank_traces(prefix, traces)
        print(printable(prefix))


COMMANDS = {"inspect": _inspect, "analyze": _analyze, "jsonize": _jsonize, "visualize": _visualize,
            "generate": _generate,
            "convert": lambda args, warn: _hook(args.format).main(args, warn),
            "rescale": lambda args, warn: _hook("rescale").main(args, warn),
            "upgrade": lambda args, warn: _hook("upgrade").main(args, warn),
            "synthesize": lambda args, warn: _hook("synthesize").main(args, warn)}


def run(argv: list[str], warn: Warn) -> int:
    args = build_parser().parse_args(argv)
    COMMANDS[args.tool](args, lambda message: warn(printable(message)))  # warnings quote trace names and paths
    return 0
