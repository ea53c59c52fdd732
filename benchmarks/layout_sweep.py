"""A sweep over parallelism layouts of one GPT-3 175B training iteration on 1,024 GPUs: wall time of the whole
sweep and the best layouts.

    python benchmarks/layout_sweep.py [--points 200] [--jobs 2] [--out DIR]

The layouts are every (tp, pp, dp, micro-batch size, sequence parallelism, ZeRO stage, activation recompute) with
tp x pp x dp = 1,024,
tp in 1..8, pp in 1..16 and a global batch of 256 sequences, the first ``--points`` of them in a fixed order;
workloads are generated in memory (``generate: llm``), 8 GPUs per node (400 GB/s) behind a 50 GB/s switch,
H100 roofline compute. Writes DIR/layouts.yaml (the sweep file), runs ``astrasim-py sweep`` and, where
matplotlib is installed, ``astrasim-py plot`` of the iteration time per layout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOBAL_BATCH = 256


def layouts() -> list[dict]:
    out = []
    for recompute, zero, sp, tp, pp, mbs in itertools.product((False, True), (0, 1), (False, True), (1, 2, 4, 8),
                                                               (1, 2, 4, 8, 16), (1, 2, 4, 8)):
        dp = 1024 // (tp * pp)
        if dp * tp * pp != 1024 or GLOBAL_BATCH % (dp * mbs) or (sp and tp == 1):
            continue
        out.append({"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": mbs, "sequence_parallel": sp, "zero": zero,
                    "activation_recompute": recompute})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="results folder (default: a temporary one)")
    args = parser.parse_args()
    chosen = layouts()[: args.points]
    out = args.out or tempfile.mkdtemp(prefix="layout-sweep-")
    os.makedirs(out, exist_ok=True)
    keys = list(chosen[0])
    sweep = {
        "name": "gpt3_175b_layouts",
        "base": {"workload": {"generate": "llm", "preset": "gpt3-175b", "global_batch": GLOBAL_BATCH},
                 "network": {"topology": ["Switch", "Switch"], "npus_count": [8, 128], "bandwidth": [400, 50],
                             "latency": [500, 1000]},
                 "options": {"device": "H100"}},
        "axes": {f"workload.{k}": [p[k] for p in chosen] for k in keys},
        "zip": [[f"workload.{k}" for k in keys]],
    }
    path = os.path.join(out, "layouts.yaml")
    with open(path, "w") as f:
        json.dump(sweep, f, indent=1)
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "simulator", "sweep", path, "--out", out, "--jobs", str(args.jobs), "--force-jobs"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    print(done.stderr.strip().splitlines()[-2] if done.stderr.strip() else "")
    print(f"{len(chosen)} layouts of GPT-3 175B on 1,024 GPUs, --jobs {args.jobs}: {wall / 60:.1f} min "
          f"({wall / len(chosen):.1f} s per point)")
    csv = os.path.join(out, "layouts.csv")
    subprocess.run([sys.executable, "-m", "simulator", "sweep", "export", out, "--csv", csv], cwd=REPO,
                   capture_output=True)
    if os.path.exists(csv):
        import csv as csvlib

        with open(csv) as f:
            rows = [r for r in csvlib.DictReader(f) if r["status"] == "ok"]
        rows.sort(key=lambda r: int(r["finish_ns"]))
        print("fastest layouts (iteration time):")
        for r in rows[:5]:
            layout = ", ".join(f"{k}={r.get('workload.' + k)}" for k in keys)
            print(f"  {int(r['finish_ns']) / 1e9:8.3f} s  {layout}")
    fixed = ["workload.micro_batch_size=1", "workload.sequence_parallel=false", "workload.zero=0",
             "workload.activation_recompute=false"]
    plot = subprocess.run([sys.executable, "-m", "simulator", "plot", out, "--x", "workload.pp", "--y", "finish_ns",
                           "--hue", "workload.tp", *[a for w in fixed for a in ("--where", w)],
                           "--out", os.path.join(out, "layouts.png")], cwd=REPO, capture_output=True, text=True)
    print(f"plot: {os.path.join(out, 'layouts.png')}" if plot.returncode == 0 else
          f"plot: {(plot.stderr.strip().splitlines() or ['failed'])[-1]}")
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
