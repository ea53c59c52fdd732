"""Our generated LLM traces, run unchanged by ASTRA-sim 2.x and by astrasim-py on the same files: per-rank numbers.

    python benchmarks/astrasim_interop.py --astra-sim DIR [--only NAME] [--keep DIR]

DIR holds ASTRA-sim's analytical binaries (AstraSim_Analytical_Congestion_Unaware / _Aware, as its
build/astra_analytical/build.sh writes them to build/bin); without --astra-sim the ASTRA_SIM_BIN environment
variable or PATH is searched, and the script says so and exits 0 when no binary is found. Each case writes a
trace set with `trace generate llm --groups-file` (communicator groups in <name>.comm_groups.json, pipeline
send/recv between stages, compute durations from the H100 roofline), then runs both simulators on the same
network, system, memory and comm-group files and prints, per backend, every rank's finish time and exposed
communication from both and whether they are identical. Times are CPU seconds (user + sys) of each run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARIES = {"analytical-unaware": "AstraSim_Analytical_Congestion_Unaware",
            "analytical-aware": "AstraSim_Analytical_Congestion_Aware"}
_ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
_FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles, exposed communication (\d+) cycles")

# name, `trace generate llm` flags, networks as [(topology, npus, GB/s, ns) per dimension]: ASTRA-sim's
# congestion-aware backend takes one-dimensional networks only, so each case has a 1-D network for both
# backends and a multi-dimensional one for the congestion-unaware backend
CASES = [
    ("GPT-3 1.3B, 2 layers, tp2 pp2 dp4 (16 ranks)",
     ["--preset", "gpt3-1.3b", "--layers", "2", "--tp", "2", "--pp", "2", "--dp", "4", "--micro-batches", "4",
      "--seq-len", "512"],
     [[("Ring", 4, 200, 100), ("Switch", 4, 50, 1000)], [("Switch", 16, 100, 500)]]),
    ("GPT-3 1.3B, 4 layers, tp4 pp2 dp4, sequence parallel, layout tp,pp,dp (32 ranks)",
     ["--preset", "gpt3-1.3b", "--layers", "4", "--tp", "4", "--pp", "2", "--dp", "4", "--micro-batches", "4",
      "--seq-len", "1024", "--sequence-parallel", "--layout", "tp,pp,dp"],
     [[("FullyConnected", 8, 150, 200), ("Switch", 4, 50, 1000)], [("Ring", 32, 100, 500)]]),
    ("Llama-3 8B, 4 layers, tp2 pp4 dp8, ZeRO-1 (64 ranks)",
     ["--preset", "llama3-8b", "--layers", "4", "--tp", "2", "--pp", "4", "--dp", "8", "--micro-batches", "4",
      "--seq-len", "1024", "--zero", "1"],
     [[("Switch", 8, 400, 500), ("Switch", 8, 50, 1000)], [("Switch", 64, 100, 500)]]),
    ("Mixtral 8x7B, 2 layers, tp2 pp2 dp4 ep4 (16 ranks, all-to-all)",
     ["--preset", "mixtral-8x7b", "--layers", "2", "--tp", "2", "--pp", "2", "--dp", "4", "--ep", "4",
      "--micro-batches", "2", "--seq-len", "512"],
     [[("Ring", 4, 200, 100), ("Switch", 4, 50, 1000)], [("Switch", 16, 100, 500)]]),
    ("Llama-3 8B, 8 layers, tp2 pp2 vp2 cp2 dp2, sequence parallel, TP overlap, distributed optimizer with "
     "Megatron buckets and overlap, FP8, selective recompute, iteration tail (16 ranks: ring attention, "
     "tensor-parallel ring exchange, host nodes)",
     ["--preset", "llama3-8b", "--layers", "8", "--tp", "2", "--pp", "2", "--vp", "2", "--cp", "2", "--dp", "2",
      "--micro-batches", "4", "--seq-len", "2048", "--sequence-parallel", "--tp-comm-overlap",
      "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size",
      "megatron", "--precision", "fp8", "--recompute", "selective", "--iteration-tail", "--dataloader-wait-us", "5"],
     [[("Ring", 4, 200, 100), ("Switch", 4, 50, 1000)], [("Switch", 16, 100, 500)]]),
    ("Llama-3 8B, 2 layers, tp2 pp2 dp4, distributed optimizer, iteration tail (16 ranks: the gradient-norm "
     "all-reduce over every rank follows different numbers of group collectives on the two stages)",
     ["--preset", "llama3-8b", "--layers", "2", "--tp", "2", "--pp", "2", "--dp", "4", "--micro-batches", "1",
      "--seq-len", "512", "--use-distributed-optimizer", "--iteration-tail"],
     [[("Ring", 4, 200, 100), ("Switch", 4, 50, 1000)], [("Switch", 16, 100, 500)]]),
    ("GPT-3 1.3B, 4 layers, tp2 cp2 dp4, all-gather context parallelism, FSDP as Llama 3 (16 ranks)",
     ["--preset", "gpt3-1.3b", "--layers", "4", "--tp", "2", "--cp", "2", "--dp", "4", "--micro-batches", "2",
      "--seq-len", "1024", "--cp-comm-type", "all_gather", "--zero", "3", "--no-reshard-after-forward",
      "--fsdp-grad-sync", "last", "--grad-reduce-in-fp32"],
     [[("FullyConnected", 4, 150, 200), ("Switch", 4, 50, 1000)], [("Ring", 16, 100, 500)]]),
]


def find_binaries(given: str | None) -> dict[str, str]:
    """{backend: binary path} found in ``given`` (a folder or one binary), $ASTRA_SIM_BIN, or on PATH."""
    places = [p for p in (given, os.environ.get("ASTRA_SIM_BIN")) if p]
    found: dict[str, str] = {}
    for backend, name in BINARIES.items():
        for place in places:
            candidate = place if os.path.basename(place) == name else os.path.join(place, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                found[backend] = candidate
                break
        else:
            on_path = shutil.which(name)
            if on_path:
                found[backend] = on_path
    return found


def write_inputs(folder: str, network: list[tuple[str, int, float, float]]) -> tuple[str, str, str]:
    """ASTRA-sim's network YAML, system JSON and memory JSON for a network: ring collectives in every dimension
    (direct all-to-all), LIFO, 4 splits."""
    dims = len(network)
    net = os.path.join(folder, "network.yml")
    with open(net, "w", encoding="utf-8") as f:
        for key, k in (("topology", 0), ("npus_count", 1), ("bandwidth", 2), ("latency", 3)):
            f.write(f"{key}: [ {', '.join(str(d[k]) for d in network)} ]\n")
    system = os.path.join(folder, "system.json")
    with open(system, "w", encoding="utf-8") as f:
        json.dump({"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
                   "preferred-dataset-splits": 4, "all-reduce-implementation": ["ring"] * dims,
                   "all-gather-implementation": ["ring"] * dims, "reduce-scatter-implementation": ["ring"] * dims,
                   "all-to-all-implementation": ["direct"] * dims, "collective-optimization": "localBWAware",
                   "local-mem-bw": 1600}, f)
    memory = os.path.join(folder, "memory.json")
    with open(memory, "w", encoding="utf-8") as f:
        json.dump({"memory-type": "NO_MEMORY_EXPANSION"}, f)
    return net, system, memory


def run(cmd: list[str], cwd: str) -> tuple[dict[int, tuple[int, int]], float, str]:
    """Run one simulator in ``cwd`` (ASTRA-sim writes log/ there): ({rank: (finish ns, exposed communication
    ns)}, CPU seconds, the end of its output)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=_ENV)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    text = done.stdout + done.stderr
    ranks = {int(r): (int(t), int(e)) for r, t, e in _FINISHED.findall(text)}
    tail = text.strip().splitlines()[-1][-300:] if text.strip() else "(no output)"
    if ranks and done.returncode:  # every result printed, then a crash (e.g. ASTRA-sim's heap error at exit)
        tail = f"exit status {done.returncode} after its results: {tail}"
    return ranks, cpu, tail


