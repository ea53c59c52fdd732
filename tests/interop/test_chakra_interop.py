"""Interop with the official ``mlc-chakra`` package (installed with --no-deps as a test oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.workload.test_reader import assert_matches_protobuf, nodes
from workload.reader import read_trace
from workload.traceset import TraceLoader, resolve_workload
from workload.writer import make_node, write_trace

pytestmark = pytest.mark.interop
et_def = pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="mlc-chakra is not installed")
protolib = pytest.importorskip("chakra.src.third_party.utils.protolib", reason="mlc-chakra is not installed")


def _write_with_chakra(path: Path, messages: list) -> None:
    with open(path, "wb") as f:
        protolib.encodeMessage(f, et_def.GlobalMetadata(version="0.0.4"))
        for m in messages:
            protolib.encodeMessage(f, m)


def _read_with_chakra(path: Path) -> tuple[object, list]:
    f = protolib.openFileRd(str(path))
    meta = et_def.GlobalMetadata()
    protolib.decodeMessage(f, meta)
    out = []
    while True:
        node = et_def.Node()
        if not protolib.decodeMessage(f, node):
            break
        out.append(node)
    f.close()
    return meta, out


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(nodes())
def test_traces_written_by_chakra_read_identically(tmp_path: Path, node_list: list) -> None:
    theirs = [et_def.Node.FromString(n.SerializeToString()) for n in node_list]
    theirs = [t for t in theirs if t.ByteSize()]  # chakra's writer cannot write an all-default node
    path = tmp_path / "t.0.et"
    _write_with_chakra(path, theirs)
    assert_matches_protobuf(path.read_bytes())


def test_traces_we_write_decode_with_chakra(tmp_path: Path) -> None:
    ours = [
        make_node(0, "", 0),  # all-default: must not be written as a zero-length message
        make_node(1, "comp", 4, data_deps=[0], duration_micros=12, attrs={"num_ops": 10, "tensor_size": 64}),
        make_node(2, "ar", 7, data_deps=[1], ctrl_deps=[0],
                  attrs={"comm_type": 0, "comm_size": 1 << 20, "involved_dim": [True, False], "pg_name": "3"}),
        make_node(3, "send", 5, attrs={"comm_src": 0, "comm_dst": 1, "comm_tag": 9, "comm_size": 8}),
    ]
    path = tmp_path / "t.0.et"
    write_trace(path, ours)
    meta, theirs = _read_with_chakra(path)
    assert meta.version == "1.0.0"
    assert [t.SerializeToString() for t in theirs[1:]] == [o.SerializeToString() for o in ours[1:]]
    assert len(theirs) == 4 and theirs[0].id == 0 and theirs[0].type == 0
    ar = {a.name: a for a in theirs[2].attr}
    assert ar["comm_size"].WhichOneof("value") == "int64_val"
    assert ar["involved_dim"].WhichOneof("value") == "bool_list"
    sd = {a.name: a for a in theirs[3].attr}
    assert sd["comm_src"].WhichOneof("value") == "int32_val"
    assert {a.name: a.WhichOneof("value") for a in theirs[1].attr} == {"num_ops": "int64_val",
                                                                       "tensor_size": "uint64_val"}


def test_astra_sim_shipped_examples_load(reference: Path) -> None:
    examples = sorted((reference / "examples" / "microbenchmarks").glob("*/*npus_1MB"))
    assert examples, "no ASTRA-sim example traces found"
    for folder in examples:
        traces = resolve_workload(str(folder))
        graphs = TraceLoader().load_set(traces, traces.num_ranks)
        for rank, graph in enumerate(graphs):
            _, theirs = _read_with_chakra(Path(traces.file_for(rank)))
            assert graph.num_nodes == len(theirs) == 1
            assert graph.node_id(0) == theirs[0].id and graph.name(0) == theirs[0].name
            attrs = {name: value for name, _, value in graph.attributes(0)}
            assert attrs == {a.name: getattr(a, a.WhichOneof("value")) for a in theirs[0].attr}


def test_reference_case_traces_match_chakra(reference: Path) -> None:
    for path in sorted((reference / "cases").glob("*/workload/trace.*.et")):
        graph = read_trace(path)
        _, theirs = _read_with_chakra(path)
        assert sorted(graph.ids.tolist()) == sorted(t.id for t in theirs)
        assert_matches_protobuf(path.read_bytes())


def test_converter_and_generator_outputs_decode_with_chakra(tmp_path: Path) -> None:
    """What convert, generate llm, rescale and synthesize write is what Chakra's own reader sees."""
    from tests.conftest import REPO, run_cli
    from workload.schema import NodeType

    fixtures = REPO / "tests" / "workload" / "fixtures"
    commands = {
        "text": ["convert", "text", str(fixtures / "text" / "transformer_fwd_in_bckwd.txt"), "--num-npus", "8"],
        "pytorch": ["convert", "pytorch", str(fixtures / "pytorch" / "gloo2"), "--kineto",
                    str(fixtures / "pytorch" / "gloo2")],
        "llm": ["generate", "llm", "--preset", "gpt3-1.3b", "--layers", "2", "--dp", "2", "--tp", "2", "--pp", "2",
                "--global-batch", "4", "--name", "llm"],
        "hybrid": ["generate", "llm", "--preset", "nemotron-3-nano", "--layers", "4", "--hybrid-layer-pattern", "M*EM",
                   "--seq-len", "1024", "--tp", "2", "--sequence-parallel", "--ep", "2", "--dp", "2",
                   "--global-batch", "4", "--name", "hybrid"],
    }
    prefixes = {}
    for name, args in commands.items():
        out = tmp_path / name / "t"
        r = run_cli("trace", *args, "-o", str(out if name not in ("llm", "hybrid") else out.parent))
        assert r.returncode == 0, r.stderr
        prefixes[name] = r.stdout.splitlines()[0]
    r = run_cli("trace", "rescale", prefixes["llm"], "--npus", "16", "-o", str(tmp_path / "rescaled" / "t"))
    assert r.returncode == 0, r.stderr
    prefixes["rescale"] = str(tmp_path / "rescaled" / "t")
    r = run_cli("trace", "synthesize", prefixes["llm"], "-o", str(tmp_path / "syn" / "t"), "--seed", "3")
    assert r.returncode == 0, r.stderr
    prefixes["synthesize"] = str(tmp_path / "syn" / "t")
    for name, prefix in prefixes.items():
        traces = resolve_workload(prefix)
        assert traces.num_ranks >= 2, name
        for rank in (0, traces.num_ranks - 1):
            path = traces.file_for(rank)
            ours = TraceLoader().load(path, rank)
            _, theirs = _read_with_chakra(Path(path))
            assert [int(n.id) for n in theirs] == ours.ids.tolist(), (name, rank)
            assert [int(n.type) for n in theirs] == ours.types.tolist(), (name, rank)
            for node in theirs:
                kinds = {a.name: a.WhichOneof("value") for a in node.attr}
                if node.type == NodeType.COMM_COLL_NODE:
                    assert kinds["comm_type"] == "int64_val" and kinds["comm_size"] == "int64_val", (name, node)
                if "pg_name" in kinds:
                    assert kinds["pg_name"] == "string_val"


