"""The large runs of ../shared/reference/astra-sim-2x/README.md: CPU and wall time, peak memory, result.

    python benchmarks/large_runs.py [--only SUBSTRING] [--engine auto|message]

Each run executes the installed code in a fresh subprocess (so its peak RSS and CPU time, user + sys, are its
own) and is compared with what ASTRA-sim 2.x printed and how long it took on a 2-core machine (where its CPU and
wall time agree); the speed-up is on CPU time, which other work on a shared machine inflates less than wall.
Targets (issue 3): every run at least 10x faster than ASTRA-sim, with less memory, and the identical result.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from workload.schema import CollectiveType  # noqa: E402
from workload.tools.generate import RankTraces, collective, write_rank_traces  # noqa: E402

SYSTEM = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
          "preferred-dataset-splits": 4, "collective-optimization": "localBWAware", "local-mem-bw": 1600}
RING = ("Ring", 50.0, 500.0)
SWITCH_1D = ("Switch", 50.0, 500.0)
SWITCH_OUTER = ("Switch", 25.0, 1000.0)

# name, collective, bytes, dims [(topology, npus, GB/s, ns)], backend, ASTRA-sim result ns, wall s, RSS MB
RUNS = [
    ("all-reduce 1 GiB, 1024 NPUs, Ring, unaware", "all_reduce", 1 << 30, [(*RING[:1], 1024, *RING[1:])],
     "analytical-unaware", 46_129_156, 18.8, 365),
    ("all-reduce 1 GiB, 1024 NPUs, Ring, unaware, per-rank node ids", "all_reduce", 1 << 30,
     [(*RING[:1], 1024, *RING[1:])], "analytical-unaware", 46_129_156, 18.8, 365),
    ("all-reduce 1 GiB, 1024 NPUs, Ring, aware", "all_reduce", 1 << 30, [(*RING[:1], 1024, *RING[1:])],
     "analytical-aware", 46_129_156, 23.4, 366),
    ("all-reduce 1 GiB, 1024 NPUs, Switch, aware", "all_reduce", 1 << 30, [(*SWITCH_1D[:1], 1024, *SWITCH_1D[1:])],
     "analytical-aware", 90_175_444, 24.7, 365),
    ("all-reduce 1 MiB, 1024 NPUs, Ring, aware", "all_reduce", 1 << 20, [(*RING[:1], 1024, *RING[1:])],
     "analytical-aware", 4_206_616, 33.7, 366),
    ("all-reduce 1 GiB, 4096 NPUs, Ring x Switch 64x64, unaware", "all_reduce", 1 << 30,
     [(*RING[:1], 64, *RING[1:]), (*SWITCH_OUTER[:1], 64, *SWITCH_OUTER[1:])], "analytical-unaware",
     41_613_596, 27.6, 305),
    ("all-reduce 1 GiB, 4096 NPUs, Ring, unaware", "all_reduce", 1 << 30, [(*RING[:1], 4096, *RING[1:])],
     "analytical-unaware", 58_640_440, 621.9, 5600),
    ("all-reduce 1 GiB, 4096 NPUs, Switch, unaware", "all_reduce", 1 << 30, [(*SWITCH_1D[:1], 4096, *SWITCH_1D[1:])],
     "analytical-unaware", 75_020_440, 643.3, 5600),
    ("all-reduce 1 GiB, 4096 NPUs, Ring, aware", "all_reduce", 1 << 30, [(*RING[:1], 4096, *RING[1:])],
     "analytical-aware", 58_640_440, 898.8, 5600),
    ("all-to-all 1 MiB, 256 NPUs, Ring, ring algorithm, unaware", "all_to_all", 1 << 20,
     [(*RING[:1], 256, *RING[1:])], "analytical-unaware", 69_066_280, 44.6, 37),
    ("all-to-all 1 MiB, 256 NPUs, Switch, ring algorithm, aware", "all_to_all", 1 << 20,
     [(*SWITCH_1D[:1], 256, *SWITCH_1D[1:])], "analytical-aware", 136_826_920, 72.8, 37),
]
# Runs the command in the child and reports the child's own peak RSS (KiB) on its last stderr line. VmHWM, not
# ru_maxrss: Linux carries ru_maxrss over from the forking parent (this script, which has written the traces).
_CHILD = ("import sys; from simulator.cli import main; status = main(sys.argv[1:]); "
          "hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')]; "
          "print('peak RSS KiB', hwm[0], file=sys.stderr); sys.exit(status)")
BASELINE_MB = 0.0  # set in main()
KINDS = {"all_reduce": CollectiveType.ALL_REDUCE, "all_to_all": CollectiveType.ALL_TO_ALL}


def _own_ids(node: Any, rank: int) -> Any:
    node.id += 1000 * rank + 7
    node.name = f"{node.name}_rank{rank}"
    node.data_deps[:] = [d + 1000 * rank + 7 for d in node.data_deps]
    return node


def prepare(tmp: str, name: str, kind: str, size: int, dims: list[tuple[str, int, float, float]]) -> tuple[str, ...]:
    npus = 1
    for _, n, _, _ in dims:
        npus *= n
    slug = "".join(ch if ch.isalnum() else "_" for ch in name)
    prefix = os.path.join(tmp, slug, "trace")
    traces = collective(npus, KINDS[kind], size)
    if "per-rank node ids" in name:  # as per-rank exporters write them: each rank numbers and names its own nodes
        traces = RankTraces(npus, 1, lambda rank, k, base=traces: _own_ids(base.node(rank, k), rank))
    write_rank_traces(prefix, traces)
    network = os.path.join(tmp, slug, "network.yml")
    with open(network, "w") as f:
        f.write(f"topology: [ {', '.join(d[0] for d in dims)} ]\n")
        f.write(f"npus_count: [ {', '.join(str(d[1]) for d in dims)} ]\n")
        f.write(f"bandwidth: [ {', '.join(str(d[2]) for d in dims)} ]\n")
        f.write(f"latency: [ {', '.join(str(d[3]) for d in dims)} ]\n")
    system = os.path.join(tmp, slug, "system.json")
    algorithms = ["ring"] * len(dims)
    with open(system, "w") as f:
        json.dump({**SYSTEM, **{f"{k}-implementation": algorithms for k in
                                ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")}}, f)
    return prefix, network, system


def run_one(prefix: str, network: str, system: str, backend: str, engine: str) -> dict[str, object]:
    out = os.path.join(os.path.dirname(prefix), "result.json")
    cmd = [sys.executable, "-c", _CHILD, "--workload", prefix, "--network", network, "--system", system,
           "--backend", backend, "--engine", engine, "--json", out, "--quiet"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    rss = int(p.stderr.strip().splitlines()[-1].split()[-1])
    with open(out) as f:
        result = json.load(f)
    return {"finish_ns": result["finish_ns"], "wall_s": wall, "cpu_s": cpu, "rss_mb": rss / 1024,
            "engine": result["run"]["engine"], "same_on_all_ranks": len({r["finish_ns"] for r in result["ranks"]}) == 1}


def baseline_mb() -> float:
    """Peak RSS of a child that only imports the simulator: the floor under every run's memory."""
    code = ("import simulator.cli; print([l.split()[1] for l in open('/proc/self/status') "
            "if l.startswith('VmHWM')][0])")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO).stdout) / 1024


