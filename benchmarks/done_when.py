"""Issue 13's "done when" figures in one table, each beside the ASTRA-sim time it compares to.

    python benchmarks/done_when.py [--astra-sim DIR] [--stg-trace PREFIX --stg-groups FILE] [--full]
                                   [--base DIR] [--repeat N] [--cold]

Rows (``--full`` adds the long ones: minutes each):

* 1 GiB all-reduce on a 1,024-NPU ring whose traces number their own nodes: exact (46,129,156 ns), >= 10x
  faster than ASTRA-sim;
* the shared 8-layer GPT case (symbolic_tensor_graph's trace, dp2 tp2 pp2) on both analytical backends: exact
  (its expected.json), >= 10x faster than ASTRA-sim with track-local-mem off;
* the 80-layer sibling (dp8 tp8 pp4, 256 NPUs, one Switch): symbolic_tensor_graph's trace when given
  (``--stg-trace``; benchmarks/message_engine.py says how to make it), exact against ASTRA-sim where a binary
  is given, and this code base's generated equivalent (``generate: llm``, no files);
* Llama-3 405B as published for 16,384 H100s (tp8 pp16 dp128, sequence 8,192), generated in memory: < 60 s,
  < 4 GB; ``--full``: the same layout at dp 8 (1,024 ranks) equals the message engine rank by rank;
* ``--full``: the 200-layout GPT-3 175B sweep with --jobs 2 (benchmarks/layout_sweep.py) in < 10 minutes;
* ``--base DIR``: the message engine's speed-up per message on the 80-layer iteration against the code in DIR
  (benchmarks/message_engine.py; issue 13 compares with commit fdf1792).

ASTRA-sim times are measured in this run when ``--astra-sim DIR`` (or $ASTRA_SIM_BIN) holds its
AstraSim_Analytical_Congestion_{Unaware,Aware} binaries: CPU seconds (user + sys) of both programs, on the same
files. Otherwise they are the wall-clock times of ../shared/reference/astra-sim-2x/README.md (a quiet 2-core
machine, where CPU and wall time agree for both single-threaded programs).

Ours: CPU seconds of a fresh process, start-up and imports included; each file-based row, and the generated
80-layer one, is the median of ``--repeat`` runs (3). The children read compiled modules, as an installed copy
does (pip compiles at install); ``--cold`` runs a copy of the code without bytecode under
PYTHONDONTWRITEBYTECODE, so that every run compiles this code base's modules (what a fresh checkout costs in an
environment that sets it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

import large_runs  # noqa: E402

REFERENCE = os.path.join(REPO, "..", "shared", "reference", "astra-sim-2x")
STG_CASE = os.path.join(REFERENCE, "cases", "stg-gpt-dp2tp2pp2-L8-{}")
# ../shared/reference/astra-sim-2x/README.md: ASTRA-sim's wall seconds on a 2-core machine
README_S = {"allreduce": 18.8, "gpt80": 18.5}
_CHILD = ("import os, sys; from simulator.cli import main; status = main(sys.argv[1:]); t = os.times(); "
          "hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')]; "
          "print('cpu-s', t.user + t.system, 'rss-KiB', hwm[0], file=sys.stderr); sys.exit(status)")
NET_256 = "topology: [ Switch ]\nnpus_count: [ 256 ]\nbandwidth: [ 400.0 ]\nlatency: [ 936.25 ]\n"
GPT80 = {"num_layers": 80, "hidden_size": 8192, "num_heads": 64, "ffn_hidden_size": 32768, "vocab_size": 51200,
         "seq_len": 2048, "tp": 8, "pp": 4, "dp": 8, "global_batch": 64}
LLAMA405 = {"preset": "llama3-405b", "tp": 8, "pp": 16, "seq_len": 8192, "micro_batch_size": 1}
LLAMA405_NET = [("Switch", 8, 450, 500), ("Switch", None, 50, 2000)]
# the children run as an installed copy does: pip compiles its modules at install, so a run reads bytecode
# (PYTHONDONTWRITEBYTECODE in this environment would make every child compile every module again; --cold does so)
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
CHILD_CWD = REPO  # where the children import the code from
PACKAGES = ("compute", "configs", "network", "simulator", "workload")
REPEAT = 3  # runs of each file-based row (--repeat)
BINARIES = {"analytical-unaware": "AstraSim_Analytical_Congestion_Unaware",
            "analytical-aware": "AstraSim_Analytical_Congestion_Aware"}


def ours(args: list[str], out: str, repeat: int = 1) -> dict:
    """Run this checkout's CLI in ``repeat`` fresh processes: the median CPU seconds, the largest peak RSS, the
    JSON result (the children read compiled modules, or with --cold compile this code base's in every run)."""
    runs = []
    for _ in range(repeat):
        p = subprocess.run([sys.executable, "-c", _CHILD, *args, "--json", out, "--quiet"], capture_output=True,
                           text=True, cwd=CHILD_CWD, env=CHILD_ENV)
        if p.returncode != 0:
            return {"error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]}
        last = p.stderr.strip().splitlines()[-1].split()
        runs.append((float(last[1]), int(last[3]) / 1024))
    with open(out) as f:
        return {"cpu_s": statistics.median(c for c, _ in runs), "rss_mb": max(m for _, m in runs),
                "result": json.load(f), "runs": len(runs)}


def astra(folder: str | None, backend: str, workload: str, system: str, network: str, memory: str,
          groups: str | None) -> dict | None:
    """Run ASTRA-sim (when its binaries are in ``folder``): CPU seconds and each rank's (finish, exposed) ns."""
    if not folder:
        return None
    binary = os.path.join(folder, BINARIES[backend])
    if not os.access(binary, os.X_OK):
        return None
    cmd = [binary, f"--workload-configuration={workload}", f"--system-configuration={system}",
           f"--network-configuration={network}", f"--remote-memory-configuration={memory}"]
    if groups:
        cmd.append(f"--comm-group-configuration={groups}")
    scratch = tempfile.mkdtemp(prefix="astra-sim-")  # it writes log/ where it runs
    try:
        with open(os.path.join(scratch, "out.txt"), "w") as log:
            started = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=scratch)
            _, _, usage = os.wait4(p.pid, 0)
            wall = time.perf_counter() - started
        with open(os.path.join(scratch, "out.txt")) as log:
            text = log.read()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ranks = {int(r): (int(f), int(e)) for r, f, e in
             re.findall(r"sys\[(\d+)\] finished, (\d+) cycles, exposed communication (\d+) cycles", text)}
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall, "ranks": ranks}


