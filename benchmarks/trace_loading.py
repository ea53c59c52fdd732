"""Load a large Chakra trace and walk it with the feeder: CPU time and peak memory.

    python benchmarks/trace_loading.py [--nodes 1000000] [--keep FILE]

A synthetic trace with a realistic mix (70 % compute nodes with roofline attributes, 20 % collectives
with communicator groups and involved_dim, 10 % send/recv; data dependencies on recent nodes and some
control dependencies) is written first (not timed). The load and the walk then run in a fresh process so
that its peak RSS covers only them; times are that process's CPU seconds (user + sys), which other work on a
shared machine inflates less than wall time. Target (issue 2): 1,000,000 nodes in under 10 s and 1.5 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workload.schema import NodeType
from workload.writer import make_node, write_trace


def synthetic_nodes(count: int, seed: int = 1):
    rng = random.Random(seed)
    for i in range(count):
        data = [i - 1] if i else []
        if i > 8 and rng.random() < 0.3:
            data.append(i - rng.randint(2, 8))
        ctrl = [i - rng.randint(2, 32)] if i > 32 and rng.random() < 0.1 else []
        r = rng.random()
        if r < 0.7:
            yield make_node(i, f"layer{i // 50}.op{i % 50}", NodeType.COMP_NODE, data_deps=data, ctrl_deps=ctrl,
                            duration_micros=rng.randint(1, 500),
                            attrs={"is_cpu_op": False, "num_ops": rng.randint(1, 1 << 40),
                                   "tensor_size": rng.randint(1, 1 << 30)})
        elif r < 0.9:
            yield make_node(i, f"layer{i // 50}.allreduce", NodeType.COMM_COLL_NODE, data_deps=data,
                            ctrl_deps=ctrl, attrs={"is_cpu_op": False, "comm_type": rng.choice((0, 2, 6, 7)),
                                                   "comm_size": rng.randint(1, 1 << 28),
                                                   "pg_name": str(rng.randint(0, 8)),
                                                   "involved_dim": [True, rng.random() < 0.5]})
        else:
            send = rng.random() < 0.5
            yield make_node(i, "send" if send else "recv",
                            NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE, data_deps=data,
                            ctrl_deps=ctrl, attrs={"is_cpu_op": False, "comm_src": 0, "comm_dst": 1,
                                                   "comm_tag": i, "comm_size": rng.randint(1, 1 << 24)})


def measure(path: str) -> dict[str, float]:
    from workload.feeder import Feeder
    from workload.traceset import TraceLoader

    t0 = time.process_time()
    graph = TraceLoader().load(path, 0)
    t1 = time.process_time()
    from workload.validate import validate
    deps = validate(graph)
    feeder = Feeder(graph, deps)
    walked = 0
    take, finish = feeder.take_lowest, feeder.finish
    while (i := take()) is not None:
        finish(i)
        walked += 1
    t2 = time.process_time()
    assert walked == graph.num_nodes and feeder.done
    return {"nodes": graph.num_nodes, "edges": len(deps.parents), "load_s": t1 - t0, "walk_s": t2 - t1,
            "total_s": t2 - t0, "peak_rss_mb": _peak_rss_kib() / 1024}


def _peak_rss_kib() -> int:
    """This process's own peak RSS (VmHWM; ru_maxrss would include the forking parent's)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--keep", help="write the synthetic trace here and keep it")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or os.path.join(tmp, "synthetic.0.et")
        if not os.path.exists(path):
            t = time.perf_counter()
            write_trace(path, synthetic_nodes(args.nodes))
            print(f"wrote {args.nodes:,} nodes ({os.path.getsize(path) / 2**20:.1f} MiB) "
                  f"in {time.perf_counter() - t:.1f} s (not part of the figures)")
        out = subprocess.run([sys.executable, __file__, "--measure", path], capture_output=True, text=True,
                             check=True)
        r = json.loads(out.stdout)
    print(f"nodes: {r['nodes']:,}   dependency edges: {r['edges']:,}")
    print(f"load (read + decode + validate): {r['load_s']:.2f} s CPU")
    print(f"feeder walk to completion:       {r['walk_s']:.2f} s CPU")
    print(f"total:                           {r['total_s']:.2f} s CPU   (target < 10 s)")
    print(f"peak memory (RSS):               {r['peak_rss_mb']:.0f} MB (target < 1536 MB)")


if __name__ == "__main__":
    main()
