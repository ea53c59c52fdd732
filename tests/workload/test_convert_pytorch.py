"""``astrasim-py trace convert pytorch``: PyTorch host execution traces (+ Kineto) into runnable Chakra ET.

Fixtures (tests/workload/fixtures/pytorch/): ``gloo2`` was recorded by make_fixtures.py (2 real gloo
processes, with a manifest of what the step did); ``v1_0_2_nccl``, ``v1_0_4_kineto``, ``v1_1_0_groups``
and ``v1_1_1_linked`` are hand-written to the schemas PyTorch versions other than the installed one write.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from network.config import network_from_dict
from simulator.api import simulate
from tests.conftest import REPO, run_cli
from workload.convert.pytorch import convert
from workload.convert.pytorch_groups import GroupTable
from workload.errors import InputError
from workload.graph import TraceGraph
from workload.schema import CollectiveType, NodeType
from workload.traceset import TraceLoader, resolve_workload
from workload.validate import validate

FIXTURES = Path(__file__).parent / "fixtures" / "pytorch"
GLOO = FIXTURES / "gloo2"
MANIFEST = json.loads((GLOO / "manifest.json").read_text())
COMM = (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)


def _hosts(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("host_rank*.json*"))


def _load(prefix: Path) -> list[TraceGraph]:
    traces = resolve_workload(str(prefix))
    graphs = [TraceLoader().load(traces.file_for(r), r) for r in range(traces.num_ranks or 1)]
    for g in graphs:
        validate(g)  # loads, no dangling or cyclic dependency
        for i in range(g.num_nodes):  # and every dependency points to an earlier node
            assert all(d < g.node_id(i) for d in g.data_deps_of(i) + g.ctrl_deps_of(i))
    return graphs


def _nodes(g: TraceGraph, *types: int) -> list[int]:
    return [i for i in range(g.num_nodes) if int(g.types[i]) in types]


def _run(prefix: Path, npus: int) -> Any:
    net = network_from_dict({"topology": ["Ring"], "npus_count": [npus], "bandwidth": [50.0], "latency": [500.0]})
    return simulate(prefix, net, None)


def _kineto_durations(path: Path) -> dict[int, float]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return {e["args"]["Record function id"]: e["dur"] for e in doc["traceEvents"]
            if e.get("ph") == "X" and "Record function id" in e.get("args", {})}


def test_real_gloo_step_converts_with_the_recorded_collectives_and_runs(tmp_path: Path) -> None:
    warnings: list[str] = []
    paths = convert(_hosts(GLOO), str(tmp_path / "gloo"), warn=warnings.append)
    assert [Path(p).name for p in paths] == ["gloo.0.et", "gloo.1.et"]
    graphs = _load(tmp_path / "gloo")
    for rank, g in enumerate(graphs):
        colls = _nodes(g, NodeType.COMM_COLL_NODE)
        assert [(CollectiveType(g.attribute(i, "comm_type")).name, g.attribute(i, "comm_size")) for i in colls] == \
            [(c["type"], c["size_bytes"]) for c in MANIFEST["collectives"]]
        assert g.attribute(colls[0], "comm_size") == MANIFEST["gradient_bytes"]
        assert all(g.attribute(i, "pg_name") is None for i in colls)  # the default group only
        assert not _nodes(g, NodeType.METADATA_NODE)
        p2p = _nodes(g, NodeType.COMM_SEND_NODE if rank == MANIFEST["send"]["src"] else NodeType.COMM_RECV_NODE)
        assert len(p2p) == 1 and len(_nodes(g, *COMM)) == len(colls) + 1
        send = MANIFEST["send"]
        assert [g.attribute(p2p[0], k) for k in ("comm_src", "comm_dst", "comm_tag", "comm_size")] == \
            [send["src"], send["dst"], send["tag"], send["size_bytes"]]
        compute = _nodes(g, NodeType.COMP_NODE)
        names = [g.name(i) for i in compute]
        # top-level operators only: the linears' nested addmm/t are not counted again, views are folded
        assert names.count("aten::linear") == len(MANIFEST["matmul_flops_forward"]) and "aten::addmm" not in names
        assert names.count("aten::mm") == 3 and not {"aten::t", "aten::view", "aten::empty"} & set(names)
        linears = [i for i in compute if g.name(i) == "aten::linear"]
        assert [g.attribute(i, "num_ops") for i in linears] == MANIFEST["matmul_flops_forward"]
        assert all(g.attribute(i, "tensor_size") > 0 for i in compute)
    assert any("no operator timing" in w for w in warnings)
    result = _run(tmp_path / "gloo", 2)
    assert result.finish_ns > 0 and all(r.finish_ns > 0 for r in result.ranks)
    system = json.loads((REPO / "configs" / "system" / "default.json").read_text())
    system.update({"roofline-enabled": 1, "peak-perf": 0.001, "local-mem-bw": 1000})
    (tmp_path / "roofline.json").write_text(json.dumps(system))
    net = network_from_dict({"topology": ["Ring"], "npus_count": [2], "bandwidth": [50.0], "latency": [500.0]})
    timed = simulate(tmp_path / "gloo", net, tmp_path / "roofline.json")  # timed by num_ops and tensor_size
    compute = _nodes(graphs[0], NodeType.COMP_NODE)
    flops = sum(graphs[0].attribute(i, "num_ops") for i in compute)
    assert timed.ranks[0].compute_ns >= flops - len(compute)  # at most 1e9 ops/s = 1 op/ns, truncated


def test_data_dependencies_follow_tensors_and_async_collectives_do_not_block(tmp_path: Path) -> None:
    convert(_hosts(GLOO), str(tmp_path / "g"))
    g = _load(tmp_path / "g")[0]
    by_name: dict[str, list[int]] = {}
    for i in range(g.num_nodes):
        by_name.setdefault(g.name(i), []).append(g.node_id(i))
    allreduce = by_name["c10d::allreduce_"][0]
    cat, div = by_name["aten::cat"][0], by_name["aten::div_"][0]
    index = {g.node_id(i): i for i in range(g.num_nodes)}
    assert cat in g.data_deps_of(index[allreduce])  # the bucket it reduces
    assert allreduce in g.data_deps_of(index[div])  # waited for through the data, not program order
    first_linear, relu = by_name["aten::linear"][0], by_name["aten::relu"][0]
    assert g.data_deps_of(index[relu]) == [first_linear]
    # hand-written merged trace: aten::mul after an async all-reduce waits only for the previous op
    convert(_hosts(FIXTURES / "v1_1_1_linked"), str(tmp_path / "l"))
    g = _load(tmp_path / "l")[0]
    index = {g.name(i): i for i in range(g.num_nodes)}
    assert g.ctrl_deps_of(index["aten::mul"]) == [g.node_id(index["aten::mm"])]
    assert g.data_deps_of(index["aten::div"]) == [g.node_id(index["c10d::allreduce_"])]


def test_kineto_durations_and_ranks_are_used(tmp_path: Path) -> None:
    hosts = list(reversed(_hosts(GLOO)))  # rank 1 first: the Kineto traces' distributedInfo puts it right
    kineto = [str(GLOO / f"kineto_rank{r}.json.gz") for r in (0, 1)]
    convert(hosts, str(tmp_path / "k"), kineto, warn=lambda m: None)
    graphs = _load(tmp_path / "k")
    assert _nodes(graphs[0], NodeType.COMM_SEND_NODE) and _nodes(graphs[1], NodeType.COMM_RECV_NODE)
    for rank, g in enumerate(graphs):
        durations = _kineto_durations(GLOO / f"kineto_rank{rank}.json.gz")
        compute = _nodes(g, NodeType.COMP_NODE)
        for i in compute:
            assert int(g.duration_micros[i]) == round(durations[g.attribute(i, "rf_id")])
            assert g.attribute(i, "is_cpu_op") is False  # a CPU-only run: the CPU is the device
        assert sum(int(g.duration_micros[i]) for i in compute) > 0
    result = _run(tmp_path / "k", 2)
    compute_us = sum(int(graphs[0].duration_micros[i]) for i in _nodes(graphs[0], NodeType.COMP_NODE))
    assert result.ranks[0].compute_ns >= compute_us * 1000 * 0.99


def test_gpu_kernel_time_from_kineto(tmp_path: Path) -> None:
    folder = FIXTURES / "v1_0_4_kineto"
    warnings: list[str] = []
    convert([str(folder / "host_rank1.json"), str(folder / "host_rank0.json")], str(tmp_path / "k"),
            [str(folder / "kineto_rank0.json"), str(folder / "kineto_rank1.json")], warn=warnings.append)
    for rank, g in enumerate(_load(tmp_path / "k")):
        by_name = {g.name(i): i for i in range(g.num_nodes)}
        mm, item, relu = by_name["aten::mm"], by_name["aten::item"], by_name["aten::relu"]
        assert int(g.duration_micros[mm]) == 40 + rank  # the GEMM kernel, not the 12 µs host op
        assert g.attribute(mm, "num_ops") == 2 * 128 * 256 * 64 and g.attribute(mm, "is_cpu_op") is False
        assert int(g.duration_micros[relu]) == 10  # two kernels, one found through the launch's correlation
        assert g.attribute(item, "is_cpu_op") is True and int(g.duration_micros[item]) == 9  # no kernel: host
        gather, bcast = by_name["c10d::_allgather_base_"], by_name["c10d::broadcast_"]
        assert g.attribute(gather, "comm_type") == CollectiveType.ALL_GATHER
        assert g.attribute(gather, "comm_size") == 128 * 64 * 2  # the per-rank input, bf16
        assert int(g.duration_micros[bcast]) == 33 and g.attribute(bcast, "comm_size") == 4000
        assert "c10d::barrier" not in by_name
    assert any("c10d::barrier x2" in w for w in warnings)
    assert _run(tmp_path / "k", 2).finish_ns > 0


def test_schema_1_0_2_backend_id_groups_and_point_to_point_records(tmp_path: Path) -> None:
    convert(_hosts(FIXTURES / "v1_0_2_nccl"), str(tmp_path / "t"))
    graphs = _load(tmp_path / "t")
    for rank, g in enumerate(graphs):
        (coll,) = _nodes(g, NodeType.COMM_COLL_NODE)
        assert g.attribute(coll, "comm_type") == CollectiveType.ALL_REDUCE and g.attribute(coll, "comm_size") == 1024
        (p2p,) = _nodes(g, NodeType.COMM_SEND_NODE if rank == 0 else NodeType.COMM_RECV_NODE)
        assert (g.attribute(p2p, "comm_src"), g.attribute(p2p, "comm_dst"), g.attribute(p2p, "comm_size")) == \
            (0, 1, 1024)
        assert [g.name(i) for i in _nodes(g, NodeType.COMP_NODE)] == ["aten::linear", "aten::relu", "aten::sum"]
        assert g.num_nodes == 5  # the 'wait' record is not a node
    assert _run(tmp_path / "t", 2).finish_ns > 0


def test_schema_1_1_0_process_groups_become_communicator_groups(tmp_path: Path) -> None:
    convert(_hosts(FIXTURES / "v1_1_0_groups"), str(tmp_path / "t"))
    graphs = _load(tmp_path / "t")
    expected_groups = [{"pg_name": "1", "ranks": [0, 1]}, {"pg_name": "2", "ranks": [2, 3]},
                       {"pg_name": "3", "ranks": [0, 2]}, {"pg_name": "4", "ranks": [1, 3]}]
    for rank, g in enumerate(graphs):
        (meta,) = _nodes(g, NodeType.METADATA_NODE)
        assert g.node_id(meta) == 0 and not g.data_deps_of(meta) and not g.ctrl_deps_of(meta)
        assert json.loads(eval(g.io_info(meta, "inputs")["values"])[0]) == expected_groups
        ar, ag, rs = _nodes(g, NodeType.COMM_COLL_NODE)
        assert g.attribute(ar, "pg_name") == ("1" if rank < 2 else "2")  # data-parallel pair, decimal name
        assert g.attribute(ar, "comm_size") == 4096 * 2  # in_msg_nelems x BFloat16
        assert g.attribute(ag, "pg_name") is None and g.attribute(ag, "comm_type") == CollectiveType.ALL_GATHER
        assert g.attribute(rs, "pg_name") == ("3" if rank % 2 == 0 else "4")  # hash names, numbered after
        assert g.attribute(rs, "comm_size") == 2 * 4096 * 2
    result = _run(tmp_path / "t", 4)
    assert all(r.finish_ns > 0 for r in result.ranks)


def test_linked_trace_durations_without_kineto(tmp_path: Path) -> None:
    warnings: list[str] = []
    convert(_hosts(FIXTURES / "v1_1_1_linked"), str(tmp_path / "t"), warn=warnings.append)
    g = _load(tmp_path / "t")[0]
    durations = {g.name(i): int(g.duration_micros[i]) for i in range(g.num_nodes)}
    assert durations == {"aten::mm": 23, "c10d::allreduce_": 40, "aten::mul": 4, "aten::div": 5}
    assert not warnings


def test_cli_converts_folders_and_the_result_simulates(tmp_path: Path) -> None:
    prefix = tmp_path / "out" / "gloo"
    done = run_cli("trace", "convert", "pytorch", str(GLOO), "--kineto", str(GLOO), "-o", str(prefix))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(prefix)]
    assert (tmp_path / "out" / "gloo.0.et").exists() and (tmp_path / "out" / "gloo.1.et").exists()
    net = tmp_path / "ring2.yml"
    net.write_text("topology: [Ring]\nnpus_count: [2]\nbandwidth: [50]\nlatency: [500]\n")
    sim = run_cli("--workload", str(prefix), "--network", str(net))
    assert sim.returncode == 0, sim.stderr
    assert "over 2 ranks" in sim.stdout


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (command-line arguments after 'pytorch', the file the error must name)."""
    text = tmp / "notes.json"
    text.write_text("this is not JSON\n")
    old = tmp / "old.json"
    old.write_text(json.dumps({"schema": "1.0.1", "pid": 1, "nodes": [{"id": 1, "name": "x", "parent": 1}]}))
    loop = tmp / "loop.json"
    loop.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": [
        {"id": 5, "name": "aten::mm", "ctrl_deps": 6}, {"id": 6, "name": "aten::mm", "ctrl_deps": 5}]}))
    renamed = tmp / "renamed_kineto.json"
    doc = json.loads((FIXTURES / "v1_0_4_kineto" / "kineto_rank0.json").read_text())
    for e in doc["traceEvents"]:
        e["name"] = "aten::other"
    renamed.write_text(json.dumps(doc))
    kineto0 = str(FIXTURES / "v1_0_4_kineto" / "kineto_rank0.json")
    host0 = str(FIXTURES / "v1_0_4_kineto" / "host_rank0.json")
    return {
        "not json": ([str(text)], str(text)),
        "not an execution trace": ([kineto0], kineto0),
        "unsupported schema": ([str(old)], str(old)),
        "parent cycle": ([str(loop)], str(loop)),
        "kineto of another process": ([str(GLOO / "host_rank0.json.gz"), "--kineto", kineto0], kineto0),
        "kineto of another window": ([host0, "--kineto", str(renamed)], str(renamed)),
        "missing file": ([str(tmp / "absent.json")], str(tmp / "absent.json")),
    }


