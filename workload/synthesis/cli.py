"""``astrasim-py trace synthesize``: learn a profile of traces and generate obfuscated look-alikes of any size.

    astrasim-py trace synthesize INPUT --output PREFIX [--npus M] [--scale X] [--seed S] [--noise F]
        [--save-profile FILE.json] [--compare --network N.yml [--system S.json] [--device NAME]]
    astrasim-py trace synthesize --from-profile FILE.json --output PREFIX [--npus M] [--scale X] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from typing import Any

from workload.errors import InputError, printable
from workload.files import shown_path
from workload.groups import load_comm_groups
from workload.limits import add_output_limits, check_output, output_limits, require_int
from workload.synthesis.generate import generate, nodes_per_rank
from workload.synthesis.learn import learn
from workload.synthesis.profile import Profile, load_profile
from workload.tools.generate import write_rank_traces
from workload.traceset import TraceLoader, resolve_workload

_NODE_BYTES = 64  # a generated node's size in a file, about (ids, dependencies, a few attributes)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", nargs="?", metavar="INPUT",
                        help="traces to learn from: prefix (dir/trace for dir/trace.<r>.et), folder, or single file")
    parser.add_argument("--from-profile", metavar="FILE.json", help="generate from a saved profile instead of INPUT")
    parser.add_argument("--output", "-o", metavar="PREFIX", help="write the synthetic traces as PREFIX.<rank>.et")
    parser.add_argument("--save-profile", metavar="FILE.json",
                        help="write the learned profile (no names, ids or strings; values binned and rounded)")
    parser.add_argument("--npus", type=int, help="ranks to generate (default: the original count; a single shared "
                                                 "INPUT file needs it)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="nodes per rank relative to the original: whole parts repeat the iteration, a fraction "
                             "adds a thinned copy (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed: the same seed gives the same bytes")
    parser.add_argument("--noise", type=float, default=0.0,
                        help="scale each stored value by a random factor in [1-F, 1+F] (0 <= F < 1; default 0)")
    parser.add_argument("--digits", type=int, default=3, help="significant digits values are rounded to (default 3)")
    parser.add_argument("--comm-groups", metavar="FILE.json", help="the original's communicator groups "
                                                                   "({\"1\": [0, 1], ...}), when its traces do not "
                                                                   "declare them")
    parser.add_argument("--drop-dangling-deps", action="store_true",
                        help="ignore dependencies on nodes absent from a file, with a warning")
    parser.add_argument("--compare", action="store_true",
                        help="report how closely the synthetic traces match INPUT, simulating both on --network")
    parser.add_argument("--network", metavar="N.yml", help="network for --compare")
    parser.add_argument("--system", metavar="S.json", help="system for --compare (default: the built-in one)")
    parser.add_argument("--backend", help="network backend for --compare (default: the simulator's)")
    parser.add_argument("--device",
                        help="for --compare: time compute nodes with the roofline model of this device preset (A100, "
                             "H100, ...), as the simulator's --device does; without it, compute nodes that have no "
                             "recorded duration cannot be timed and the comparison covers communication only")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document (outputs written, and the comparison) instead of text")
    add_output_limits(parser)


def main(args: argparse.Namespace, warn: Callable[[str], None]) -> None:
    _check(args)
    num_ranks = None
    if args.from_profile:
        profile = load_profile(args.from_profile)
    else:
        profile, num_ranks = _learn(args, warn)
    written: list[str] = []
    if args.save_profile:
        try:
            profile.save(args.save_profile)
        except OSError as e:
            raise InputError(f"cannot write profile {shown_path(args.save_profile)}: {e.strerror or e}") from None
        written.append(args.save_profile)
    if args.output:
        npus = args.npus or profile.layout.num_ranks
        check_output(f"trace synthesize of {npus:,} ranks", npus,
                     npus * nodes_per_rank(profile, args.scale) * _NODE_BYTES, output_limits(args))
        traces = generate(profile, args.npus, args.scale, args.seed)
        try:
            write_rank_traces(args.output, traces)
        except OSError as e:
            raise InputError(f"cannot write traces {shown_path(args.output)}.<rank>.et: {e.strerror or e}") from None
        written.append(args.output)
    report = None
    if args.compare:
        from simulator.fidelity import KS_RESOLUTION, compare_workloads  # only needed to compare

        options: dict[str, Any] = {"backend": args.backend} if args.backend else {}
        if args.device:
            options["device"] = args.device
        # values moved on purpose (noise, rounding) do not count against the distributions
        resolution = max(KS_RESOLUTION, (1 + args.noise) * (1 + 0.5 * 10.0 ** (1 - args.digits)) - 1)
        report = compare_workloads(args.workload, args.output, args.network, args.system, args.comm_groups,
                                   expected_ratio=args.scale, num_ranks=num_ranks, resolution=resolution, warn=warn,
                                   **options)
    if args.json:
        doc: dict[str, Any] = {"outputs": written, "ranks": args.npus or profile.layout.num_ranks,
                               "classes": len(profile.classes)}
        if report is not None:
            doc["fidelity"] = report.to_json()
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    for path in written:
        print(printable(path))
    if report is not None:
        print(report.format_text())


def _check(args: argparse.Namespace) -> None:
    if args.workload and args.from_profile:
        raise InputError("give the traces to learn from (INPUT) or --from-profile FILE.json, not both")
    if not args.workload and not args.from_profile:
        raise InputError("give the traces to learn from (INPUT) or --from-profile FILE.json")
    if not args.output and not args.save_profile:
        raise InputError("nothing to write: give --output PREFIX and/or --save-profile FILE.json")
    if args.npus is not None and args.npus < 1:
        raise InputError(f"--npus must be at least 1 (got {args.npus})")
    if not (args.scale > 0 and math.isfinite(args.scale)):
        raise InputError(f"--scale must be a positive number (got {args.scale})")
    if not 0 <= args.noise < 1:
        raise InputError(f"--noise must be at least 0 and below 1 (got {args.noise})")
    if not 1 <= args.digits <= 15:
        raise InputError(f"--digits must be between 1 and 15 (got {args.digits})")
    require_int("--seed", args.seed, 0, (1 << 63) - 1)
    if args.compare:
        if args.from_profile:
            raise InputError("--compare needs the original traces (INPUT), not --from-profile")
        if not args.output:
            raise InputError("--compare needs --output PREFIX (the synthetic traces to compare)")
        if not args.network:
            raise InputError("--compare needs --network N.yml to simulate both workloads on")
    elif args.network or args.system or args.backend or args.device:
        raise InputError("--network, --system, --backend and --device are only used with --compare")
    if args.from_profile and args.comm_groups:
        raise InputError("--comm-groups describes INPUT's groups; a profile already holds its own")


def _learn(args: argparse.Namespace, warn: Callable[[str], None]) -> tuple[Profile, int]:
    traces = resolve_workload(args.workload)
    if traces.shared and args.npus is None:
        raise InputError(f"{args.workload} is one file that runs on any number of ranks: give --npus")
    num_ranks = traces.num_ranks or args.npus
    if args.compare and args.npus is not None and args.npus != num_ranks:
        raise InputError(f"--compare simulates the original and the synthetic traces on one network: generate "
                         f"the original {num_ranks} ranks (leave out --npus {args.npus})")
    loader = TraceLoader(drop_dangling=args.drop_dangling_deps, warn=warn)
    graphs = [loader.load(traces.file_for(r), r) for r in range(num_ranks)]
    groups = load_comm_groups(args.comm_groups, num_ranks) if args.comm_groups else {}
    return learn(graphs, groups, digits=args.digits, noise=args.noise, seed=args.seed, warn=warn), num_ranks