def main() -> None:
    global BASELINE_MB
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the runs whose name contains this")
    parser.add_argument("--engine", default="auto", choices=("auto", "message"))
    args = parser.parse_args()
    BASELINE_MB = baseline_mb()
    print(f"start-up: importing the simulator takes {BASELINE_MB:.0f} MB")
    failures = 0
    print(f"{'run':<60} {'result ns':>12} {'ASTRA-sim ns':>12} {'same':>5} {'CPU s':>6} {'wall s':>7} {'ASTRA s':>8} "
          f"{'speed-up':>8} {'RSS MB':>7} {'ASTRA MB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, kind, size, dims, backend, want, astra_s, astra_mb in RUNS:
            if args.only not in name:
                continue
            prefix, network, system = prepare(tmp, name, kind, size, dims)
            r = run_one(prefix, network, system, backend, args.engine)
            if "error" in r:
                failures += 1
                print(f"{name:<60} ERROR {r['error']}")
                continue
            missed = []
            if r["finish_ns"] != want:
                missed.append(f"result differs from ASTRA-sim's by {r['finish_ns'] - want:+,} ns")
            if r["cpu_s"] * 10 > astra_s:
                missed.append(f"{astra_s / r['cpu_s']:.1f}x faster, target 10x")
            if r["rss_mb"] >= astra_mb:
                missed.append(f"{r['rss_mb']:.0f} MB, not below ASTRA-sim's {astra_mb} MB (the interpreter with its "
                              f"libraries takes {BASELINE_MB:.0f} MB before any work)")
            failures += bool(missed)
            same = "yes" if r["finish_ns"] == want else "NO"
            print(f"{name:<60} {r['finish_ns']:>12,} {want:>12,} {same:>5} {r['cpu_s']:>6.2f} {r['wall_s']:>7.2f} "
                  f"{astra_s:>8.1f} {astra_s / r['cpu_s']:>7.0f}x {r['rss_mb']:>7.0f} {astra_mb:>8}"
                  + (f"   <- missed: {'; '.join(missed)}" if missed else ""))
    print("all targets met" if not failures else f"{failures} run(s) missed a target (reasons above)")


if __name__ == "__main__":
    main()
