"""The ``astrasim-py trace`` tools, through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest

from tests.conftest import run_cli, write_trace_file
from workload.errors import InputError
from workload.reader import read_trace
from workload.schema import CollectiveType, NodeType
from workload.tools.generate import collective as gen_collective
from workload.traceset import TraceLoader, resolve_workload
from workload.writer import make_node


def test_generate_collectives_in_the_astra_sim_layout(tmp_path: Path) -> None:
    out = run_cli("trace", "generate", "collective", "--type", "all_reduce,all_to_all", "--size", "1MiB,64KiB",
                  "--npus", "4,8", "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr
    prefixes = out.stdout.split()
    assert len(prefixes) == 8
    assert (tmp_path / "all_reduce" / "8npus_1MiB" / "all_reduce.7.et").exists()
    graphs = TraceLoader().load_set(resolve_workload(str(tmp_path / "all_to_all" / "4npus_64KiB" / "all_to_all")), 4)
    g = graphs[0]
    assert g.version == "1.0.0" and int(g.types[0]) == NodeType.COMM_COLL_NODE
    assert g.attributes(0) == [("is_cpu_op", "bool_val", False), ("comm_type", "int64_val", 6),
                               ("comm_size", "int64_val", 65536)]


def test_generate_sendrecv_ring_is_runnable(tmp_path: Path) -> None:
    out = run_cli("trace", "generate", "sendrecv", "--npus", "4", "--size", "1MiB", "--iterations", "2",
                  "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr
    g = read_trace(tmp_path / "sendrecv.2.et")
    sends = [g.attributes(i) for i in range(g.num_nodes) if int(g.types[i]) == NodeType.COMM_SEND_NODE]
    recvs = [g.attributes(i) for i in range(g.num_nodes) if int(g.types[i]) == NodeType.COMM_RECV_NODE]
    assert len(sends) == len(recvs) == 2
    assert ("comm_dst", "int32_val", 3) in sends[0] and ("comm_src", "int32_val", 1) in recvs[0]
    assert ("comm_tag", "int32_val", 1) in sends[1] and ("comm_size", "int64_val", 1 << 20) in recvs[1]


def test_generate_compute_and_memory(tmp_path: Path) -> None:
    assert run_cli("trace", "generate", "compute", "--npus", "2", "--count", "3", "--num-ops", "1000",
                   "--tensor-size", "4KiB", "-o", str(tmp_path)).returncode == 0
    g = read_trace(tmp_path / "compute.1.et")
    assert g.num_nodes == 3 and g.data_deps_of(2) == [1]
    assert g.attribute(0, "tensor_size") == 4096
    assert run_cli("trace", "generate", "memory", "--npus", "2", "--tensor-size", "1MiB", "--access", "store",
                   "-o", str(tmp_path)).returncode == 0
    assert int(read_trace(tmp_path / "memory.0.et").types[0]) == NodeType.MEM_STORE_NODE


def test_inspect_json(tmp_path: Path) -> None:
    run_cli("trace", "generate", "collective", "--type", "all_gather", "--size", "1MiB", "--npus", "4",
            "--repeat", "3", "-o", str(tmp_path))
    out = run_cli("trace", "inspect", str(tmp_path / "all_gather" / "4npus_1MiB" / "all_gather"), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["total"]["ranks"] == 4 and doc["total"]["nodes"] == 12
    assert doc["total"]["collectives"] == {"ALL_GATHER": {str(1 << 20): 12}}
    assert doc["ranks"][0]["depth"] == 3 and doc["total"]["collective_bytes"] == 12 << 20


def test_inspect_says_when_one_file_serves_every_rank(tmp_path: Path) -> None:
    write_trace_file(tmp_path / "single.et", [make_node(1, "c", 4, duration_micros=5)])
    out = run_cli("trace", "inspect", str(tmp_path / "single.et"))
    assert out.returncode == 0 and "run by every rank" in out.stdout and "5 µs" in out.stdout


def test_jsonize_is_one_valid_document_and_jsonl_is_line_by_line(tmp_path: Path) -> None:
    nodes = [make_node(1, "a", 4, duration_micros=2, attrs={"num_ops": 7, "blob": b"\x00\x01"}),
             make_node(2, "b", NodeType.COMM_COLL_NODE, data_deps=[1],
                       attrs={"comm_type": 0, "comm_size": 64, "involved_dim": [True, False]})]
    write_trace_file(tmp_path / "t.0.et", nodes)
    write_trace_file(tmp_path / "t.1.et", nodes)
    out = run_cli("trace", "jsonize", str(tmp_path / "t"))
    doc = json.loads(out.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    node = doc["ranks"][0]["nodes"][1]
    assert node["type"] == "COMM_COLL_NODE" and node["data_deps"] == [1]
    assert {"name": "involved_dim", "bool_list": [True, False]} in node["attr"]
    assert {"name": "blob", "bytes_val": "AAE="} in doc["ranks"][0]["nodes"][0]["attr"]
    lines = run_cli("trace", "jsonize", str(tmp_path / "t"), "--jsonl", "--rank", "1").stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert records[0]["metadata"]["version"] == "1.0.0" and [r["node"]["id"] for r in records[1:]] == [1, 2]


def test_visualize_graphml_and_dot(tmp_path: Path) -> None:
    nodes = [make_node(1, "a", 4), make_node(2, 'say "hi"', 4, data_deps=[1]), make_node(3, "c", 4, ctrl_deps=[2])]
    write_trace_file(tmp_path / "t.0.et", nodes)
    assert run_cli("trace", "visualize", str(tmp_path / "t"), "-o", str(tmp_path / "g.graphml")).returncode == 0
    g = nx.read_graphml(tmp_path / "g.graphml")
    assert g.number_of_nodes() == 3 and g.nodes["2"]["name"] == 'say "hi"'
    assert {d["kind"] for _, _, d in g.edges(data=True)} == {"data", "ctrl"}
    assert run_cli("trace", "visualize", str(tmp_path / "t"), "-o", str(tmp_path / "g.dot")).returncode == 0
    dot = (tmp_path / "g.dot").read_text()
    assert dot.startswith("digraph") and "n1 -> n2;" in dot and "n2 -> n3 [style=dashed];" in dot
    assert r'say \"hi\"' in dot


def test_generated_microbenchmarks_run_in_the_simulator(tmp_path: Path) -> None:
    from simulator.api import simulate

    ring4 = tmp_path / "ring4.yml"
    ring4.write_text("topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n")
    memory = tmp_path / "mem.json"
    memory.write_text('{"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-latency": 10, "remote-mem-bw": 5}')
    run_cli("trace", "generate", "sendrecv", "--npus", "4", "--size", "1MiB", "--iterations", "3", "-o", str(tmp_path))
    run_cli("trace", "generate", "memory", "--npus", "4", "--tensor-size", "64KiB", "--count", "2",
            "-o", str(tmp_path))
    run_cli("trace", "generate", "compute", "--npus", "4", "--count", "3", "--duration-us", "7", "-o", str(tmp_path))
    link = int(500 + (1 << 20) / (50 * (1 << 30) / 1e9))
    assert simulate(tmp_path / "sendrecv", ring4).finish_ns == 3 * link
    assert simulate(tmp_path / "memory", ring4, memory=memory).finish_ns == 2 * (10 + 65536 // 5)
    assert simulate(tmp_path / "compute", ring4).finish_ns == 21_000


def test_generator_specs_match_the_generators() -> None:
    from workload.tools.generate import from_spec, sendrecv_ring

    spec = {"generate": "collective", "type": "all_gather", "size": "64KiB", "repeat": 2}
    assert from_spec(spec, 4) == gen_collective(4, CollectiveType.ALL_GATHER, 64 << 10, repeat=2)
    assert from_spec({"generate": "sendrecv", "size": 4096, "iterations": 3}, 3) == sendrecv_ring(3, 4096, iterations=3)
    for bad, message in [({"generate": "colective"}, "'generate' must be one of collective, compute"),
                         ({"generate": "collective", "type": "all_reduce"}, "needs 'size'"),
                         ({"generate": "collective", "type": "allreduce", "size": 1}, "'type' must be one of"),
                         ({"generate": "collective", "type": "all_reduce", "size": "1 MiBs"}, "'size': not a size"),
                         ({"generate": "compute", "count": -1}, "'count' must be a whole number"),
                         ({"generate": "memory", "tensor_size": 8, "access": "read"}, "load or store"),
                         ({"generate": "compute", "sizes": 1}, "unknown key(s) sizes")]:
        with pytest.raises(InputError) as e:
            from_spec(bad, 4, "sweep point")
        assert message in str(e.value) and str(e.value).startswith("sweep point: ")


def test_process_groups_node_round_trips_through_the_simulators_reader(tmp_path: Path) -> None:
    from workload.groups import metadata_groups, process_groups_node

    path = write_trace_file(tmp_path / "pg.et", [process_groups_node(0, {1: [0, 1], "2": (2, 3)})])
    graph = read_trace(str(path))
    assert metadata_groups(graph, 0) == [("1", [0, 1]), ("2", [2, 3])]
