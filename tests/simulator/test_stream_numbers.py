"""Collectives over every rank that ASTRA-sim 2.x would number differently on different ranks: the run keeps its
results (paired in issue order) and warns once, naming the collective and two ranks; a group of every rank (what
--groups-file writes) runs alike and does not warn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.api import simulate
from tests.conftest import run_cli
from workload.groups import process_groups_node
from workload.schema import CollectiveType, NodeType
from workload.writer import make_node, write_trace

NETWORK = '{"topology": ["Ring"], "npus_count": [4], "bandwidth": [50], "latency": [500]}'
PAIRING = "would not pair the collective over every rank"


GROUPS = {"1": [0, 1], "2": [2, 3], "3": [0, 1, 2, 3]}


def write_traces(folder: Path, group_collectives: tuple[int, int], pg_name: str | None = None,
                 sizes: tuple[int, int] = (1 << 20, 1 << 20), metadata: bool = True) -> str:
    """Four ranks: ranks 0-1 run ``group_collectives[0]`` all-reduces of ``sizes[0]`` bytes on their pair group
    (number 1), ranks 2-3 ``group_collectives[1]`` of ``sizes[1]`` on theirs (number 2), then every rank one
    all-reduce over every rank (named ``pg_name``, or unnamed); the groups (GROUPS) in a METADATA node, or
    (``metadata`` False) for a comm-group file."""
    for rank in range(4):
        pair = rank // 2
        nodes = [process_groups_node(0, GROUPS) if metadata else
                 make_node(0, "start", NodeType.COMP_NODE, duration_micros=1)]
        for k in range(group_collectives[pair]):
            nodes.append(make_node(k + 1, f"pair_allreduce_{k}", NodeType.COMM_COLL_NODE, data_deps=[k] if k else [],
                                   attrs=[("comm_type", CollectiveType.ALL_REDUCE), ("comm_size", sizes[pair]),
                                          ("pg_name", str(pair + 1))]))
        last = len(nodes)
        attrs = [("comm_type", CollectiveType.ALL_REDUCE), ("comm_size", 1 << 22)]
        if pg_name is not None:
            attrs.append(("pg_name", pg_name))
        nodes.append(make_node(last, "world_allreduce", NodeType.COMM_COLL_NODE,
                               data_deps=[last - 1] if last > 1 else [], attrs=attrs))
        write_trace(folder / f"t.{rank}.et", nodes)
    (folder / "n.json").write_text(NETWORK)
    return str(folder / "t")


@pytest.mark.parametrize(("group_collectives", "sizes", "warns"), [
    ((1, 0), (1 << 20, 1 << 20), True),  # ranks 0-1 started 4 streams (4 splits) before it, ranks 2-3 none
    ((2, 1), (1 << 20, 1 << 20), True),
    ((1, 1), (1 << 20, 1 << 20), False),  # different groups, equal counts: ASTRA-sim pairs it
    ((1, 1), (1 << 20, 2), False),  # a 2-byte collective still runs 4 chunk-streams (at least 1 byte per NPU)
    ((0, 0), (1 << 20, 1 << 20), False),
])
def test_an_unnamed_collective_warns_where_astra_sim_would_number_it_differently(
        tmp_path: Path, group_collectives: tuple[int, int], sizes: tuple[int, int], warns: bool) -> None:
    prefix = write_traces(tmp_path, group_collectives, sizes=sizes)
    for engine in ("auto", "message"):
        warnings: list[str] = []
        result = simulate(prefix, tmp_path / "n.json", warn=warnings.append, engine=engine)
        pairing = [w for w in warnings if PAIRING in w]
        assert len(pairing) == (1 if warns else 0), warnings
        if warns:
            assert "node" in pairing[0] and "'world_allreduce'" in pairing[0] and "on rank 0" in pairing[0]
            assert "on rank 2" in pairing[0] or "on rank 3" in pairing[0]
        # the results: the same as when the collective names a group of every rank, which never warns
        named: list[str] = []
        folder = tmp_path / f"named-{engine}"
        folder.mkdir()
        same = simulate(write_traces(folder, group_collectives, pg_name="3", sizes=sizes), folder / "n.json",
                        warn=named.append, engine=engine)
        assert not [w for w in named if PAIRING in w]
        assert [(r.finish_ns, r.exposed_comm_ns) for r in result.ranks] == \
            [(r.finish_ns, r.exposed_comm_ns) for r in same.ranks]


def test_the_generated_reproducer_warns_and_its_groups_file_form_runs_alike_without(tmp_path: Path) -> None:
    """trace generate llm with the distributed optimizer and the iteration tail: the two pipeline stages run
    different numbers of group collectives before the gradient norm's all-reduce over every rank."""
    flags = ["trace", "generate", "llm", "--layers", "2", "--hidden", "256", "--heads", "8", "--kv-heads", "4",
             "--ffn-hidden", "512", "--vocab", "1000", "--seq-len", "256", "--tp", "2", "--pp", "2", "--dp", "4",
             "--micro-batches", "1", "--use-distributed-optimizer", "--iteration-tail", "--device", "H100",
             "--name", "llm"]
    assert run_cli(*flags, "-o", str(tmp_path / "meta")).returncode == 0
    assert run_cli(*flags, "-o", str(tmp_path / "file"), "--groups-file").returncode == 0
    groups = json.loads((tmp_path / "file" / "llm.comm_groups.json").read_text())
    assert list(groups.values())[-1] == list(range(16))  # the group of every rank, numbered after the others
    network = tmp_path / "n.yml"
    network.write_text("topology: [ Ring, Switch ]\nnpus_count: [ 4, 4 ]\nbandwidth: [ 200, 50 ]\n"
                       "latency: [ 100, 1000 ]\n")
    runs = {}
    for form, extra in (("meta", []), ("file", ["--comm-groups", str(tmp_path / "file" / "llm.comm_groups.json")])):
        done = run_cli("--workload", str(tmp_path / form / "llm"), "--network", str(network), *extra, "--json",
                       str(tmp_path / f"{form}.json"), "--quiet")
        assert done.returncode == 0, done.stderr
        runs[form] = (done.stderr, json.loads((tmp_path / f"{form}.json").read_text())["ranks"])
    assert runs["meta"][0].count(PAIRING) == 1 and "'grad_norm_allreduce'" in runs["meta"][0]
    assert PAIRING not in runs["file"][0]
    assert [(r["finish_ns"], r["exposed_comm_ns"]) for r in runs["meta"][1]] == \
        [(r["finish_ns"], r["exposed_comm_ns"]) for r in runs["file"][1]]
