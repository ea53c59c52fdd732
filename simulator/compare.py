"""``astrasim-py compare``: one workload (or a generated collective over sizes) under several algorithms.

    astrasim-py compare --network N.yml [--system S.json] --collective all_reduce --sizes 1MiB,64MiB,1GiB \\
                        --algorithms ring,direct,halvingDoubling,doubleBinaryTree [--plot FILE.png]
    astrasim-py compare --network N.yml --system S.json --workload W --algorithms ring,ring/direct
    astrasim-py compare --network N.yml --collective all_reduce --sizes 1MiB,1GiB --collective-model nccl \
                        --hw-profile hgx-h200 [--algorithms auto,ring,nvls]

An algorithm is one name for every dimension or one per dimension joined by "/", or custom:PREFIX for a custom
algorithm given as Chakra ETs PREFIX.<rank>.et (run as ASTRA-sim runs them: one chunk-stream). Sizes, times and
bandwidths follow nccl-tests: a size is the whole buffer (all-gather: the gathered output, n x what each
rank sends), a collective's time is averaged over the ranks, algbw = size / time and busbw = algbw x the
collective's bus factor (2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter, all-to-all), both
in GB/s with GB = 10^9 bytes.

With ``--collective-model nccl`` the NCCL/RCCL-like model of ``--hw-profile`` times the collectives: an
"algorithm" is then the library's own choice (``auto``, the default) or one it is forced to run (``ring``,
``tree``, ``nvls``, ... as NCCL_ALGO), and each row names what ran (algorithm/protocol x channels).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compute.devices import device as device_preset
from network.config import load_network
from simulator.checks import COMPUTE_MODELS
from simulator.collectives.registry import FAMILIES, parse_algorithm
from simulator.config import IMPLEMENTATION_KEYS
from simulator.results import above_links, format_ns
from simulator.sweep.executors import capped_jobs, run_points
from simulator.sweep.spec import Point, parse_setting, resolve_run
from simulator.units import NETWORK_GB
from workload.errors import InputError
from workload.files import inert_row
from workload.optional import pyplot
from workload.tools.generate import parse_size, size_label

PROG = "astrasim-py compare"
KEYS = {collective: key for key, collective in IMPLEMENTATION_KEYS.items()}  # all_reduce -> all-reduce-implementation
BANDWIDTHS = "algbw and busbw in GB/s, GB = 10^9 bytes (as nccl-tests)"


@dataclass(frozen=True, slots=True)
class Row:
    algorithm: str
    size_bytes: int | None  # nccl-tests' size: the whole buffer (all-gather: the gathered output); None: a workload
    outcome: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.outcome["status"] == "ok"

    def metric(self, name: str) -> Any:
        return self.outcome["metrics"].get(name)

    @property
    def time_ns(self) -> float:
        """A collective's time averaged over ranks (nccl-tests' default), or a workload's end-to-end time."""
        return self.metric("finish_ns" if self.size_bytes is None else "collective_time_ns_mean")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Compare collective algorithms on one network: time, algorithm and bus bandwidth, "
                               "speed-up. As in nccl-tests: a size is the whole buffer (all_gather: the gathered "
                               "output, ranks x what each rank sends), the time is the mean over ranks, algbw = "
                               "size / time, busbw = algbw x the bus factor (2(n-1)/n all_reduce, (n-1)/n "
                               f"all_gather, reduce_scatter, all_to_all); {BANDWIDTHS}.")
    p.add_argument("--network", required=True, help="network YAML (ASTRA-sim's, bandwidth in GB/s with GB = 2^30 B; "
                                                    "or a fabric file)")
    p.add_argument("--system", help="system JSON the algorithms are put into (default: the built-in one)")
    p.add_argument("--memory", help="remote-memory JSON")
    p.add_argument("--comm-groups", dest="comm_groups", help="communicator groups JSON")
    p.add_argument("--backend", default="analytical-unaware", help="network backend (default analytical-unaware)")
    p.add_argument("--device", help="time GPU compute nodes of a --workload on this device (a name or device file; "
                                    "as astrasim-py --device)")
    p.add_argument("--compute-model", default="roofline", choices=COMPUTE_MODELS,
                   help="roofline (default) or kernels, as astrasim-py --compute-model")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--workload", help="a workload (trace prefix, folder or file)")
    what.add_argument("--collective", help=f"a generated microbenchmark: {', '.join(KEYS)}")
    p.add_argument("--sizes", default="1MiB,16MiB,256MiB",
                   help="sizes for --collective, each the whole buffer as nccl-tests' -b/-e (all_gather: the "
                        "gathered output; each rank sends size/ranks) (default 1MiB,16MiB,256MiB)")
    p.add_argument("--algorithms",
                   help="comma-separated, e.g. ring,direct,halvingDoubling,doubleBinaryTree; ring/direct for one "
                        "per dimension; custom:PREFIX for a custom algorithm's ETs (PREFIX.<rank>.et) (needed unless "
                        "--explain); with --collective-model nccl: auto (the "
                        "library's choice, the default) and NCCL algorithms to force (ring, tree, nvls, nvls_tree, "
                        "collnet, pat, direct, msccl)")
    p.add_argument("--collective-model", dest="collective_model", choices=("astra-sim", "nccl"), default="astra-sim",
                   help="astra-sim (default): ASTRA-sim's algorithms on the network; nccl: the NCCL/RCCL-like model "
                        "of --hw-profile times every collective")
    p.add_argument("--hw-profile", dest="hw_profile", help="hardware profile of the NCCL/RCCL-like collective model "
                                                          "(--collective-model nccl, --explain): a shipped name or a "
                                                          ".yml file")
    p.add_argument("--explain", metavar="SIZE",
                   help="with --hw-profile: list every algorithm/protocol the library considers for --collective at "
                        "SIZE on the network's NPUs, with the library's estimate and the calibrated time (no "
                        "simulation)")
    p.add_argument("--metric", choices=("time", "busbw"), default="time", help="what --plot draws (default time)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw the comparison (needs matplotlib: pip install 'astrasim-py[plot]')")
    p.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    p.add_argument("--jobs", "-j", type=int, help="simulations at once (default and most: all cores)")
    p.add_argument("--force-jobs", action="store_true", help="run --jobs simulations at once even above the cores")
    return p


