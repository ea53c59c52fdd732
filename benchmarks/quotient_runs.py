"""Speed at scale on LLM training iterations: the quotient engine (one simulated rank per class of equivalent
ranks) against the message engine and against ASTRA-sim's measured times.

    python benchmarks/quotient_runs.py [--verify] [--only TEXT] [--why]

Every run executes the installed code in a fresh subprocess: its CPU time (user + system; the machine is shared,
wall time is noisy), wall time and peak RSS. Workloads are generator files (``generate: llm``) built in memory: no
trace files. ``--verify`` also runs the message engine on the cases marked for it and checks every rank's result
is identical (minutes); ``--why`` prints the engine line of cases simulating more than one rank in eight.
ASTRA-sim's times are the wall times of ../shared/reference/astra-sim-2x/README.md (2-core machine,
track-local-mem off; one thread, so about its CPU time); where no ASTRA-sim run of the same trace exists, the
column says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD = ("import sys; from simulator.cli import main; status = main(sys.argv[1:]); "
          "hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')]; "
          "print('peak RSS KiB', hwm[0], file=sys.stderr); sys.exit(status)")

# name, generator mapping, network (topology, npus, GB/s, ns per dimension), ASTRA-sim seconds (None: no such
# run), verify against the message engine with --verify[, more command-line options]
CASES = [
    ("Llama-3 8B, 128 ranks (tp4 pp4 dp8), 8 x 16 switches",
     {"preset": "llama3-8b", "tp": 4, "pp": 4, "dp": 8, "global_batch": 64},
     [("Switch", 8, 400, 500), ("Switch", 16, 50, 1000)], None, True),
    ("GPT 80 layers d_model 8192, 256 ranks (dp8 tp8 pp4), one switch (*)",
     {"num_layers": 80, "hidden_size": 8192, "num_heads": 64, "ffn_hidden_size": 32768, "vocab_size": 51200,
      "seq_len": 2048, "tp": 8, "pp": 4, "dp": 8, "global_batch": 64},
     [("Switch", 256, 400, 500)], 18.5, False),
    ("GPT-3 175B, 1,024 ranks (tp8 pp16 dp8), 8 x 128 switches",
     {"preset": "gpt3-175b", "tp": 8, "pp": 16, "dp": 8, "global_batch": 256},
     [("Switch", 8, 400, 500), ("Switch", 128, 50, 1000)], None, False),
    ("Llama-3 405B, 1,024 ranks (tp8 pp16 dp8, seq 8192)",
     {"preset": "llama3-405b", "tp": 8, "pp": 16, "dp": 8, "seq_len": 8192, "global_batch": 128,
      "micro_batch_size": 1},
     [("Switch", 8, 450, 500), ("Switch", 128, 50, 2000)], None, True),
    ("Llama-3 405B, 16,384 ranks (tp8 pp16 dp128, seq 8192)",
     {"preset": "llama3-405b", "tp": 8, "pp": 16, "dp": 128, "seq_len": 8192, "global_batch": 2048,
      "micro_batch_size": 1},
     [("Switch", 8, 450, 500), ("Switch", 2048, 50, 2000)], None, False),
    ("Llama-3 70B, 256 ranks (tp8 pp4 cp2 dp4, ring attention, seq 8192)",
     {"preset": "llama3-70b", "tp": 8, "pp": 4, "cp": 2, "dp": 4, "seq_len": 8192, "global_batch": 32},
     [("Switch", 8, 400, 936.25), ("Switch", 32, 46.566, 2500)], None, True),
    ("Llama-3 8B, 16 ranks (tp2 pp4 vp2 dp2, SP, TP comm overlap)",
     {"preset": "llama3-8b", "tp": 2, "pp": 4, "vp": 2, "dp": 2, "sequence_parallel": True, "tp_comm_overlap": True,
      "global_batch": 32},
     [("Switch", 8, 400, 936.25), ("Switch", 2, 46.566, 2500)], None, True),
    ("Llama-3 8B, 16 ranks (tp2 pp4 vp2 dp2, SP)",
     {"preset": "llama3-8b", "tp": 2, "pp": 4, "vp": 2, "dp": 2, "sequence_parallel": True, "global_batch": 32},
     [("Switch", 8, 400, 936.25), ("Switch", 2, 46.566, 2500)], None, True),
    ("Mixtral 8x7B, 16 ranks (tp2 pp2 dp4 ep4, SP)",
     {"preset": "mixtral-8x7b", "tp": 2, "pp": 2, "dp": 4, "ep": 4, "sequence_parallel": True,
      "global_batch": 64},
     [("Switch", 8, 400, 936.25), ("Switch", 2, 46.566, 2500)], None, True),
    ("Llama-3 8B, 128 ranks (tp4 pp4 dp8), NCCL model (hgx-h100)",
     {"preset": "llama3-8b", "tp": 4, "pp": 4, "dp": 8, "global_batch": 64},
     [("Switch", 8, 400, 500), ("Switch", 16, 50, 1000)], None, True,
     ["--collective-model", "nccl", "--hw-profile", "hgx-h100"]),
    ("Llama-3 70B, 256 ranks (tp8 pp4 cp2 dp4, ring attention), NCCL model (hgx-h100)",
     {"preset": "llama3-70b", "tp": 8, "pp": 4, "cp": 2, "dp": 4, "seq_len": 8192, "global_batch": 32},
     [("Switch", 8, 400, 936.25), ("Switch", 32, 46.566, 2500)], None, False,
     ["--collective-model", "nccl", "--hw-profile", "hgx-h100"]),
    ("Llama-3 8B, 16 ranks (tp2 pp4 vp2 dp2, SP, TP comm overlap), NCCL model (hgx-h100)",
     {"preset": "llama3-8b", "tp": 2, "pp": 4, "vp": 2, "dp": 2, "sequence_parallel": True, "tp_comm_overlap": True,
      "global_batch": 32},
     [("Switch", 8, 400, 936.25), ("Switch", 2, 46.566, 2500)], None, True,
     ["--collective-model", "nccl", "--hw-profile", "hgx-h100"]),
    ("Llama-3 70B, 64 ranks (tp4 pp8 vp5 dp2, SP, TP comm overlap, ZeRO 1), NCCL model (hgx-h100)",
     {"preset": "llama3-70b", "tp": 4, "pp": 8, "vp": 5, "dp": 2, "zero": 1, "sequence_parallel": True,
      "tp_comm_overlap": True, "global_batch": 32},
     [("Switch", 8, 400, 500), ("Switch", 8, 50, 1000)], None, True,
     ["--collective-model", "nccl", "--hw-profile", "hgx-h100"]),
    ("Llama-3 70B, 1,024 ranks (tp8 pp8 dp16, ZeRO 1, SP), NCCL model (hgx-h200)",
     {"preset": "llama3-70b", "tp": 8, "pp": 8, "dp": 16, "zero": 1, "sequence_parallel": True, "global_batch": 64},
     [("Switch", 8, 400, 500), ("Switch", 128, 50, 1000)], None, False,
     ["--collective-model", "nccl", "--hw-profile", "hgx-h200"]),
]


def run(folder: str, name: str, spec: dict, dims: list, engine: str, options: tuple[str, ...] = ()) -> dict:
    slug = "".join(ch if ch.isalnum() else "_" for ch in name)[:60]
    workload = os.path.join(folder, f"{slug}.yaml")
    with open(workload, "w") as f:
        json.dump({"generate": "llm", **spec}, f)
    network = os.path.join(folder, f"{slug}.net.yml")
    with open(network, "w") as f:
        json.dump({"topology": [d[0] for d in dims], "npus_count": [d[1] for d in dims],
                   "bandwidth": [d[2] for d in dims], "latency": [d[3] for d in dims]}, f)
    out = os.path.join(folder, f"{slug}.{engine}.json")
    cmd = [sys.executable, "-c", _CHILD, "--workload", workload, "--network", network, "--device", "H100",
           "--engine", engine, "--json", out, "--quiet", *options]
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - started
        err.seek(0)
        lines = err.read().strip().splitlines()
    if status != 0:
        return {"error": (lines or [f"exit status {status}"])[-1]}
    with open(out) as f:
        result = json.load(f)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": int(lines[-1].split()[-1]) / 1024,
            "result": result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true", help="also run the message engine where marked and "
                                                              "compare every rank")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--why", action="store_true", help="print why cases that fold little do not fold further")
    args = parser.parse_args()
    print(f"{'case':<86} {'ranks':>6} {'simulated':>9} {'CPU s':>7} {'wall s':>7} {'RSS MB':>7} {'ASTRA s':>8} "
          f"{'speed-up':>8}  {'message engine (CPU)':>24}")
    failures = 0
    with tempfile.TemporaryDirectory() as folder:
        for name, spec, dims, astra_s, verify, *more in CASES:
            if args.only not in name:
                continue
            options = tuple(more[0]) if more else ()
            r = run(folder, name, spec, dims, "auto", options)
            if "error" in r:
                failures += 1
                print(f"{name:<86} ERROR {r['error']}")
                continue
            res = r["result"]
            ranks, simulated = len(res["ranks"]), res["run"]["simulated_ranks"]
            astra = f"{astra_s:.1f}" if astra_s else "-"
            speedup = f"{astra_s / r['cpu_s']:.0f}x" if astra_s else "-"
            check = ""
            if args.verify and verify:
                m = run(folder, name, spec, dims, "message", options)
                if "error" in m:
                    check = f"ERROR {m['error']}"
                    failures += 1
                else:
                    same = m["result"]["ranks"] == res["ranks"]
                    failures += not same
                    check = f"{m['cpu_s']:.1f} s, {'identical' if same else 'DIFFERENT'}"
            print(f"{name:<86} {ranks:>6,} {simulated:>9,} {r['cpu_s']:>7.2f} {r['wall_s']:>7.2f} {r['rss_mb']:>7.0f} "
                  f"{astra:>8} {speedup:>8}  {check:>24}", flush=True)
            if simulated > len(res["ranks"]) // 8 and args.why:
                print(f"    {res['run'].get('engine_reason', '')}")
    print("(*) ASTRA-sim's 18.5 s is its run of symbolic_tensor_graph's trace of this layout (not shared here); "
          "ours is the same model and layout from `generate: llm`, so the two are comparable in size, not identical")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