def same_as(result: dict, ranks: dict[int, tuple[int, int]]) -> bool:
    mine = {r["rank"]: (r["finish_ns"], r["exposed_comm_ns"]) for r in result["ranks"]}
    return bool(ranks) and mine == ranks


class Table:
    def __init__(self) -> None:
        self.missed = 0
        print(f"{'figure':<62} {'result':>16} {'ours s':>7} {'RSS MB':>7} {'ASTRA s':>8} {'source':>8} "
              f"{'speed-up':>8}  target")

    def row(self, name: str, r: dict, exact: bool | None, astra_s: float | None, source: str, target: str,
            met: bool, result_text: str | None = None) -> None:
        if "error" in r:
            self.missed += 1
            print(f"{name:<62} ERROR {r['error']}", flush=True)
            return
        self.missed += not met
        finish = result_text or f"{r['result']['finish_ns']:,}"
        finish += "" if exact is None else " =" if exact else " !="
        ratio = f"{astra_s / r['cpu_s']:.1f}x" if astra_s else "-"
        print(f"{name:<62} {finish:>16} {r['cpu_s']:>7.2f} {r['rss_mb']:>7.0f} "
              f"{f'{astra_s:.1f}' if astra_s else '-':>8} {source:>8} {ratio:>8}  {target}: "
              f"{'met' if met else 'MISSED'}", flush=True)


def compare(a: dict | None, readme_s: float | None) -> tuple[float | None, str]:
    if a is not None:
        return a["cpu_s"], "measured"
    return readme_s, "README" if readme_s else "-"


def allreduce_row(table: Table, tmp: str, bins: str | None) -> None:
    name = "all-reduce 1 GiB, 1024 NPUs, Ring, unaware, per-rank node ids"
    run = next(r for r in large_runs.RUNS if r[0] == name)
    prefix, network, system = large_runs.prepare(tmp, name, run[1], run[2], run[3])
    memory = os.path.join(tmp, "memory.json")
    with open(memory, "w") as f:
        json.dump({"memory-type": "NO_MEMORY_EXPANSION"}, f)
    r = ours(["--workload", prefix, "--network", network, "--system", system], os.path.join(tmp, "ar.json"), REPEAT)
    a = astra(bins, "analytical-unaware", prefix, system, network, memory, None)
    astra_s, source = compare(a, README_S["allreduce"])
    exact = "error" not in r and r["result"]["finish_ns"] == 46_129_156
    if a is not None and "error" not in r:
        exact = exact and same_as(r["result"], a["ranks"])
    met = exact and astra_s is not None and astra_s >= 10 * r.get("cpu_s", 1e9)
    table.row("1 GiB all-reduce, 1,024-NPU ring, per-rank node ids", r, exact, astra_s, source,
              "exact, >= 10x", met)


