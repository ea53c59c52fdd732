"""Generating and simulating LLM training traces: CPU time (user + sys), nodes, bytes written, simulated iteration.

    python benchmarks/llm_traces.py [--skip-simulation]

Cases: Llama-3 8B on 128 ranks (dp 8, tp 4, pp 4), Llama-3 70B on 1,024 ranks (dp 16, tp 8, pp 8, ZeRO 1,
sequence parallel), GPT-3 175B on 1,024 ranks (dp 8, tp 8, pp 16). Each generation runs in a child process so
its peak RSS is its own; the first case is also simulated (roofline on H100 figures) to show the whole path.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = [
    ("llama3-8b, 128 ranks (dp8 tp4 pp4)", ["--preset", "llama3-8b", "--dp", "8", "--tp", "4", "--pp", "4",
                                             "--global-batch", "64"]),
    ("llama3-70b, 1024 ranks (dp16 tp8 pp8, ZeRO 1, SP)", ["--preset", "llama3-70b", "--dp", "16", "--tp", "8",
                                                           "--pp", "8", "--global-batch", "128", "--zero", "1",
                                                           "--sequence-parallel"]),
    ("gpt3-175b, 1024 ranks (dp8 tp8 pp16)", ["--preset", "gpt3-175b", "--dp", "8", "--tp", "8", "--pp", "16",
                                              "--global-batch", "256"]),
]


def child(argv: list[str]) -> tuple[float, float, str]:
    """Run ``python -m simulator ARGV``; returns CPU seconds (user + sys), peak RSS (MB) and standard output."""
    code = ("import resource, subprocess, sys; "
            "r = subprocess.run([sys.executable, '-m', 'simulator', *sys.argv[1:]], capture_output=True, text=True); "
            "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
            "print(u.ru_utime + u.ru_stime, u.ru_maxrss / 1024, sep='\\t'); "
            "print(r.stdout if r.returncode == 0 else 'FAILED: ' + r.stderr, end='')")
    env = dict(os.environ, PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, check=True)
    first, _, rest = out.stdout.partition("\n")
    cpu, rss = first.split("\t")
    return float(cpu), float(rss), rest


def folder_size(path: str) -> tuple[int, int]:
    files = [os.path.join(path, f) for f in os.listdir(path)]
    return len(files), sum(os.path.getsize(f) for f in files)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip-simulation", action="store_true")
    args = p.parse_args()
    print(f"{'case':<52} {'CPU s':>7} {'peak MB':>8} {'files':>6} {'MB written':>11}")
    with tempfile.TemporaryDirectory(prefix="llm-bench-") as tmp:
        for k, (name, plan) in enumerate(CASES):
            out = os.path.join(tmp, str(k))
            cpu, rss, stdout = child(["trace", "generate", "llm", *plan, "-o", out])
            if stdout.startswith("FAILED"):
                print(f"{name:<52} {stdout.strip()}")
                continue
            files, size = folder_size(out)
            print(f"{name:<52} {cpu:>7.2f} {rss:>8.0f} {files:>6} {size / 1e6:>11.1f}", flush=True)
            if k == 0 and not args.skip_simulation:
                network = os.path.join(tmp, "net.yml")
                with open(network, "w") as f:
                    f.write("topology: [Switch, Switch]\nnpus_count: [8, 16]\nbandwidth: [400, 50]\n"
                            "latency: [500, 1000]\n")
                cpu, rss, stdout = child(["--workload", stdout.splitlines()[0], "--network", network,
                                           "--device", "H100", "--quiet"])
                print(f"  simulated on 8 x 16 switches (400 / 50 GB/s, GB = 2^30 B), H100 roofline: "
                      f"{stdout.splitlines()[0]}; "
                      f"{cpu:.1f} s CPU, {rss:.0f} MB peak", flush=True)


if __name__ == "__main__":
    main()