def per_dimension(text: str, dims: int) -> list[str]:
    """["ring", "direct"] from "ring/direct"; one name fills every dimension."""
    names = [n.strip() for n in text.split("/")]
    specs = [parse_algorithm(n) for n in names]
    if len(names) == 1:
        return names if specs[0].whole_network else names * dims
    if len(names) != dims:
        raise InputError(f"algorithm {text!r} names {len(names)} dimensions but the network has {dims}")
    return names


def _positive_size(text: str) -> int:
    """A size as nccl-tests takes it: at least one byte (0 B would time nothing: a busbw of infinity)."""
    size = parse_size(text)
    if size == 0:
        raise ValueError("a size of 0 bytes moves nothing: give at least 1 byte")
    return size


def _who_picks(plan: Any, tuner: str | None) -> str:
    """How the chosen candidate was picked: the library's lowest estimate, unless an MSCCL program or a tuner
    plugin went first (the header said 'the lowest estimate' above a choice that was not)."""
    chosen = plan.chosen
    if chosen.algorithm == "msccl":
        return "the library runs its MSCCL program for this call before its estimates"
    lowest = min(plan.candidates, key=lambda c: c.library_us)
    if tuner and chosen.library_us > lowest.library_us:
        return (f"the tuner plugin {tuner} picks {chosen.algorithm}/{chosen.protocol} over the library's lowest "
                f"estimate ({lowest.algorithm}/{lowest.protocol})")
    return "the library picks the lowest estimate"