def stg8_rows(table: Table, tmp: str, bins: str | None) -> None:
    for short, backend in (("unaware", "analytical-unaware"), ("aware", "analytical-aware")):
        case = STG_CASE.format(short)
        with open(os.path.join(case, "system.json")) as f:
            system = json.load(f)
        system["track-local-mem"] = 0  # no effect on timing; ASTRA-sim is ~10x slower with it on
        path = os.path.join(tmp, f"stg8.{short}.system.json")
        with open(path, "w") as f:
            json.dump(system, f)
        with open(os.path.join(case, "expected.json")) as f:
            expected = Counter({(e["finish_ns"], e["exposed_comm_ns"]): e["ranks"]
                                for e in json.load(f)["expect"]})
        args = ["--workload", os.path.join(case, "workload", "trace"), "--network", os.path.join(case, "network.yml"),
                "--system", path, "--memory", os.path.join(case, "memory.json"), "--comm-groups",
                os.path.join(case, "comm_groups.json"), "--backend", backend]
        r = ours(args, os.path.join(tmp, f"stg8.{short}.json"), REPEAT)
        a = astra(bins, backend, os.path.join(case, "workload", "trace"), path, os.path.join(case, "network.yml"),
                  os.path.join(case, "memory.json"), os.path.join(case, "comm_groups.json"))
        exact = "error" not in r and Counter(
            (x["finish_ns"], x["exposed_comm_ns"]) for x in r["result"]["ranks"]) == expected
        astra_s, source = compare(a, None)
        met = exact and (astra_s is None or astra_s >= 10 * r.get("cpu_s", 1e9))
        table.row(f"GPT 8 layers (shared case), 8 NPUs, {short}", r, exact, astra_s, source,
                  "exact, >= 10x" if astra_s else "exact", met)


def stg80_rows(table: Table, tmp: str, bins: str | None, trace: str, groups: str) -> None:
    network = os.path.join(tmp, "net256.yml")
    with open(network, "w") as f:
        f.write(NET_256)
    with open(STG_CASE.format("unaware") + "/system.json") as f:
        system = json.load(f)
    system["track-local-mem"] = 0
    system_path = os.path.join(tmp, "stg80.system.json")
    with open(system_path, "w") as f:
        json.dump(system, f)
    memory = os.path.join(STG_CASE.format("unaware"), "memory.json")
    for short, backend in (("unaware", "analytical-unaware"), ("aware", "analytical-aware")):
        r = ours(["--workload", trace, "--comm-groups", groups, "--network", network, "--system", system_path,
                  "--memory", memory, "--backend", backend], os.path.join(tmp, f"stg80.{short}.json"), REPEAT)
        a = astra(bins, backend, trace, system_path, network, memory, groups)
        astra_s, source = compare(a, README_S["gpt80"] if short == "unaware" else None)
        exact = None if a is None or "error" in r else same_as(r["result"], a["ranks"])
        met = exact is not False and astra_s is not None and astra_s >= 10 * r.get("cpu_s", 1e9)
        table.row(f"GPT 80 layers dp8 tp8 pp4, 256 NPUs, STG trace, {short}", r, exact, astra_s, source,
                  "exact, >= 10x", met)


def generated(tmp: str, name: str, spec: dict, dims: list, engine: str = "auto", repeat: int = 1) -> dict:
    workload = os.path.join(tmp, f"{name}.yaml")
    with open(workload, "w") as f:
        json.dump({"generate": "llm", **spec}, f)
    network = os.path.join(tmp, f"{name}.net.yml")
    with open(network, "w") as f:
        json.dump({"topology": [d[0] for d in dims], "npus_count": [d[1] for d in dims],
                   "bandwidth": [d[2] for d in dims], "latency": [d[3] for d in dims]}, f)
    return ours(["--workload", workload, "--network", network, "--device", "H100", "--engine", engine],
                os.path.join(tmp, f"{name}.{engine}.json"), repeat)


def llm_rows(table: Table, tmp: str, full: bool) -> None:
    r = generated(tmp, "gpt80", GPT80, [("Switch", 256, 400, 500)], repeat=REPEAT)
    table.row("GPT 80 layers dp8 tp8 pp4, 256 NPUs, generated (no files)", r, None, README_S["gpt80"], "README",
              ">= 10x (ASTRA-sim's time on its own trace)", "error" not in r and r["cpu_s"] * 10 <= README_S["gpt80"])
    dims = [(t, n if n else 2048, bw, lat) for t, n, bw, lat in LLAMA405_NET]
    r = generated(tmp, "llama405_16k", {**LLAMA405, "dp": 128, "global_batch": 2048}, dims)
    table.row("Llama-3 405B, 16,384 ranks (tp8 pp16 dp128), generated", r, None, None, "-", "< 60 s, < 4 GB",
              "error" not in r and r["cpu_s"] < 60 and r["rss_mb"] < 4096)
    if not full:
        return
    dims = [(t, n if n else 128, bw, lat) for t, n, bw, lat in LLAMA405_NET]
    spec = {**LLAMA405, "dp": 8, "global_batch": 128}
    fast = generated(tmp, "llama405_1k", spec, dims)
    slow = generated(tmp, "llama405_1k", spec, dims, engine="message")
    same = "error" not in fast and "error" not in slow and fast["result"]["ranks"] == slow["result"]["ranks"]
    text = None if "error" in slow else f"msg eng {slow['cpu_s']:.0f} s"
    table.row("Llama-3 405B, 1,024 ranks (dp 8): quotient = message engine", fast, same, None, "-",
              "identical per rank", same, text)


