"""Every kind of broken trace gets a one-line error naming the file, rank and node (or byte offset)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.conftest import run_cli, trace_bytes, write_trace_file
from workload.errors import TraceError
from workload.reader import read_trace
from workload.schema import NodeType
from workload.traceset import TraceLoader
from workload.writer import make_node


def _coll(node_id: int, **extra: object) -> object:
    attrs = {"comm_type": 0, "comm_size": 1024, **extra}
    return make_node(node_id, f"c{node_id}", NodeType.COMM_COLL_NODE, attrs=attrs)


def _load_error(path: Path, rank: int = 0, **kw: object) -> str:
    with pytest.raises(TraceError) as info:
        TraceLoader(**kw).load(str(path), rank)
    return str(info.value)


def test_truncated_file_names_the_byte_offset(tmp_path: Path) -> None:
    data = trace_bytes([make_node(i, "n", 4, duration_micros=1) for i in range(10)])
    path = tmp_path / "t.0.et"
    path.write_bytes(data[:-3])
    msg = _load_error(path)
    assert str(path) in msg and "rank 0" in msg and "byte offset" in msg and "truncated" in msg


def test_non_protobuf_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "t.0.et"
    path.write_text("this is a text file, not a trace\n" * 20)
    msg = _load_error(path)
    assert str(path) in msg and "byte offset" in msg


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "t.0.et"
    path.write_bytes(b"")
    assert "empty file" in _load_error(path)


def test_corrupt_gzip(tmp_path: Path) -> None:
    path = tmp_path / "t.0.et"
    path.write_bytes(gzip.compress(trace_bytes([make_node(1, "n", 4)]))[:-8])
    assert "gzip" in _load_error(path)


def test_file_without_metadata(tmp_path: Path) -> None:
    from workload.wire import frame_payloads
    path = tmp_path / "t.0.et"
    path.write_bytes(frame_payloads([make_node(5, "n", 4, duration_micros=3).SerializeToString()] * 2))
    assert "GlobalMetadata" in _load_error(path)


def test_corrupt_node_bytes(tmp_path: Path) -> None:
    from workload.wire import frame_payloads
    from workload.writer import make_metadata, serialize
    path = tmp_path / "t.0.et"
    path.write_bytes(frame_payloads([serialize(make_metadata()), b"\x08\x01\x0f\xff"]))  # wire type 7
    msg = _load_error(path)
    assert "wire type" in msg and "byte offset" in msg


def test_duplicate_node_ids(tmp_path: Path) -> None:
    path = write_trace_file(tmp_path / "t.3.et", [make_node(7, "a", 4), make_node(7, "b", 4)])
    msg = _load_error(path, rank=3)
    assert "rank 3" in msg and "node 7" in msg and "duplicate" in msg


def test_dangling_dependency_is_an_error_by_default(tmp_path: Path) -> None:
    path = write_trace_file(tmp_path / "t.0.et", [make_node(1, "a", 4), make_node(2, "b", 4, ctrl_deps=[99])])
    msg = _load_error(path)
    assert "node 2" in msg and "99" in msg and "--drop-dangling-deps" in msg


def test_dangling_dependency_can_be_dropped_with_a_counted_warning(tmp_path: Path) -> None:
    nodes = [make_node(1, "a", 4), make_node(2, "b", 4, ctrl_deps=[99, 98], data_deps=[1, 99])]
    path = write_trace_file(tmp_path / "t.0.et", nodes)
    warnings: list[str] = []
    graph = TraceLoader(drop_dangling=True, warn=warnings.append).load(str(path), 0)
    assert graph.num_nodes == 2
    assert any("dropped 3 dependencies on 2 node(s)" in w for w in warnings)


def test_self_dependency_is_a_cycle(tmp_path: Path) -> None:
    path = write_trace_file(tmp_path / "t.0.et", [make_node(4, "a", 4, ctrl_deps=[4])])
    msg = _load_error(path)
    assert "cycle" in msg and "node 4" in msg


def test_cycle_names_its_nodes(tmp_path: Path) -> None:
    nodes = [make_node(1, "a", 4), make_node(2, "b", 4, data_deps=[1, 4]), make_node(3, "c", 4, data_deps=[2]),
             make_node(4, "d", 4, data_deps=[3])]
    msg = _load_error(write_trace_file(tmp_path / "t.0.et", nodes))
    assert "cycle" in msg
    for node_id in ("2", "3", "4"):
        assert node_id in msg.split("dependency cycle:")[1]


def test_unknown_node_type(tmp_path: Path) -> None:
    msg = _load_error(write_trace_file(tmp_path / "t.0.et", [make_node(3, "a", 12)]))
    assert "node 3" in msg and "unknown node type 12" in msg


@pytest.mark.parametrize("missing", ["comm_type", "comm_size"])
def test_collective_without_required_attribute(tmp_path: Path, missing: str) -> None:
    attrs = {"comm_type": 0, "comm_size": 1024}
    del attrs[missing]
    node = make_node(5, "ar", NodeType.COMM_COLL_NODE, attrs=attrs)
    msg = _load_error(write_trace_file(tmp_path / "t.0.et", [node]))
    assert "node 5" in msg and missing in msg and "COMM_COLL_NODE" in msg


def test_send_without_destination(tmp_path: Path) -> None:
    node = make_node(1, "s", NodeType.COMM_SEND_NODE, attrs={"comm_size": 8, "comm_tag": 1})
    assert "comm_dst" in _load_error(write_trace_file(tmp_path / "t.0.et", [node]))


def test_attribute_of_the_wrong_type(tmp_path: Path) -> None:
    node = make_node(1, "c", NodeType.COMM_COLL_NODE, attrs=[("comm_type", 0), ("comm_size", "string_val", "1MB")])
    msg = _load_error(write_trace_file(tmp_path / "t.0.et", [node]))
    assert "node 1" in msg and "comm_size" in msg and "string_val" in msg


def test_unknown_collective_type(tmp_path: Path) -> None:
    msg = _load_error(write_trace_file(tmp_path / "t.0.et", [_coll(1, comm_type=42)]))
    assert "comm_type 42" in msg


def test_integer_attributes_accept_any_integer_encoding(tmp_path: Path) -> None:
    node = make_node(1, "c", NodeType.COMM_COLL_NODE,
                     attrs=[("comm_type", "uint32_val", 2), ("comm_size", "sfixed64_val", 4096)])
    graph = TraceLoader().load(str(write_trace_file(tmp_path / "t.0.et", [node])), 0)
    assert graph.attrs.integers("comm_size", 1)[0].tolist() == [4096]
    assert graph.attrs.integers("comm_type", 1)[0].tolist() == [2]


def test_zero_length_message_is_read_with_a_warning(tmp_path: Path) -> None:
    from workload.wire import frame_payloads
    from workload.writer import make_metadata, serialize
    path = tmp_path / "t.0.et"
    path.write_bytes(frame_payloads([serialize(make_metadata()), b"", make_node(3, "x", 4).SerializeToString()]))
    graph = read_trace(path)
    assert graph.ids.tolist() == [0, 3] and "zero-length" in graph.warnings[0]


def _broken(path: Path, case: str) -> None:
    if case == "truncated":
        path.write_bytes(trace_bytes([make_node(i, "n", 4) for i in range(5)])[:-2])
    elif case == "text":
        path.write_text("hello\n" * 100)
    elif case == "cycle":
        write_trace_file(path, [make_node(1, "a", 4, data_deps=[2]), make_node(2, "b", 4, data_deps=[1])])
    elif case == "dangling":
        write_trace_file(path, [make_node(1, "a", 4, data_deps=[7])])
    elif case == "missing-attr":
        write_trace_file(path, [make_node(1, "a", NodeType.COMM_COLL_NODE)])


def _one_line_error(result: object) -> str:
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("astrasim-py: error:"), result.stderr
    return lines[0]


@pytest.mark.parametrize("case", ["truncated", "text", "no-such-file"])
def test_cli_reports_undecodable_traces_on_one_line_without_traceback(tmp_path: Path, case: str) -> None:
    _broken(tmp_path / "t.0.et", case)
    target = str(tmp_path / "nothing") if case == "no-such-file" else str(tmp_path / "t")
    for tool in ("inspect", "jsonize", "analyze"):
        _one_line_error(run_cli("trace", tool, target))


@pytest.mark.parametrize("case", ["cycle", "dangling", "missing-attr"])
def test_semantic_problems_stop_a_simulation_but_not_the_inspection_tools(tmp_path: Path, case: str) -> None:
    _broken(tmp_path / "t.0.et", case)
    _broken(tmp_path / "t.1.et", case)
    network = tmp_path / "two.yml"
    network.write_text("topology: [ Ring ]\nnpus_count: [ 2 ]\nbandwidth: [ 50 ]\nlatency: [ 500 ]\n")
    line = _one_line_error(run_cli("--workload", str(tmp_path / "t"), "--network", str(network)))
    assert "rank 0" in line and "node" in line
    shown = run_cli("trace", "inspect", str(tmp_path / "t"))
    assert shown.returncode == 0, shown.stderr
    assert "would not simulate as is:" in shown.stdout and line.split("node", 1)[1] in shown.stdout


def test_an_old_schema_collective_without_a_size_says_its_version(tmp_path: Path) -> None:
    """A Chakra 0.0.4 collective marked as a GPU op (is_cpu_op false) but without comm_size cannot run in any
    ASTRA-sim: refused, saying which schema the file is and that no other field holds the value; `trace inspect`
    prints the version. (Without is_cpu_op as well, as in ASTRA-sim's 2.0-era ResNet-50 set, the collective is
    read as that era read it: tests/workload/test_legacy.py.)"""
    from tests.conftest import run_cli
    from workload.schema import NodeType
    from workload.traceset import TraceLoader
    from workload.writer import make_node, write_trace

    path = tmp_path / "old.0.et"
    write_trace(path, [make_node(55, "COMM_COLL_NODE_fc1000_ALLREDUCE", NodeType.COMM_COLL_NODE,
                                 attrs={"is_cpu_op": False, "comm_type": 0, "involved_dim": [True]})],
                version="0.0.4")
    with pytest.raises(TraceError, match=r"Chakra schema 0\.0\.4 and holds no such value"):
        TraceLoader().load(str(path), 0)
    assert "Chakra schema version: 0.0.4" in run_cli("trace", "inspect", str(path)).stdout