def test_llm_traces_with_a_groups_file_carry_no_metadata_and_the_same_groups(tmp_path: Path) -> None:
    """--groups-file: no METADATA node in any trace (ASTRA-sim 2.x stops at one) as Chakra's reader sees them,
    and the comm-group JSON holds exactly the groups the METADATA nodes declare otherwise; both simulate alike."""
    import json

    from simulator.api import simulate
    from tests.conftest import run_cli
    from workload.groups import metadata_groups
    from workload.schema import NodeType

    base = ["trace", "generate", "llm", "--preset", "gpt3-1.3b", "--layers", "4", "--dp", "2", "--tp", "2", "--pp",
            "2", "--global-batch", "4", "--name", "llm"]
    assert run_cli(*base, "-o", str(tmp_path / "meta")).returncode == 0
    done = run_cli(*base, "-o", str(tmp_path / "file"), "--groups-file")
    assert done.returncode == 0, done.stderr
    groups_path = tmp_path / "file" / "llm.comm_groups.json"
    assert done.stdout.splitlines()[1] == str(groups_path)
    declared: dict[str, list[int]] = {}
    for rank in range(8):
        _, theirs = _read_with_chakra(tmp_path / "file" / f"llm.{rank}.et")
        assert all(node.type != NodeType.METADATA_NODE for node in theirs)
        graph = TraceLoader().load(str(tmp_path / "meta" / f"llm.{rank}.et"), rank)
        for name, ranks in metadata_groups(graph, 0) or ():
            declared[str(name)] = list(ranks)
    assert json.loads(groups_path.read_text()) == dict(sorted(declared.items(), key=lambda kv: int(kv[0])))
    network = tmp_path / "n.yml"
    network.write_text('{"topology": ["Switch"], "npus_count": [8], "bandwidth": [400], "latency": [500]}')
    with_metadata = simulate(str(tmp_path / "meta" / "llm"), str(network), device="H100")
    with_file = simulate(str(tmp_path / "file" / "llm"), str(network), comm_groups=groups_path, device="H100")
    assert with_metadata.ranks == with_file.ranks


def test_converters_write_a_groups_file_on_request(tmp_path: Path) -> None:
    """convert pytorch / text --groups-file: the same traces without METADATA nodes (as Chakra's reader sees
    them) and the groups in PREFIX.comm_groups.json; the two forms simulate alike."""
    from simulator.api import simulate
    from tests.conftest import REPO, run_cli
    from workload.schema import NodeType

    fixtures = REPO / "tests" / "workload" / "fixtures"
    cases = {"pytorch": (["convert", "pytorch", str(fixtures / "pytorch" / "v1_1_0_groups")], 4, "H100"),
             "text": (["convert", "text", str(fixtures / "text" / "transformer_fwd_in_bckwd.txt"), "--num-npus",
                       "8"], 8, None)}
    for name, (args, npus, device) in cases.items():
        plain, split = tmp_path / name / "plain", tmp_path / name / "split"
        assert run_cli("trace", *args, "-o", str(plain)).returncode == 0
        done = run_cli("trace", *args, "-o", str(split), "--groups-file")
        assert done.returncode == 0, done.stderr
        for rank in range(npus):
            _, theirs = _read_with_chakra(Path(f"{split}.{rank}.et"))
            assert all(node.type != NodeType.METADATA_NODE for node in theirs), name
        network = tmp_path / name / "n.yml"
        network.write_text(f'{{"topology": ["Ring"], "npus_count": [{npus}], "bandwidth": [50], "latency": [500]}}')
        a = simulate(str(plain), str(network), device=device)
        b = simulate(str(split), str(network), comm_groups=f"{split}.comm_groups.json", device=device)
        assert a.ranks == b.ranks, name