def test_bad_inputs_give_one_line_errors_through_the_cli(tmp_path: Path) -> None:
    for name, (args, culprit) in _bad_inputs(tmp_path).items():
        done = run_cli("trace", "convert", "pytorch", *args, "-o", str(tmp_path / "out" / "x"))
        assert done.returncode == 1, (name, done.stderr)
        assert "Traceback" not in done.stderr, name
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and culprit in lines[0], (name, done.stderr)
    assert not (tmp_path / "out").exists()


def test_bad_inputs_raise_input_errors(tmp_path: Path) -> None:
    cases = _bad_inputs(tmp_path)
    with pytest.raises(InputError, match=re.escape("'ctrl_deps' (parent) links form a cycle: 5 -> 6 -> 5")):
        convert(cases["parent cycle"][0], str(tmp_path / "x"))
    with pytest.raises(InputError, match=re.escape("unsupported execution-trace schema '1.0.1'")):
        convert(cases["unsupported schema"][0], str(tmp_path / "x"))


def test_groups_must_agree_between_ranks(tmp_path: Path) -> None:
    table = GroupTable(4)
    table.add_config([{"pg_name": "1", "ranks": [0, 1]}], "a.json")
    with pytest.raises(InputError, match=re.escape("'1' has ranks [0, 2] but a.json gives it ranks [0, 1]")):
        table.add_config([{"pg_name": "1", "ranks": [0, 2]}], "b.json")
    with pytest.raises(InputError, match="has rank 6, but only 4 host traces"):
        table.add_config([{"pg_name": "2", "ranks": [6, 7]}], "c.json")


