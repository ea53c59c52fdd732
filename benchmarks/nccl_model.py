"""The NCCL-like collective model in simulations (--collective-model nccl): what timing a collective costs, and
a 1,024-rank LLM trace simulated with the astra-sim model vs the nccl model.

    python benchmarks/nccl_model.py [--layers N] [--skip-llm]

Figures: planning one collective (the library's choice and its calibrated time) with the plan cached, for a
size not planned before (the communicator's size-independent terms cached) and cold (a new model); one
collective through the run's rendezvous and flow scheduler (8 members issue it, latency, transfer, completion
on every member); then the CPU time of Llama-3 70B (dp 16, tp 8, pp 8, ZeRO 1, sequence parallel; N layers)
on 1,024 ranks with each model, each in a fresh subprocess, and the nccl run's slowdown (negative: faster).
Also 4 all-reduces on 1,024 ranks under the nccl model with one representative rank vs every rank simulated.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from simulator.collectives.hardware import load_profile  # noqa: E402
from simulator.collectives.nccl import CollectiveModel, Communicator  # noqa: E402
from simulator.engine import Engine  # noqa: E402
from simulator.nccl_run import NcclRun  # noqa: E402

PROFILE = "hgx-h200"
NETWORK = "topology: [Switch, Switch]\nnpus_count: [8, 128]\nbandwidth: [400, 50]\nlatency: [500, 1000]\n"
LLM = ["--preset", "llama3-70b", "--dp", "16", "--tp", "8", "--pp", "8", "--zero", "1", "--sequence-parallel",
       "--device", "H100"]


def per_call_us(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    for i in range(calls):
        fn(i)
    return (time.process_time() - start) / calls * 1e6


def planning() -> None:
    profile = load_profile(PROFILE)
    model = CollectiveModel(profile)
    comms = [Communicator.of(range(8), 8), Communicator.of(range(0, 1024, 8), 8), Communicator.of(range(64), 8)]
    for comm in comms:
        model.plan("all_reduce", 1 << 26, comm)
    cached = per_call_us(lambda i: model.plan("all_reduce", 1 << 26, comms[i % 3]), 100_000)
    new_size = per_call_us(lambda i: model.plan("all_reduce", 4096 + 64 * i, comms[i % 3]), 3_000)

    def cold(i: int) -> None:
        CollectiveModel(profile).plan("all_reduce", 1 << 26, comms[i % 3])

    fresh = per_call_us(cold, 300)
    print(f"plan one collective (all-reduce; 8 GPUs / 128 nodes / 64 GPUs on 8 nodes, {PROFILE}):")
    print(f"  cached                              {cached:8.2f} us")
    print(f"  uncached size (communicator known)  {new_size:8.2f} us")
    print(f"  cold (a new model, nothing cached)  {fresh:8.2f} us")

    print("one collective through the run (8 members issue it, rendezvous, latency, shared transfer, completion):")
    print(f"  planned before                      {through_run(profile, False, 20_000):8.2f} us")
    print(f"  a new size each time                {through_run(profile, True, 3_000):8.2f} us")


def through_run(profile: object, new_sizes: bool, calls: int) -> float:
    """Microseconds per collective issued by 8 members and run to completion in a bare engine."""
    engine = Engine()
    run = NcclRun(engine, profile, 8, range(8))  # type: ignore[arg-type]
    members = tuple(range(8))

    def issue(i: int) -> None:
        size = (1 << 26) + 64 * i if new_sizes else 1 << 26
        for r in members:
            run.issue(r, 0, members, "all_reduce", size, _done, None, str)
        engine.run()

    issue(-1)
    return per_call_us(issue, calls)


def _done(arg: object, chosen: object) -> None:
    pass


def simulate(argv: list[str]) -> tuple[float, str]:
    """CPU seconds (user + sys) of ``python -m simulator ARGV`` in a fresh process, and its first output line."""
    env = dict(os.environ, PYTHONPATH=REPO)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-m", "simulator", *argv, "--quiet"], capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"simulation failed: {p.stderr.strip()}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, p.stdout.splitlines()[0]


def llm(layers: int) -> None:
    with tempfile.TemporaryDirectory(prefix="nccl-bench-") as tmp:
        out = os.path.join(tmp, "llm")
        p = subprocess.run([sys.executable, "-m", "simulator", "trace", "generate", "llm", *LLM, "--layers",
                            str(layers), "--global-batch", "64", "-o", out], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=REPO), check=True)
        prefix = p.stdout.splitlines()[0]
        network = os.path.join(tmp, "network.yml")
        with open(network, "w") as f:
            f.write(NETWORK)
        print(f"Llama-3 70B, {layers} layers, 1,024 ranks (dp16 tp8 pp8, ZeRO 1, SP, 4 micro-batches), 8 x 128 "
              "switches:")
        base = ["--workload", prefix, "--network", network]
        astra_cpu, astra_line = simulate(base)
        print(f"  astra-sim model  {astra_cpu:8.1f} s CPU    {astra_line}", flush=True)
        nccl_cpu, nccl_line = simulate([*base, "--collective-model", "nccl", "--hw-profile", PROFILE])
        print(f"  nccl model       {nccl_cpu:8.1f} s CPU    {nccl_line}")
        print(f"  slowdown of the nccl model: {100 * (nccl_cpu / astra_cpu - 1):+.1f}% (target: at most +10%)")


def engines() -> None:
    """The representative-rank engine under the nccl model, against simulating every rank."""
    with tempfile.TemporaryDirectory(prefix="nccl-bench-") as tmp:
        p = subprocess.run([sys.executable, "-m", "simulator", "trace", "generate", "collective", "--type",
                            "all_reduce", "--size", "1GiB", "--npus", "1024", "--repeat", "4", "-o", tmp],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), check=True)
        network = os.path.join(tmp, "network.yml")
        with open(network, "w") as f:
            f.write(NETWORK)
        base = ["--workload", p.stdout.splitlines()[0], "--network", network, "--collective-model", "nccl",
                "--hw-profile", PROFILE]
        print("4 all-reduces of 1 GiB on 1,024 ranks, nccl model:")
        for engine in ("symmetric", "message"):
            cpu, line = simulate([*base, "--engine", engine])
            print(f"  --engine {engine:<9} {cpu:6.2f} s CPU    {line}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16, help="transformer layers of the LLM trace (default 16)")
    p.add_argument("--skip-llm", action="store_true", help="only the planning figures")
    args = p.parse_args()
    planning()
    engines()
    if not args.skip_llm:
        llm(args.layers)


if __name__ == "__main__":
    main()