def explain(args: argparse.Namespace, npus: int) -> int:
    """Every candidate of the library for one collective and size: its estimate (which picks) and the timing."""
    from simulator.collectives.hardware import load_profile
    from simulator.collectives.nccl import CollectiveModel, Communicator

    if not args.hw_profile or not args.collective:
        raise InputError("--explain needs --hw-profile and --collective")
    try:
        size = _positive_size(args.explain)
    except ValueError as e:
        raise InputError(f"--explain: {e}") from None
    profile = load_profile(args.hw_profile)
    nodes = -(-npus // profile.gpus_per_node)
    plan = CollectiveModel(profile).plan(args.collective, size, Communicator.of(range(npus), profile.gpus_per_node))
    print(f"{args.collective} of {size_label(size)} (nccl-tests size) on {npus} GPUs, {nodes} node(s) of "
          f"{profile.name} ({profile.library} {profile.library_version}); {_who_picks(plan, profile.tuner)}; "
          "busbw in GB/s, GB = 10^9 B")
    print(f"{'algorithm':<10} {'protocol':<8} {'channels':>8} {'library estimate':>17} {'calibrated time':>16} "
          f"{'busbw':>9}")
    for i, c in enumerate(plan.candidates):
        print(f"{c.algorithm:<10} {c.protocol:<8} {c.channels:>8} {format_ns(round(c.library_us * 1e3)):>17} "
              f"{format_ns(round(c.time_us * 1e3)):>16}{' ' if c.calibrated else '*'} {c.busbw_GBps:>9.2f}"
              + ("  <- chosen" if i == 0 else ""))
    if any(not c.calibrated for c in plan.candidates):
        print("* not calibrated on this profile's tables: timed with the library's constants")
    return 0


def run(argv: list[str], warn: Callable[[str], None]) -> int:
    args = build_parser().parse_args(argv)
    if args.explain:
        return explain(args, load_network(args.network, warn).num_npus)
    nccl = args.collective_model == "nccl"
    if nccl and not args.hw_profile:
        raise InputError("--collective-model nccl needs --hw-profile NAME or FILE.yml")
    if not nccl and args.hw_profile:
        raise InputError("--hw-profile needs --collective-model nccl (or --explain SIZE)")
    if not args.algorithms and not nccl:
        raise InputError("--algorithms is needed (or --collective-model nccl, or --explain SIZE with --hw-profile)")
    if args.plot:
        pyplot("--plot")  # before any simulation: a missing matplotlib must not cost the whole comparison
    jobs = capped_jobs(args.jobs, args.force_jobs, warn)
    device = (os.path.abspath(args.device) if args.device.endswith((".yml", ".yaml"))
              else device_preset(args.device).name) if args.device else None
    network = load_network(args.network, warn)
    algorithms = [a.strip() for a in (args.algorithms or "auto").split(",") if a.strip()]
    if not algorithms:
        raise InputError("--algorithms: name at least one algorithm")
    custom = {a: os.path.abspath(a.split(":", 1)[1]) for a in algorithms if a.startswith("custom:")}
    per_dim = {} if nccl else {a: per_dimension(a, network.num_dims) for a in algorithms if a not in custom}
    if nccl:
        check_nccl_algorithms(algorithms)
    if args.collective:
        if args.collective not in KEYS:
            raise InputError(f"--collective {args.collective!r}: valid: {', '.join(KEYS)} (broadcast has no "
                             "algorithm choice)")
        try:
            sizes = [_positive_size(s) for s in args.sizes.split(",")]
        except ValueError as e:
            raise InputError(f"--sizes: {e}") from None
        sizes = list(dict.fromkeys(buffer_size(args.collective, s, network.num_npus, warn) for s in sizes))
        kinds = [args.collective]
    else:
        sizes, kinds = [None], list(KEYS)
    base = {"workload": ({"generate": "collective", "type": args.collective} if args.collective
                         else os.path.abspath(args.workload)),
            "network": os.path.abspath(args.network), "backend": args.backend}
    options: dict[str, Any] = {"device": device} if device else {}
    if args.compute_model != "roofline":
        options["compute_model"] = args.compute_model
    if nccl:
        profile = args.hw_profile
        options.update(collective_model="nccl",
                       hw_profile=os.path.abspath(profile) if profile.endswith((".yml", ".yaml")) else profile)
    if options:
        base["options"] = options
    for section in ("system", "memory", "comm_groups"):
        if getattr(args, section):
            base[section] = os.path.abspath(getattr(args, section))
    usable: dict[str, list[str]] = {}
    skipped = []
    for algorithm in algorithms:
        if nccl or algorithm in custom:  # the model times every kind (a forced algorithm runs where it can, as
            usable[algorithm] = kinds    # NCCL_ALGO); a custom algorithm's ET implements what it implements
            continue
        families = {parse_algorithm(n).family for n in per_dim[algorithm]}
        usable[algorithm] = [k for k in kinds if all(k in FAMILIES[f] for f in families)]
        if not usable[algorithm]:
            skipped.append(f"{algorithm} does not implement {kinds[0].replace('_', '-')}")
    points: list[Point] = []
    for size in sizes:
        for algorithm in algorithms:
            if not usable[algorithm]:
                continue
            if nccl:
                chosen = [(parse_setting("options.nccl_algorithm", PROG), None if algorithm == "auto" else algorithm)]
            elif algorithm in custom:  # one chunk-stream, as ASTRA-sim runs custom algorithms
                chosen = [(parse_setting(f"system.{KEYS[k]}-custom", PROG), [custom[algorithm]])
                          for k in usable[algorithm]] + [(parse_setting("system.preferred-dataset-splits", PROG), 1)]
            else:
                chosen = [(parse_setting(f"system.{KEYS[k]}", PROG), per_dim[algorithm]) for k in usable[algorithm]]
            if size is not None:
                chosen.append((parse_setting("workload.size", PROG), rank_bytes(args.collective, size,
                                                                                network.num_npus)))
            run_spec = resolve_run(base, chosen, os.getcwd())
            points.append(Point(len(points), str(len(points)), {"algorithm": algorithm, "size": size}, run_spec,
                                os.getcwd()))
    for reason in skipped:
        warn(f"skipped: {reason}")
    if not points:
        raise InputError("nothing to compare: " + "; ".join(skipped))
    model = f"nccl model, {args.hw_profile}" if nccl else args.backend
    print(f"{PROG}: {len(points)} simulations on {network.describe()}, {model}", file=sys.stderr)
    outcomes = {p.index: o for p, o in run_points(points, "local", jobs)}
    rows = [Row(p.settings["algorithm"], p.settings["size"], outcomes[p.index]) for p in points]
    _pass_on_warnings(rows, warn)
    for r in rows:
        others = sorted(set(_kinds(r)) - set(usable[r.algorithm]))
        if others:
            warn(f"{r.algorithm} does not implement {', '.join(others)}: those collectives of the workload ran with "
                 "the system's algorithms")
    title = (f"{args.collective} on {network.describe()}" if args.collective
             else f"{args.workload} on {network.describe()}") + f", {model}" + (f", {device}" if device else "")
    print(format_table(rows, title))
    if not nccl:
        print(f"(the network file's bandwidths: {NETWORK_GB})")
        fastest = max((r for r in rows if r.ok and r.metric("busbw_GBps")), default=None,
                      key=lambda r: r.metric("busbw_GBps"))
        if fastest is not None:
            size = f" at {size_label(fastest.size_bytes)}" if fastest.size_bytes is not None else ""
            note = above_links(f"{fastest.algorithm}{size}", fastest.metric("busbw_GBps"), args.backend,
                               list(network.bandwidth_GiBps))
            if note:
                print(note)
    if args.csv:
        write_csv(args.csv, rows, args.collective)
    if args.plot:
        plot(args.plot, rows, title, args.metric)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0 if all(r.ok for r in rows) else 1


def _pass_on_warnings(rows: list[Row], warn: Callable[[str], None]) -> None:
    """Each distinct warning of the runs once, naming the runs that gave it (they were dropped: a comparison of
    algorithms that all ran as one ring, or of compute timed at 1 ns, said nothing)."""
    runs: dict[str, list[str]] = {}
    for r in rows:
        label = r.algorithm + (f" at {size_label(r.size_bytes)}" if r.size_bytes is not None else "")
        for text in (r.outcome.get("warnings") or "").splitlines():
            runs.setdefault(text, []).append(label)
    for text, labels in runs.items():
        shown = "every run" if len(labels) == len(rows) else ", ".join(labels[:4]) + (
            f" and {len(labels) - 4} more" if len(labels) > 4 else "")
        warn(f"{shown}: {text}")


def check_nccl_algorithms(names: list[str]) -> None:
    from simulator.collectives.nccl import ALGORITHMS, algorithm_name

    for name in names:
        if name != "auto" and algorithm_name(name) is None:
            raise InputError(f"--algorithms {name!r}: with --collective-model nccl, valid: auto, "
                             f"{', '.join(ALGORITHMS)}")


def ran(row: Row) -> str:
    """What the nccl model ran for a row: algorithm/protocol x channels, the most frequent choice first."""
    choices = [c for k in json.loads(row.metric("collectives") or "[]") for c in k.get("choices", [])]
    return ", ".join(f"{c['algorithm']}/{c['protocol']} x{c['channels']}" for c in choices)


def rank_bytes(collective: str | None, size_bytes: int, ranks: int) -> int:
    """What each rank's trace node carries (comm_size) for nccl-tests' ``size_bytes``: all-gather's size is the
    gathered output, every other collective's the buffer each rank holds."""
    return size_bytes // ranks if collective == "all_gather" else size_bytes


def buffer_size(collective: str, size_bytes: int, ranks: int, warn: Callable[[str], None]) -> int:
    """``size_bytes`` as nccl-tests runs it: an all-gather's output rounded down to a multiple of the ranks."""
    if collective != "all_gather":
        return size_bytes
    if size_bytes < ranks:
        raise InputError(f"--sizes: an all_gather of {size_bytes} bytes over {ranks} ranks sends nothing per rank "
                         f"(the size is the gathered output; give at least {ranks} bytes)")
    rounded = size_bytes // ranks * ranks
    if rounded != size_bytes:
        warn(f"--sizes {size_label(size_bytes)}: all_gather over {ranks} ranks gathers {rounded} bytes "
             f"({rounded // ranks} per rank), as nccl-tests rounds")
    return rounded


def _kinds(row: Row) -> list[str]:
    return [c["kind"] for c in json.loads(row.metric("collectives") or "[]")]


def speedups(rows: list[Row]) -> dict[int, float]:
    """Per row (by position): the slowest time of its size over its own time."""
    slowest: dict[int | None, float] = {}
    for r in rows:
        if r.ok:
            slowest[r.size_bytes] = max(slowest.get(r.size_bytes, 0), r.time_ns)
    return {i: slowest[r.size_bytes] / r.time_ns for i, r in enumerate(rows) if r.ok and r.time_ns}


def format_table(rows: list[Row], title: str) -> str:
    up = speedups(rows)
    micro = rows[0].size_bytes is not None
    width = max(9, *(len(r.algorithm) for r in rows))
    head = f"{'size':>9}  " if micro else ""
    what = "time: per collective, mean over ranks (as nccl-tests)" if micro else "time: end to end"
    ran_by = {i: ran(r) for i, r in enumerate(rows) if r.ok}
    lines = [f"{title}; {what}; {BANDWIDTHS}",
             f"{head}{'algorithm':<{width}}  {'time':>12}  {'algbw (GB/s)':>12}  {'busbw (GB/s)':>12}  "
             f"{'speed-up':>8}" + ("" if micro else f"  {'exposed comm':>12}")
             + ("  ran (algorithm/protocol x channels)" if any(ran_by.values()) else "")]
    previous = object()
    for i, r in enumerate(rows):
        size = "" if r.size_bytes == previous else size_label(r.size_bytes) if micro else ""
        previous = r.size_bytes
        lead = f"{size:>9}  " if micro else ""
        if not r.ok:
            lines.append(f"{lead}{r.algorithm:<{width}}  failed: {(r.outcome['error'] or '').splitlines()[0]}")
            continue
        alg, bus = r.metric("algbw_GBps"), r.metric("busbw_GBps")
        lines.append(f"{lead}{r.algorithm:<{width}}  {format_ns(r.time_ns):>12}  "
                     + (f"{alg:>12.2f}  {bus:>12.2f}" if alg is not None else f"{'-':>12}  {'-':>12}")
                     + f"  {up.get(i, 0):>7.2f}x"
                     + ("" if micro else f"  {format_ns(r.metric('exposed_comm_ns_mean')):>12}")
                     + (f"  {ran_by[i]}" if ran_by[i] else ""))
    return "\n".join(lines)


def write_csv(path: str, rows: list[Row], collective: str | None = None) -> None:
    """The table as CSV: size_bytes is nccl-tests' size, rank_bytes what each rank's trace carries, bandwidths
    in GB/s (10^9 B/s); formula-like cells made inert."""
    up = speedups(rows)
    ranks = {r.metric("npus") for r in rows if r.ok}
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["algorithm", "size_bytes", "rank_bytes", "status", "time_ns", "finish_ns", "algbw_GBps",
                    "busbw_GBps", "speedup", "exposed_comm_ns_mean", "ran", "error"])
        for i, r in enumerate(rows):
            per_rank = None if r.size_bytes is None or len(ranks) != 1 else \
                rank_bytes(collective, r.size_bytes, next(iter(ranks)))
            w.writerow(inert_row([r.algorithm, r.size_bytes, per_rank, r.outcome["status"],
                                  r.time_ns if r.ok else None, r.metric("finish_ns"), r.metric("algbw_GBps"),
                                  r.metric("busbw_GBps"), up.get(i), r.metric("exposed_comm_ns_mean"),
                                  ran(r) if r.ok else None, r.outcome["error"]]))