def test_a_folder_with_traces_of_both_kinds_separates_them(tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    shutil.copytree(GLOO, folder)
    (folder / "manifest.json").unlink()
    convert(_hosts(folder), str(tmp_path / "a"))
    from workload.convert.pytorch import expand_inputs
    assert [Path(p).name for p in expand_inputs([str(folder)], "host")] == ["host_rank0.json.gz",
                                                                            "host_rank1.json.gz"]
    assert [Path(p).name for p in expand_inputs([str(folder)], "kineto")] == ["kineto_rank0.json.gz",
                                                                              "kineto_rank1.json.gz"]


# Random host traces: whatever the call tree, threads, tensors and collectives, the output is acyclic.
_OP = st.tuples(st.integers(0, 30), st.integers(1, 2), st.sampled_from(["aten::mm", "aten::add", "aten::view",
                                                                          "c10d::allreduce_", "aten::relu"]),
                st.lists(st.integers(1, 6), max_size=3), st.lists(st.integers(1, 6), max_size=2), st.booleans())


def _random_trace(ops: list[tuple[int, int, str, list[int], list[int], bool]]) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1}]
    for tid in (1, 2):
        nodes.append({"id": tid + 1, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 1,
                      "attrs": [{"name": "tid", "type": "uint64", "value": tid}]})
    for k, (parent_pick, tid, name, reads, writes, async_op) in enumerate(ops):
        node_id = k + 4
        earlier = [n["id"] for n in nodes[3:] if n["tid"] == tid] if len(nodes) > 3 else []
        parent = earlier[parent_pick % len(earlier)] if earlier and parent_pick % 3 == 0 else tid + 1

        def io(storages: list[int]) -> dict[str, Any]:
            return {"values": [[s * 10, s, 0, 16, 4, "cuda:0"] for s in storages],
                    "shapes": [[4, 4]] * len(storages), "types": ["Tensor(float)"] * len(storages)}
        inputs = io(reads)
        if name.startswith("c10d::"):
            inputs["values"].append(async_op)
            inputs["shapes"].append([])
            inputs["types"].append("Bool")
        nodes.append({"id": node_id, "name": name, "ctrl_deps": parent, "tid": tid, "inputs": inputs,
                      "outputs": io(writes),
                      "attrs": [{"name": "tid", "type": "uint64", "value": tid},
                                {"name": "rf_id", "type": "uint64", "value": node_id},
                                {"name": "op_schema", "type": "string", "value":
                                 "c10d::allreduce_(Tensor[] tensors, bool async_op=True) -> Tensor[]"
                                 if name.startswith("c10d::") else f"{name}(Tensor self) -> Tensor"}]})
    for n in nodes:
        n.pop("tid", None)
    return {"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": nodes}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_OP, max_size=25))
