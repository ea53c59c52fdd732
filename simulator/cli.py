"""The ``astrasim-py`` command.

    astrasim-py --workload W --network N.yml [--system S.json] [--memory M.json] [--comm-groups C.json]
                [--backend analytical-unaware|analytical-aware|packet] [--json FILE] [--format text|astra-sim]
                [--collective-model astra-sim|nccl --hw-profile NAME|FILE.yml [--nccl-algo NAME]]
    astrasim-py trace {inspect,analyze,jsonize,generate,visualize} ...
    astrasim-py report RESULTS.json --html FILE
    astrasim-py sweep SWEEP.yaml --out DIR [--jobs N] [--executor local|ray]   (and: sweep export DIR --csv FILE)
    astrasim-py compare --network N.yml --collective all_reduce --algorithms ring,direct ...
    astrasim-py plot DIR --x SETTING --y METRIC [--hue SETTING]

ASTRA-sim's own flags (``--workload-configuration=`` ...) are accepted as aliases, so existing run
scripts work unchanged.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from collections.abc import Callable
from dataclasses import replace

from network.backends import BACKENDS
from network.config import load_network, load_packet_config
from simulator.checks import COMPUTE_MODELS
from simulator.config import MemoryConfig, default_system, load_memory, load_system
from simulator.node_table import COMM_STREAMS, SINGLE_STREAM
from simulator.results import SimulationResult, format_astra_sim, format_text
from simulator.simulation import (
    COLLECTIVE_MODELS,
    ENGINES,
    SEMANTICS,
    VERSION,
    RunOptions,
    Simulation,
    WallTimeExceeded,
)
from workload.errors import InputError, printable, shown
from workload.files import shown_path
from workload.generated import workload_traces
from workload.groups import load_comm_groups

PROG = "astrasim-py"
def run_report(argv: list[str], warn: object = None) -> int:
    p = argparse.ArgumentParser(prog=f"{PROG} report", description="Render a results JSON (from --json) as a page.")
    p.add_argument("results", help="results JSON written by --json")
    p.add_argument("--html", required=True, metavar="FILE", help="the self-contained HTML page to write")
    args = p.parse_args(argv)
    from simulator.report import write_report

    write_report(args.results, args.html)
    print(args.html)
    return 0


# Each subcommand's module is imported only when it runs: a simulation need not load sweeps, SQLite or plots.
COMMANDS = (  # what `--help` lists: every subcommand, one line each
    ("trace inspect|analyze|jsonize|visualize TRACE", "look into traces: counts, sizes, groups, graphs"),
    ("trace generate collective|compute|sendrecv|memory|llm", "write microbenchmark or LLM training traces"),
    ("trace convert text|pytorch", "ASTRA-sim 1.0 text workloads, PyTorch execution traces -> Chakra ET"),
    ("trace rescale TRACE --npus M", "an N-rank data-parallel trace as an M-rank one"),
    ("trace upgrade TRACE -o PREFIX", "traces of an earlier Chakra schema (0.0.1 .eg, 0.0.4) as Chakra 1.0 files"),
    ("trace synthesize TRACE", "look-alike traces from a learned profile"),
    ("sweep SWEEP.yaml --out DIR", "run every point of a sweep into DIR/results.db"),
    ("sweep export DIR --csv FILE", "a sweep's results as CSV"),
    ("plot DIR --x SETTING --y METRIC", "chart a sweep's results"),
    ("compare --network N.yml --collective C", "algorithms side by side, busbw per size"),
    ("report RESULTS.json --html FILE", "a results JSON as a page"),
    ("validate --profile P --tables T.tsv", "the NCCL-like model against published nccl-tests tables"),
    ("calibrate --profile P --tables T.tsv -o P.yml", "fit a hardware profile to measurements"),
    ("validate-training --tables T.tsv", "predicted training steps against published runs"),
)
SUBCOMMANDS = {"trace": "workload.tools.cli", "report": "simulator.cli", "sweep": "simulator.sweep.cli",
               "compare": "simulator.compare", "plot": "simulator.plot", "validate": "simulator.validate",
               "calibrate": "simulator.calibrate", "validate-training": "simulator.tools.validate_training"}


def _subcommand(name: str) -> Callable[..., int]:
    if name == "report":
        return run_report
    return importlib.import_module(SUBCOMMANDS[name]).run  # type: ignore[no-any-return]


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {printable(message)}", file=sys.stderr)


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _number(minimum: float, maximum: float, integer: bool = False, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [minimum, maximum] (or (minimum, maximum] when ``above``)."""
    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a whole' if integer else 'a'} number, got {shown(text)}"
                                             ) from None
        if not math.isfinite(value) or value > maximum or value < minimum or (above and value == minimum):
            low = f"above {minimum:g}" if above else f"at least {minimum:g}"
            raise argparse.ArgumentTypeError(f"expected a number {low} and at most {maximum:g}, got {shown(text)}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Simulate distributed training from Chakra traces with ASTRA-sim 2.x semantics.\n\n"
                    f"  {PROG} --workload W --network N.yml [options below]\n      simulate a workload\n\n"
                    "Subcommands (each with --help):\n" + "\n".join(
                        f"  {PROG} {name}\n      {what}" for name, what in COMMANDS),
    )
    p.add_argument("--version", action="version", version=f"{PROG} {VERSION}")
    p.add_argument("--workload", "--workload-configuration", dest="workload", required=True,
                   help="trace prefix (dir/trace for dir/trace.<r>.et), folder, one file for every rank, or a "
                        "generator YAML file built in memory (generate: llm, preset: llama3-405b, tp: 8, ...; or "
                        "generate: collective, type: all_reduce, size: 1GiB)")
    p.add_argument("--network", "--network-configuration", dest="network", required=True,
                   help="ASTRA-sim analytical network YAML (bandwidth in GB/s with GB = 2^30 B, latency in ns) or a "
                        "fabric file (fat-tree, torus, dragonfly, rail-optimized, links)")
    p.add_argument("--system", "--system-configuration", dest="system",
                   help="system JSON (default: a built-in LIFO, 4-split, ring configuration)")
    p.add_argument("--memory", "--remote-memory-configuration", dest="memory",
                   help="remote-memory JSON (default: no memory expansion)")
    p.add_argument("--comm-groups", "--comm-group-configuration", dest="comm_groups",
                   help="communicator groups JSON (a file name containing 'empty' means none, as in ASTRA-sim)")
    p.add_argument("--backend", default="analytical-unaware", choices=tuple(BACKENDS),
                   help="network model: analytical-unaware (default; ASTRA-sim's congestion-unaware binary), "
                        "analytical-aware (ASTRA-sim's congestion-aware one) or packet (packet-level, with buffers "
                        "and flow control)")
    p.add_argument("--packet-config", metavar="FILE",
                   help="YAML with the packet backend's parameters (mtu_bytes, header_bytes, buffer_bytes, "
                        "flow_control), instead of the network file's packet: section")
    p.add_argument("--max-wall-time", type=_number(0, 1e9, above=True), metavar="SECONDS",
                   help="stop after this much wall-clock time, with the statistics of the part simulated so far")
    p.add_argument("--num-queues-per-dim", type=_number(1, 4096, integer=True), default=1,
                   help="queues per network dimension (default 1)")
    p.add_argument("--injection-scale", type=_number(0, 1e6), default=1.0,
                   help="multiplies the system's endpoint-delay")
    p.add_argument("--rendezvous-protocol", type=_bool, nargs="?", const=True, default=False,
                   help="precede every send with an 8 KiB handshake from the receiver")
    p.add_argument("--device", metavar="NAME|FILE.yml",
                   help="time GPU compute nodes on this device (A100, H100, H200, H200NVL, B200, B300, GB200, GB300, "
                        "MI300X, MI325X, MI355X, TPUv4, TPUv5p, or a device file): with the roofline model its peak "
                        "BF16 FLOP/s and HBM bandwidth replace the system's peak-perf / local-mem-bw and turn the "
                        "roofline on")
    p.add_argument("--compute-model", default="roofline", metavar="|".join(COMPUTE_MODELS),
                   help="roofline (default): ASTRA-sim's, min(peak, bandwidth x intensity) on FLOPs and bytes; "
                        "kernels: each compute node by its operator and shape (GEMM, attention, memory-bound, "
                        "optimizer) with the --device file's fitted kernel efficiencies and launch times")
    p.add_argument("--strict", action="store_true",
                   help="refuse, instead of warning about, a run whose compute nodes cannot be timed (no recorded "
                        "durations and no --device)")
    p.add_argument("--semantics", choices=SEMANTICS, default="astra-sim",
                   help="astra-sim (default): reproduce ASTRA-sim 2.x exactly; corrected: children of zero-time "
                        "nodes are issued at once instead of at the rank's next event")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="auto (default): simulate one rank per class of ranks that behave alike, every rank when "
                        "they cannot be folded; message: always every rank; symmetric: insist on one representative "
                        "rank")
    p.add_argument("--collective-model", default="astra-sim", metavar="|".join(COLLECTIVE_MODELS),
                   help="astra-sim (default): ASTRA-sim's chunked collective algorithms over the network model; nccl: "
                        "every collective and send/receive timed by the NCCL/RCCL-like model of --hw-profile (the "
                        "library's algorithm and protocol, calibrated timing), sharing GPUs and NICs with concurrent "
                        "ones")
    p.add_argument("--hw-profile", metavar="NAME|FILE.yml",
                   help="the hardware profile of --collective-model nccl: a shipped name (e.g. hgx-h200) or a "
                        "profile file")
    p.add_argument("--nccl-algo", dest="nccl_algo", metavar="NAME",
                   help="with --collective-model nccl: run this algorithm (ring, tree, nvls, nvls_tree, collnet, pat, "
                        "direct, msccl) for every collective it can run, as NCCL_ALGO does; the library picks for the "
                        "rest")
    p.add_argument("--comm-streams", choices=COMM_STREAMS, default=SINGLE_STREAM,
                   help="single (default): one communication node in flight per rank, as ASTRA-sim; communicator: "
                        "one per communicator (a collective's group, a send's peer), as NCCL runs each communicator "
                        "on its own CUDA stream, so a data-parallel reduce-scatter does not hold up tensor- or "
                        "pipeline-parallel traffic")
    p.add_argument("--sm-sharing", action="store_true",
                   help="with --collective-model nccl and --compute-model kernels: a running collective holds one SM "
                        "per channel, and a GEMM or attention kernel started meanwhile runs on the SMs left")
    p.add_argument("--drop-dangling-deps", action="store_true",
                   help="ignore dependencies on nodes absent from a trace (with a warning) instead of failing")
    p.add_argument("--json", dest="json_path", metavar="FILE", help="write the results as JSON")
    p.add_argument("--format", choices=("text", "astra-sim"), default="text",
                   help="text: a short summary in s/ms/µs (default); astra-sim: ASTRA-sim's per-rank lines")
    p.add_argument("--timeline", metavar="FILE.json",
                   help="write a Chrome-trace / Perfetto timeline (open it at ui.perfetto.dev)")
    p.add_argument("--timeline-phases", action="store_true",
                   help="also draw every chunk-stream phase of the collectives, one track per queue")
    p.add_argument("--timeline-ranks", metavar="LIST",
                   help="ranks to draw, e.g. 0-7,31 or all (default: all up to 256 ranks, else 0-15)")
    p.add_argument("--csv", metavar="PREFIX",
                   help="write PREFIX.ranks.csv and PREFIX.collectives.csv; PREFIX.links.csv where the backend "
                        "models links (analytical-aware, packet; otherwise a note says why not) and "
                        "PREFIX.messages.csv on the packet backend")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    for flag in ("--logging-folder", "--logging-configuration", "--compute-scale", "--comm-scale"):
        p.add_argument(flag, help=argparse.SUPPRESS)  # accepted for ASTRA-sim scripts; no effect
    return p