def summary(ranks: dict[int, tuple[int, int]]) -> str:
    """'finish / exposed ns x count' per distinct result."""
    counts = collections.Counter(ranks.values())
    return "; ".join(f"{t:,} / {e:,} ns x{n}" for (t, e), n in sorted(counts.items()))


def compare_case(name: str, flags: list[str], networks: list[list[tuple[str, int, float, float]]],
                 binaries: dict[str, str], work: str) -> bool:
    """Generate one trace set and run it on every network and backend; True when every run matches."""
    out = os.path.join(work, "traces")
    gen = subprocess.run([sys.executable, "-m", "simulator.cli", "trace", "generate", "llm", *flags, "--device",
                          "H100", "--groups-file", "-o", out], capture_output=True, text=True, cwd=REPO, env=_ENV)
    if gen.returncode:
        print(f"  generate failed: {gen.stderr.strip()[-300:]}")
        return False
    prefix = gen.stdout.split()[0]  # the trace prefix; the groups file follows it
    groups = f"{prefix}.comm_groups.json"
    all_equal = True
    for network in networks:
        folder = tempfile.mkdtemp(dir=work)
        net, system, memory = write_inputs(folder, network)
        shape = " x ".join(f"{t}({n}, {bw} GB/s, {lat} ns)" for t, n, bw, lat in network)
        for backend, binary in binaries.items():
            if backend == "analytical-aware" and len(network) > 1:
                continue  # ASTRA-sim's congestion-aware backend: one-dimensional networks only
            theirs, their_cpu, their_tail = run([
                binary, f"--workload-configuration={prefix}", f"--system-configuration={system}",
                f"--network-configuration={net}", f"--remote-memory-configuration={memory}",
                f"--comm-group-configuration={groups}"], folder)
            ours, our_cpu, our_tail = run([
                sys.executable, "-m", "simulator.cli", "--workload", prefix, "--network", net, "--system", system,
                "--memory", memory, "--comm-groups", groups, "--backend", backend, "--format", "astra-sim"], folder)
            equal = bool(theirs) and theirs == ours
            all_equal &= equal
            print(f"  {backend:<19} {shape}")
            for who, ranks, cpu, tail in (("ASTRA-sim  ", theirs, their_cpu, their_tail),
                                          ("astrasim-py", ours, our_cpu, our_tail)):
                print(f"    {who} {summary(ranks) or 'no result: ' + tail}   ({cpu:.2f} s CPU)")
                if ranks and tail.startswith("exit status"):
                    print(f"      then {tail}")
            print(f"    {'identical on every rank' if equal else 'DIFFERENT'}")
    return all_equal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--astra-sim", metavar="DIR", help="folder of ASTRA-sim's analytical binaries")
    parser.add_argument("--only", help="run only the cases whose name contains this text")
    parser.add_argument("--keep", metavar="DIR", help="keep the generated traces and inputs in DIR")
    args = parser.parse_args(argv)
    binaries = find_binaries(args.astra_sim)
    if not binaries:
        print("no ASTRA-sim binary found (give --astra-sim DIR or set ASTRA_SIM_BIN): nothing to compare")
        return 0
    work = args.keep or tempfile.mkdtemp(prefix="astrasim-interop-")
    os.makedirs(work, exist_ok=True)
    ok = True
    try:
        for i, (name, flags, networks) in enumerate(CASES):
            if args.only and args.only not in name:
                continue
            print(name)
            ok &= compare_case(name, flags, networks, binaries, os.path.join(work, f"case{i}"))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("all identical" if ok else "some runs differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