def test_any_host_trace_converts_to_an_acyclic_graph(tmp_path: Path, ops: list[Any]) -> None:
    path = tmp_path / "random.json"
    path.write_text(json.dumps(_random_trace(ops)))
    convert([str(path)], str(tmp_path / "r"))
    g = _load(tmp_path / "r")[0]
    nodes = {n["id"]: n for n in _random_trace(ops)["nodes"]}
    children: dict[int, list[int]] = {}
    for n in nodes.values():
        children.setdefault(n["ctrl_deps"], []).append(n["id"])

    def subtree(i: int) -> list[dict[str, Any]]:
        return [nodes[i]] + [m for c in children.get(i, []) if c != i for m in subtree(c)]
    expected = []  # top-level operators that do work (or communicate something)
    for i, n in nodes.items():
        if i > 3 and n["ctrl_deps"] in (2, 3):
            tree = subtree(i)
            if n["name"].startswith("c10d::"):
                if len(n["inputs"]["values"]) > 1:
                    expected.append(i)
            elif any(m["name"] != "aten::view" for m in tree):
                expected.append(i)
    assert [g.node_id(i) for i in range(g.num_nodes)] == sorted(expected)
    assert all(int(g.types[i]) in (NodeType.COMP_NODE, NodeType.COMM_COLL_NODE) for i in range(g.num_nodes))