def run_simulation(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    network = load_network(args.network, _warn)
    if args.packet_config:
        network = replace(network, packet=load_packet_config(args.packet_config))
    if args.system:
        system = load_system(args.system, _warn)
        if system.defaults_used:
            _warn(f"{args.system}: not set, using {', '.join(system.defaults_used)}")
    else:
        system = default_system(network.num_dims)
    memory = load_memory(args.memory, _warn) if args.memory else MemoryConfig()
    timeline_ranks = _timeline_ranks(args, network.num_npus)  # before the run: a typo costs no simulation
    groups = {}
    if args.comm_groups and "empty" in os.path.basename(args.comm_groups):
        if os.path.exists(args.comm_groups):
            _warn(f"{shown_path(args.comm_groups)}: taken as no communicator groups (ASTRA-sim's convention for a "
                  "name containing 'empty')")
    elif args.comm_groups:
        groups = load_comm_groups(args.comm_groups, network.num_npus)
    options = RunOptions(backend=args.backend, queues_per_dim=args.num_queues_per_dim,
                         injection_scale=args.injection_scale, rendezvous=args.rendezvous_protocol,
                         semantics=args.semantics, drop_dangling=args.drop_dangling_deps, device=args.device,
                         compute_model=args.compute_model,
                         engine=args.engine, progress=not args.quiet, strict=args.strict,
                         timeline=bool(args.timeline), timeline_phases=args.timeline_phases,
                         max_wall_time_s=args.max_wall_time, collective_model=args.collective_model,
                         hw_profile=args.hw_profile, nccl_algorithm=args.nccl_algo, comm_streams=args.comm_streams,
                         sm_sharing=args.sm_sharing)
    sim = Simulation(workload_traces(args.workload, network.num_npus), network, system, memory, groups, options, _warn)
    try:
        result = sim.run()
    except WallTimeExceeded as stop:
        print(f"{PROG}: {stop}", file=sys.stderr)
        if args.json_path:
            stop.result.write_json(args.json_path)
        print(format_text(stop.result))
        return 3
    if args.json_path:
        result.write_json(args.json_path)
    if args.csv:
        from simulator.export import write_csvs

        write_csvs(args.csv, result, sim.workloads, sim.backend)
    if args.timeline:
        _write_timeline(args, sim, result, timeline_ranks)
    print(format_astra_sim(result) if args.format == "astra-sim" else format_text(result))
    return 0


def _timeline_ranks(args: argparse.Namespace, npus: int) -> list[int]:
    """The ranks a timeline draws; a rank list that names ranks the network lacks is refused."""
    from simulator.timeline import parse_ranks

    if not args.timeline:
        if args.timeline_ranks is not None or args.timeline_phases:
            _warn("--timeline-ranks and --timeline-phases shape a timeline: without --timeline FILE.json they "
                  "have no effect")
        return []
    if args.timeline_phases and args.collective_model == "nccl":
        _warn("--timeline-phases: the NCCL-like collective model runs no chunk-stream phases; each collective is "
              "one slice of the timeline")
    try:
        return parse_ranks(args.timeline_ranks or ("all" if npus <= 256 else "0-15"), npus, strict=True)
    except ValueError as e:
        raise InputError(f"--timeline-ranks: {e}") from None


def _write_timeline(args: argparse.Namespace, sim: Simulation, result: SimulationResult, ranks: list[int]) -> None:
    from simulator.timeline import build_timeline, write_timeline

    npus = sim.network.num_npus
    spec = args.timeline_ranks or ("all" if npus <= 256 else "0-15")
    note = ""
    if result.engine == "symmetric":
        reps = sorted(set(result.representative))
        note = (f"every rank behaves like one of rank(s) {_some(reps)} (folded run): only those are drawn")
        drawn = sorted({result.representative[r] for r in ranks})  # each asked-for rank as the rank it behaves like
        if args.timeline_ranks is not None and drawn != ranks:
            note += f"; --timeline-ranks {spec} draws rank(s) {_some(drawn)}, the ranks they behave like"
        ranks = drawn
        _warn(f"timeline: {note}")
    elif args.timeline_ranks is None and npus > 256:
        _warn(f"timeline: drawing ranks {spec} of {npus} (choose with --timeline-ranks)")
    links = getattr(sim.backend, "links", None)
    size = write_timeline(args.timeline, build_timeline(sim.workloads, sim.network.npus_count, ranks, links,
                                                        result.finish_ns, note=note))
    print(f"timeline: {args.timeline} ({size / 2**20:.1f} MiB); open it at https://ui.perfetto.dev", file=sys.stderr)


def _some(ranks: list[int], shown: int = 16) -> str:
    """The first ``shown`` ranks, comma-separated, with ' ...' when there are more."""
    return ", ".join(map(str, ranks[:shown])) + (" ..." if len(ranks) > shown else "")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status (1 for bad input, reported without a traceback)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] and argv[0] in SUBCOMMANDS:
            return _subcommand(argv[0])(argv[1:], _warn)
        return run_simulation(argv)
    except InputError as e:
        lines = str(e).split("\n")  # a deadlock report has a line per rank; nothing else may break lines
        print(f"{PROG}: error: " + "\n".join(printable(line) for line in lines), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # the machine refused a file we read or write: the user's to fix, in one line
        name = f"{shown_path(e.filename)}: " if e.filename else ""
        print(f"{PROG}: error: {name}{printable(e.strerror or str(e))}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"{PROG}: error: out of memory (the run is larger than this machine's memory)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