def plot(path: str, rows: list[Row], title: str, metric: str) -> None:
    plt = pyplot("--plot")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ok = [r for r in rows if r.ok]
    if rows[0].size_bytes is None:  # one workload: a bar per algorithm
        values = [r.time_ns / 1e6 if metric == "time" else r.metric("busbw_GBps") or 0 for r in ok]
        ax.barh([r.algorithm for r in ok], values, color="#4477aa")
        ax.set_xlabel("end-to-end time (ms)" if metric == "time" else "bus bandwidth (GB/s, GB = 10^9 B)")
        ax.invert_yaxis()
    else:
        for algorithm in dict.fromkeys(r.algorithm for r in ok):
            mine = [r for r in ok if r.algorithm == algorithm]
            xs = [r.size_bytes for r in mine]
            ys = [r.time_ns / 1e3 if metric == "time" else r.metric("busbw_GBps") for r in mine]
            ax.plot(xs, ys, marker="o", label=algorithm)
        ax.set_xscale("log", base=2)
        sizes = sorted({r.size_bytes for r in ok})
        ax.set_xticks(sizes, [size_label(s) for s in sizes])
        if metric == "time":
            ax.set_yscale("log")
        ax.set_xlabel("message size")
        ax.set_ylabel("time (µs)" if metric == "time" else "bus bandwidth (GB/s, GB = 10^9 B)")
        ax.legend(title="algorithm")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