def test_one_rank_of_a_larger_job_converts_with_a_warning(tmp_path: Path) -> None:
    """One host trace of a 2-rank job: a 1-rank output, said out loud; run on every NPU it simulates."""
    warnings: list[str] = []
    (path,) = convert([str(FIXTURES / "v1_1_1_linked" / "host_rank0.json")], str(tmp_path / "t"),
                      warn=warnings.append)
    assert any("recorded in a job of 2 ranks, but 1 host trace(s) were given" in w for w in warnings)
    net = network_from_dict({"topology": ["Ring"], "npus_count": [2], "bandwidth": [50], "latency": [500]})
    assert simulate(path, net).finish_ns > 0
    warnings.clear()
    convert([str(FIXTURES / "v1_1_1_linked" / f"host_rank{r}.json") for r in (0, 1)], str(tmp_path / "both"),
            warn=warnings.append)
    assert not any("recorded in a job" in w for w in warnings)


def test_operators_carry_their_shapes_for_the_kernel_model(tmp_path: Path) -> None:
    """Matrix products become GEMM shapes whose FLOPs are the node's num_ops; known memory-bound operators get
    their class; the converted step then runs under --compute-model kernels."""
    convert(_hosts(GLOO), str(tmp_path / "t"))
    g = _load(tmp_path / "t")[0]
    gemms = [i for i in _nodes(g, NodeType.COMP_NODE) if g.attribute(i, "op_class") == "gemm"]
    assert {g.name(i) for i in gemms} == {"aten::linear", "aten::mm"} and len(gemms) == 5
    for i in gemms:
        m, n, k = (g.attribute(i, key) for key in ("gemm_m", "gemm_n", "gemm_k"))
        assert 2 * m * n * k * g.attribute(i, "gemm_batch") == g.attribute(i, "num_ops")
        assert g.attribute(i, "dtype") == "fp32"
    classes = {g.name(i): g.attribute(i, "op_class") for i in _nodes(g, NodeType.COMP_NODE)}
    assert classes["aten::relu"] == classes["aten::threshold_backward"] == "activation"
    assert classes["aten::div_"] == "elementwise"
    warnings: list[str] = []
    net = network_from_dict({"topology": ["Ring"], "npus_count": [2], "bandwidth": [50.0], "latency": [500.0]})
    result = simulate(tmp_path / "t", net, None, warn=warnings.append, device="A100", compute_model="kernels")
    assert result.finish_ns > 0
    assert not [w for w in warnings if "no usable operator shape" in w]  # every compute node has a class here
