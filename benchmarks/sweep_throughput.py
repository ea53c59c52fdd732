"""Sweep throughput: points per second for a 1,000-point sweep of 64-NPU collective runs.

    python benchmarks/sweep_throughput.py [--jobs 1,2] [--executor local|ray]

The sweep (written to a temporary folder): four collective types x five sizes x five bandwidths x five
latencies x two dataset splittings on an 8x8 Ring x Switch network of 64 NPUs. Each configuration runs
``astrasim-py sweep`` in a fresh subprocess and reports wall time, points per second, how many points each
engine ran, and that every configuration stored identical rows.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SWEEP = {
    "name": "collectives_64npus",
    "base": {
        "workload": {"generate": "collective", "type": "all_reduce", "size": "1MiB"},
        "network": {"topology": ["Ring", "Switch"], "npus_count": [8, 8], "bandwidth": [200, 50],
                    "latency": [500, 1000]},
    },
    "axes": {
        "workload.type": ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"],
        "workload.size": ["64KiB", "1MiB", "16MiB", "256MiB", "1GiB"],
        "network.bandwidth[1]": [12.5, 25, 50, 100, 200],
        "network.latency[1]": [500, 1000, 2000, 5000, 10000],
        "system.preferred-dataset-splits": [1, 4],
    },
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", default=f"1,{os.cpu_count() or 1}", help="comma-separated worker counts to measure")
    p.add_argument("--executor", default="local", choices=("local", "ray"))
    args = p.parse_args()
    jobs = sorted({int(j) for j in args.jobs.split(",")})
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        path = os.path.join(tmp, "sweep.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(SWEEP, f, sort_keys=False)
        print(f"{args.executor} executor, {os.cpu_count()} cores; sweep of 4 collectives x 5 sizes x 5 bandwidths x "
              "5 latencies x 2 splits on 64 NPUs (Ring(8) x Switch(8))")
        print(f"{'jobs':>5}  {'points':>6}  {'wall s':>8}  {'points/s':>9}  engines")
        reference = None
        for j in jobs:
            out = os.path.join(tmp, f"out-{j}")
            started = time.perf_counter()
            cmd = [sys.executable, "-m", "simulator", "sweep", path, "--out", out, "--jobs", str(j), "--quiet",
                   "--executor", args.executor]
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            wall = time.perf_counter() - started
            if done.returncode not in (0, 1):
                sys.exit(f"sweep failed:\n{done.stderr}")
            db = sqlite3.connect(os.path.join(out, "results.db"))
            rows = db.execute("SELECT * FROM points ORDER BY idx").fetchall()
            engines = dict(db.execute("SELECT COALESCE(engine, status), COUNT(*) FROM points GROUP BY 1"))
            db.close()
            same = "" if reference is None else ("  (rows identical)" if rows == reference else "  (ROWS DIFFER)")
            reference = reference or rows
            print(f"{j:>5}  {len(rows):>6}  {wall:>8.1f}  {len(rows) / wall:>9.1f}  "
                  + ", ".join(f"{k} {v}" for k, v in sorted(engines.items())) + same)


if __name__ == "__main__":
    main()