def sweep_row(table: Table) -> None:
    started = time.perf_counter()
    p = subprocess.run([sys.executable, os.path.join(HERE, "layout_sweep.py"), "--points", "200", "--jobs", "2"],
                       capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - started
    r = {"cpu_s": wall, "rss_mb": 0.0, "result": {"finish_ns": 0}} if p.returncode == 0 else {
        "error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]}
    table.row("GPT-3 175B layout sweep, 200 points, --jobs 2 (wall s)", r, None, None, "-", "< 600 s wall",
              p.returncode == 0 and wall < 600, "200 points")


def message_engine_row(base: str, trace: str | None, groups: str | None) -> int:
    cmd = [sys.executable, os.path.join(HERE, "message_engine.py"), "--base", base]
    if trace:
        cmd += ["--trace", trace] + (["--comm-groups", groups] if groups else [])
    print("\nmessage engine (benchmarks/message_engine.py, target >= 2x per message):", flush=True)
    return subprocess.run(cmd, cwd=REPO).returncode


def main() -> int:
    global REPEAT, CHILD_CWD
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--astra-sim", default=os.environ.get("ASTRA_SIM_BIN"),
                        help="folder of ASTRA-sim's analytical binaries (default: $ASTRA_SIM_BIN)")
    parser.add_argument("--stg-trace", help="symbolic_tensor_graph's 80-layer dp8 tp8 pp4 trace prefix")
    parser.add_argument("--stg-groups", help="its communicator groups (JSON)")
    parser.add_argument("--full", action="store_true", help="also the long rows (message engine at 1,024 ranks, "
                                                            "the 200-point sweep)")
    parser.add_argument("--base", help="an earlier checkout: the message engine's speed-up per message")
    parser.add_argument("--repeat", type=int, default=REPEAT, help="runs of each file-based row and of the "
                                                                   "generated 80-layer one, median CPU time "
                                                                   f"(default {REPEAT})")
    parser.add_argument("--cold", action="store_true", help="children compile this code base's modules in every "
                                                            "run (a fresh checkout with PYTHONDONTWRITEBYTECODE)")
    args = parser.parse_args()
    REPEAT = max(1, args.repeat)
    if args.cold:  # a copy of the code without bytecode, none written: each child compiles this code base's modules
        CHILD_CWD = tempfile.mkdtemp(prefix="astrasim-py-cold-")
        for name in PACKAGES:
            shutil.copytree(os.path.join(REPO, name), os.path.join(CHILD_CWD, name),
                            ignore=shutil.ignore_patterns("__pycache__"))
        CHILD_ENV["PYTHONDONTWRITEBYTECODE"] = "1"
    else:  # compile once, as an install does, so that no row pays for it
        subprocess.run([sys.executable, "-c", "import simulator.cli"], cwd=REPO, env=CHILD_ENV, check=False)
    print(f"ASTRA-sim: {'binaries in ' + args.astra_sim if args.astra_sim else 'times from the reference README'}; "
          f"ours: CPU s (user + sys) of a fresh process, start-up included, median of {REPEAT} runs for the "
          f"file-based rows and the generated 80-layer one, "
          f"{'modules compiled in each run' if args.cold else 'modules compiled beforehand'}")
    table = Table()
    with tempfile.TemporaryDirectory() as tmp:
        allreduce_row(table, tmp, args.astra_sim)
        stg8_rows(table, tmp, args.astra_sim)
        if args.stg_trace:
            stg80_rows(table, tmp, args.astra_sim, args.stg_trace, args.stg_groups or "")
        llm_rows(table, tmp, args.full)
        if args.full:
            sweep_row(table)
    if args.cold:
        shutil.rmtree(CHILD_CWD, ignore_errors=True)
    failed = table.missed
    if args.base:
        failed += message_engine_row(args.base, args.stg_trace, args.stg_groups) != 0
    print("every figure met" if not failed else f"{failed} figure(s) missed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
