"""The packet-level backend's speed: packet-hops per second and wall time.

    python benchmarks/packet_backend.py [--repeat 3]

Cases (each the best of --repeat runs in this process, after one warm-up):
  * the issue's: a 64-NPU ring all-reduce of 64 MiB on a 2-level fat-tree (configs/network/fat_tree_64.yml:
    8 leaves x 8 NPUs, 8 spines, 50 GB/s links); target at least 1,000,000 packet-hops/s on one core;
  * a 1 GiB all-reduce on ASTRA-sim's 8-NPU ring (configs/network/ring_8.yml), where NPUs relay;
  * a congested one: a 64-NPU all-to-all of 1 MiB on the 4:1 oversubscribed fat-tree.
"packet loop" is the rate inside the packet event loop alone; the rest of the wall time is the system layer
(collectives, messages) that every backend shares, shown by the analytical-aware run of the same case.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from network.config import load_network  # noqa: E402
from simulator.config import MemoryConfig, system_from_dict  # noqa: E402
from simulator.simulation import RunOptions, Simulation  # noqa: E402
from simulator.sweep.spec import default_system_dict  # noqa: E402
from workload.schema import CollectiveType  # noqa: E402
from workload.tools.generate import collective, write_rank_traces  # noqa: E402
from workload.traceset import resolve_workload  # noqa: E402

CASES = [
    ("ring all-reduce 64 MiB, 64 NPUs, 2-level fat-tree", "fat_tree_64.yml", CollectiveType.ALL_REDUCE, 64 << 20, {}),
    ("ring all-reduce 1 GiB, 8 NPUs, ASTRA-sim Ring", "ring_8.yml", CollectiveType.ALL_REDUCE, 1 << 30, {}),
    ("all-to-all 1 MiB, 64 NPUs, 4:1 oversubscribed fat-tree", "fat_tree_64_oversubscribed.yml",
     CollectiveType.ALL_TO_ALL, 1 << 20, {"all-to-all-implementation": ["direct", "direct"]}),
]


def run(prefix: str, network_file: str, system: dict, backend: str) -> tuple[float, Simulation, object]:
    network = load_network(os.path.join(REPO, "configs", "network", network_file))
    sys_cfg = system_from_dict({**default_system_dict(network.num_dims), **system})
    sim = Simulation(resolve_workload(prefix), network, sys_cfg, MemoryConfig(), {},
                     RunOptions(backend=backend, progress=False))
    started = time.perf_counter()
    result = sim.run()
    return time.perf_counter() - started, sim, result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    print(f"{'case':<56} {'backend':<17} {'simulated':>12} {'wall s':>7} {'packet-hops':>12} {'hops/s':>11} "
          f"{'packet loop':>12}")
    with tempfile.TemporaryDirectory(prefix="packet-bench-") as tmp:
        for name, network_file, kind, size, system in CASES:
            network = load_network(os.path.join(REPO, "configs", "network", network_file))
            prefix = os.path.join(tmp, network_file, "trace")
            write_rank_traces(prefix, collective(network.num_npus, kind, size))
            for backend in ("analytical-aware", "packet"):
                runs = [run(prefix, network_file, system, backend) for _ in range(args.repeat)]
                wall, sim, result = min(runs, key=lambda r: r[0])
                hops = result.network.get("packet_hops", 0)
                loop = getattr(sim.backend, "loop_s", 0.0)
                rate = f"{hops / wall:>11,.0f}" if hops else f"{'':>11}"
                inner = f"{hops / loop:>12,.0f}" if hops and loop else f"{'':>12}"
                print(f"{name:<56} {backend:<17} {result.finish_ns / 1e6:>9.3f} ms {wall:>7.2f} "
                      f"{hops:>12,} {rate} {inner}", flush=True)


if __name__ == "__main__":
    main()
