"""``astrasim-py compare``: the same numbers as single runs, nccl-tests bandwidths, speed-ups, errors."""

from __future__ import annotations

import csv
from pathlib import Path

from simulator.api import simulate
from simulator.config import DEFAULT_SYSTEM, system_from_dict
from tests.conftest import REPO, run_cli
from workload.schema import CollectiveType
from workload.tools.generate import collective, write_rank_traces

TORUS = str(REPO / "configs" / "network" / "torus_4x8.yml")
TORUS_SYSTEM = str(REPO / "configs" / "system" / "torus_2d.json")


def test_collective_comparison_matches_single_runs(tmp_path: Path) -> None:
    table = tmp_path / "compare.csv"
    png = tmp_path / "compare.png"
    done = run_cli("compare", "--network", TORUS, "--system", TORUS_SYSTEM, "--collective", "all_reduce",
                   "--sizes", "1MiB,16MiB", "--algorithms", "ring,direct,doubleBinaryTree,ring/halvingDoubling",
                   "--csv", str(table), "--plot", str(png), "--jobs", "2")
    assert done.returncode == 0, done.stderr
    assert "all_reduce on Ring(4) x Ring(8) = 32 NPUs, analytical-unaware" in done.stdout
    rows = list(csv.DictReader(table.open()))
    algorithms = ("ring", "direct", "doubleBinaryTree", "ring/halvingDoubling")
    assert [(r["algorithm"], r["size_bytes"]) for r in rows] == [(a, str(s)) for s in (1 << 20, 16 << 20)
                                                                 for a in algorithms]
    for size in (1 << 20, 16 << 20):
        mine = [r for r in rows if int(r["size_bytes"]) == size]
        slowest = max(mine, key=lambda r: float(r["time_ns"]))
        assert float(slowest["speedup"]) == 1.0
        for r in mine:
            time_ns = float(r["time_ns"])  # the collective's time averaged over ranks, as nccl-tests reports it
            assert time_ns <= int(r["finish_ns"])
            assert float(r["speedup"]) == float(slowest["time_ns"]) / time_ns
            assert float(r["algbw_GBps"]) == size / time_ns  # bytes per ns = GB/s (1e9 B/s)
            assert abs(float(r["busbw_GBps"]) - float(r["algbw_GBps"]) * 2 * 31 / 32) < 1e-9
    assert png.read_bytes()[:4] == b"\x89PNG"

    # every row is the number a single run of that algorithm gives
    prefix = str(tmp_path / "ar" / "trace")
    write_rank_traces(prefix, collective(32, CollectiveType.ALL_REDUCE, 16 << 20))
    base = system_from_dict({**DEFAULT_SYSTEM, "all-reduce-implementation": ["ring", "halvingDoubling"],
                             "preferred-dataset-splits": 4})
    single = simulate(prefix, TORUS, base)
    row = next(r for r in rows if r["algorithm"] == "ring/halvingDoubling" and int(r["size_bytes"]) == 16 << 20)
    assert int(row["finish_ns"]) == single.finish_ns


def test_workload_comparison() -> None:
    done = run_cli("compare", "--network", str(REPO / "configs" / "network" / "ring_8.yml"), "--workload",
                   str(REPO / "configs" / "workloads" / "all_reduce" / "8npus_1MiB" / "all_reduce"),
                   "--algorithms", "ring,direct", "--jobs", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "exposed comm" in lines[1]
    ring, direct = lines[2].split(), lines[3].split()
    assert ring[0] == "ring" and direct[0] == "direct"
    assert "1.00x" in ring or "1.00x" in direct


def test_compare_errors() -> None:
    ring8 = str(REPO / "configs" / "network" / "ring_8.yml")
    unknown = run_cli("compare", "--network", ring8, "--collective", "all_reduce", "--algorithms", "ring,rnig")
    assert unknown.returncode == 1
    assert "unknown collective algorithm 'rnig'; valid: ring, direct" in unknown.stderr
    dims = run_cli("compare", "--network", ring8, "--collective", "all_reduce", "--algorithms", "ring/direct")
    assert "algorithm 'ring/direct' names 2 dimensions but the network has 1" in dims.stderr
    nothing = run_cli("compare", "--network", ring8, "--collective", "all_to_all", "--algorithms", "doubleBinaryTree")
    assert nothing.returncode == 1
    assert "nothing to compare: doubleBinaryTree does not implement all-to-all" in nothing.stderr
    skipped = run_cli("compare", "--network", ring8, "--collective", "all_gather", "--sizes", "64KiB",
                      "--algorithms", "ring,doubleBinaryTree", "--jobs", "1")
    assert skipped.returncode == 0
    assert "skipped: doubleBinaryTree does not implement all-gather" in skipped.stderr
    broadcast = run_cli("compare", "--network", ring8, "--collective", "broadcast", "--algorithms", "ring")
    assert "broadcast has no algorithm choice" in broadcast.stderr


def test_compare_refuses_sizes_of_zero_bytes() -> None:
    """A 0-byte size timed nothing: `--explain 0` printed a busbw of inf, `--sizes 0` a speed-up of 0.00x."""
    hgx8 = str(REPO / "configs" / "network" / "hgx_h100_8.yml")
    for args in (("--hw-profile", "hgx-h100", "--explain", "0"), ("--sizes", "0,1MiB", "--algorithms", "ring"),
                 ("--sizes", "0KiB", "--collective-model", "nccl", "--hw-profile", "hgx-h100")):
        done = run_cli("compare", "--network", hgx8, "--collective", "all_reduce", *args)
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.endswith("a size of 0 bytes moves nothing: give at least 1 byte\n"), done.stderr


def test_compare_passes_on_what_its_runs_warned(tmp_path: Path) -> None:
    """Each run's warnings reach the user once, naming the runs: a workload of untimed compute and group collectives
    compared ring against direct printed two equal rows and nothing else."""
    from tests.conftest import write_trace_file
    from workload.schema import NodeType
    from workload.writer import make_node

    for r in range(32):
        nodes = [make_node(1, "mm", NodeType.COMP_NODE, attrs={"num_ops": 10**9, "tensor_size": 1 << 20}),
                 make_node(2, "ar", NodeType.COMM_COLL_NODE, data_deps=[1],
                           attrs={"comm_type": int(CollectiveType.ALL_REDUCE), "comm_size": 1 << 20,
                                  "pg_name": str(r // 8 + 1)})]
        write_trace_file(tmp_path / f"w.{r}.et", nodes)
    groups = tmp_path / "groups.json"
    groups.write_text('{' + ", ".join(f'"{g + 1}": {list(range(8 * g, 8 * g + 8))}' for g in range(4)) + '}')
    done = run_cli("compare", "--network", TORUS, "--workload", str(tmp_path / "w"), "--comm-groups", str(groups),
                   "--algorithms", "ring,direct")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "warning:" in line]
    assert any(line.startswith("astrasim-py: warning: every run: ") and "--device" in line for line in lines)
    assert [line for line in lines if "one ring over the group's members" in line and ": direct: " in line]
    assert not [line for line in lines if "one ring" in line and ": ring: " in line]
