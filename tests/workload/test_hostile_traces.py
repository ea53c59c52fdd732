"""Hostile and broken traces: every one decodes or is refused with a one-line InputError naming the file, rank
and node or byte offset, quickly and within bounded memory; never another exception, a hang or a huge
allocation."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import main
from tests.conftest import REPO, run_cli, trace_bytes, write_trace_file
from workload import schema
from workload.errors import InputError, LimitError, TraceError
from workload.reader import decode_trace
from workload.tools import analyze, inspect_trace, visualize
from workload.tools import generate as gen
from workload.tools.jsonize import metadata_record, node_records
from workload.traceset import TraceLoader, resolve_workload
from workload.validate import validate
from workload.wire import encode_varint, frame_payloads
from workload.writer import make_metadata, make_node, serialize

SHIPPED = REPO / "configs" / "workloads" / "all_reduce" / "8npus_1MiB" / "all_reduce.0.et"
SECONDS_PER_TRACE = 2.0  # decoding and showing one small mutant takes milliseconds; this is a hang detector
CHAKRA_FAMILIES = 14  # the trace families of mlc-chakra's generator (its main() writes them all)


def rich_trace() -> bytes:
    """Every sub-message kind the reader decodes: inputs/outputs, every attribute value type and list."""
    attrs: list[tuple[str, str, Any]] = [("is_cpu_op", "bool_val", False), ("comm_type", "int64_val", 0),
                                         ("comm_size", "uint64_val", 4096), ("pg_name", "string_val", "1")]
    for tname, _, _ in schema.ATTRIBUTE_VALUE_TYPES:
        scalar = b"ab" if tname == "bytes" else "s" if tname == "string" else 1.5 if tname in ("double", "float") \
            else True if tname == "bool" else 7
        attrs += [(f"{tname}_v", f"{tname}_val", scalar), (f"{tname}_l", f"{tname}_list", [scalar, scalar])]
    nodes = [make_node(1, "coll", schema.NodeType.COMM_COLL_NODE, attrs=attrs,
                       inputs={"values": "[[1,2,3,4,5,'cuda:0']]", "shapes": "[[4]]", "types": "['Tensor(float)']"},
                       outputs={"values": "[]", "shapes": "[]", "types": "[]"}),
             make_node(2, "comp", schema.NodeType.COMP_NODE, data_deps=[1], ctrl_deps=[1], duration_micros=3,
                       attrs={"num_ops": 10, "tensor_size": 8})]
    return frame_payloads([serialize(make_metadata("0.0.4", {"schema": "1.0.2", "list": [1, 2]}))]
                          + [serialize(n) for n in nodes])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Shipped, generated (microbenchmarks, LLM), official-generator and hand-made traces."""
    root = tmp_path_factory.mktemp("corpus")
    traces = {"shipped all_reduce": SHIPPED.read_bytes(), "rich": rich_trace()}
    for name, made in (("collective", gen.collective(2, schema.CollectiveType.ALL_GATHER, 1 << 20, repeat=2,
                                                      pg_name="0", involved_dim=[True, False])),
                       ("sendrecv", gen.sendrecv_ring(2, 4096, iterations=2)),
                       ("compute", gen.compute(1, 3, num_ops=100, tensor_size=64)),
                       ("memory", gen.memory(1, 1024, kind="store", count=2))):
        gen.write_rank_traces(str(root / name), made)
        traces[name] = (root / f"{name}.0.et").read_bytes()
    assert main(["trace", "generate", "llm", "--preset", "mixtral-8x7b", "--layers", "1", "--dp", "2", "--ep", "2",
                 "--pp", "1", "--micro-batches", "2", "--zero", "1", "-o", str(root / "llm")]) == 0
    traces["llm"] = next((root / "llm").glob("*.1.et")).read_bytes()
    for path in sorted(chakra_generated(root / "chakra").glob("*.0.et")):
        traces[f"chakra {path.name}"] = path.read_bytes()
    return traces


def chakra_generated(folder: Path) -> Path:
    """The official generator's trace families for 2 NPUs (its functions write to the working directory)."""
    folder.mkdir(exist_ok=True)
    code = ("import sys; sys.argv = ['generator', '--num_npus', '2']; "
            "from chakra.src.generator.generator import main; main()")
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=120)
    if done.returncode and "No module named" in done.stderr:
        pytest.skip("mlc-chakra is not installed")
    assert done.returncode == 0, done.stderr
    return folder


def show(data: bytes) -> Any:
    """Decode a trace and use every part of it as the inspection tools do; returns the graph."""
    graph = decode_trace(data, "mutant.0.et")
    json.dumps(metadata_record(graph), allow_nan=False)
    for record in node_records(0, "mutant.0.et", graph):
        json.dumps(record, allow_nan=False)
    summary = inspect_trace.summarize_rank(0, "mutant.0.et", graph)
    inspect_trace.format_text([summary], False, True)
    json.dumps(inspect_trace.as_json([summary], False))
    totals = analyze.rank_totals(0, graph)
    found, _, _ = analyze.imbalances([(0, graph), (1, graph)], by_group=True)
    json.dumps(analyze.as_json([totals], found), allow_nan=False)
    analyze.format_text([totals], found)
    visualize.write_dot(graph, io.StringIO())
    visualize.to_networkx(graph)
    return graph


def exercise(data: bytes) -> None:
    """``show``, then the checks and the node table a simulation starts with."""
    from simulator.node_table import node_table

    graph = show(data)
    validate(graph)
    node_table(graph)


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to four byte-level mutations: flip a bit, set a byte, insert, delete, truncate or splice."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(("flip", "set", "insert", "delete", "truncate", "splice"))
        p = rng.randrange(len(out)) if out else 0
        if op == "flip" and out:
            out[p] ^= 1 << rng.randrange(8)
        elif op == "set" and out:
            out[p] = rng.choice((0x00, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == "insert":
            out[p:p] = bytes(rng.choice((0xFF, 0x80, rng.randrange(256))) for _ in range(rng.randint(1, 12)))
        elif op == "delete":
            del out[p : p + rng.randint(1, 8)]
        elif op == "truncate":
            del out[p:]
        elif op == "splice":
            q = rng.randrange(len(out)) if out else 0
            out[p:p] = out[q : q + rng.randint(1, 40)]
    return bytes(out)


def test_byte_mutations_decode_or_give_an_input_error(corpus: dict[str, bytes]) -> None:
    assert len(corpus) >= 7 + CHAKRA_FAMILIES
    outcomes = {"decoded": 0, "refused": 0}
    for name, data in sorted(corpus.items()):
        show(data)  # every original is shown, whether or not it would simulate
        rng = random.Random(f"{name}-2024")  # deterministic, different for every trace
        for _ in range(120):
            mutant = mutate(data, rng)
            started = time.perf_counter()
            try:
                exercise(mutant)
                outcomes["decoded"] += 1
            except InputError as e:
                outcomes["refused"] += 1
                assert "\n" not in str(e)
            assert time.perf_counter() - started < SECONDS_PER_TRACE, (name, mutant.hex())
    assert outcomes["decoded"] > 50 and outcomes["refused"] > 500, outcomes


def _node_with(field_number: int, payload: bytes) -> bytes:
    return make_node(9, "n", 4).SerializeToString() + encode_varint(field_number << 3 | 2) + \
        encode_varint(len(payload)) + payload


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([8, 9, 10]), st.binary(max_size=40), st.sampled_from(range(4, 33, 2)))
def test_arbitrary_bytes_inside_sub_messages(field_number: int, junk: bytes, list_field: int) -> None:
    """IOInfo and AttributeProto payloads, and the list messages inside attributes, hold arbitrary bytes."""
    payloads = [junk]
    if field_number == 10:  # also as the payload of a list value inside a well-formed attribute
        payloads.append(b"\x0a\x01x" + encode_varint(list_field << 3 | 2) + encode_varint(len(junk)) + junk)
    for payload in payloads:
        data = frame_payloads([serialize(make_metadata()), _node_with(field_number, payload)])
        try:
            exercise(data)
        except InputError as e:
            assert isinstance(e, TraceError) and (e.node_id == 9 or e.offset is not None), e


def _attribute_list(tname: str, payload: bytes) -> bytes:
    """An AttributeProto named "x" whose ``<tname>_list`` value is ``payload``."""
    number = schema.scalar_field_number(tname) + 1
    return b"\x0a\x01x" + encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


MALFORMED = {  # what goes wrong -> (node field, payload)
    "IOInfo with a truncated string": (8, b"\x0a\x05ab"),
    "IOInfo with wire type 7": (9, b"\x0f"),
    "IOInfo with an 11-byte varint": (8, b"\x08" + b"\xff" * 10 + b"\x01"),
    "attribute with an absurd length": (10, b"\x0a\xff\xff\xff\xff\x0fname"),
    "attribute with a group": (10, b"\x0a\x01x\x0b\x0c"),
    "attribute list that is no message": (10, _attribute_list("int64", b"\xff\xff")),
    "packed list cut inside a number": (10, _attribute_list("uint64", b"\x0a\x01\x80")),
    "packed list with an 11-byte number": (10, _attribute_list("sint64", b"\x0a\x0b" + b"\xff" * 10 + b"\x01")),
    "packed fixed64 list of 5 bytes": (10, _attribute_list("fixed64", b"\x0a\x05" + bytes(5))),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_sub_messages_name_file_rank_node_and_offset(tmp_path: Path, case: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    field_number, payload = MALFORMED[case]
    path = tmp_path / "t.3.et"
    path.write_bytes(frame_payloads([serialize(make_metadata()), _node_with(field_number, payload)]))
    with pytest.raises(TraceError) as info:
        TraceLoader().load(str(path), 3)
    message = str(info.value)
    assert str(path) in message and "rank 3" in message and "node 9" in message and "byte offset" in message
    assert main(["trace", "jsonize", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("astrasim-py: error: ") and "node 9" in err


def test_a_malformed_sub_message_through_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "t.0.et"
    path.write_bytes(frame_payloads([serialize(make_metadata()), _node_with(*MALFORMED["IOInfo with wire type 7"])]))
    for argv in (["trace", "inspect", str(path)], ["--workload", str(path), "--network",
                                                   str(REPO / "configs" / "network" / "ring_8.yml")]):
        done = run_cli(*argv)
        assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1
        assert str(path) in done.stderr and "node 9" in done.stderr and "byte offset" in done.stderr


def test_unknown_fields_and_wrong_wire_types_of_known_fields_are_skipped_as_protobuf_does() -> None:
    io = b"\x0a\x02ok" + b"\x10\x05" + b"\x22\x01z"  # values; shapes as a varint (skipped); unknown field 4
    attr = b"\x0a\x04size" + b"\x3d\x01\x00\x00\x00" + b"\x38\x2a"  # int32_val as fixed32 (skipped), then 42
    data = frame_payloads([serialize(make_metadata()), _node_with(8, io) + encode_varint(10 << 3 | 2)
                           + encode_varint(len(attr)) + attr])
    graph = decode_trace(data)
    assert graph.io_info(0, "inputs") == {"values": "ok", "shapes": "", "types": ""}
    assert graph.attributes(0) == [("size", "int32_val", 42)]
    protobuf = schema.Node.FromString(data[data.index(b"\x08\x09") :])
    assert protobuf.inputs.values == "ok" and protobuf.attr[0].int32_val == 42


def test_lists_and_io_strings_with_invalid_utf8_are_shown_not_refused() -> None:
    attr = b"\x0a\x01s" + encode_varint(30 << 3 | 2) + b"\x04\x0a\x02\xff\xfe"  # string_list ["\xff\xfe"]
    data = frame_payloads([serialize(make_metadata()), _node_with(8, b"\x0a\x01\xff") + b"\x52"
                           + encode_varint(len(attr)) + attr])
    graph = decode_trace(data)
    assert graph.io_info(0, "inputs")["values"] == "\ufffd"
    assert graph.attributes(0) == [("s", "string_list", ["\ufffd\ufffd"])]


# ---- resource limits -------------------------------------------------------------------------------------------

def gzip_bomb(path: Path, member_mib: int = 64, members: int = 64) -> int:
    """A multi-member gzip file of zeros: ``members`` x ``member_mib`` MiB once decompressed; returns its size."""
    member = gzip.compress(bytes(member_mib << 20), compresslevel=9)
    path.write_bytes(member * members)
    return len(member) * members


def test_a_gzip_bomb_stops_at_the_cap_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    size = gzip_bomb(tmp_path / "w" / "bomb.0.et")
    assert size < 5 << 20  # a 4 MB file that expands to 4 GiB
    env = dict(os.environ, ASTRASIM_PY_MAX_TRACE_BYTES="32MiB")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "simulator", "trace", "inspect", str(tmp_path / "w")], env=env,
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert time.perf_counter() - started < 20
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "bomb.0.et" in done.stderr and "32.0 MiB" in done.stderr and "ASTRASIM_PY_MAX_TRACE_BYTES" in done.stderr


@pytest.mark.slow
def test_a_gzip_bomb_stops_at_the_default_cap(tmp_path: Path) -> None:
    gzip_bomb(tmp_path / "bomb.0.et")
    with pytest.raises(LimitError, match=r"decompresses to more than 2\.0 GiB"):
        TraceLoader().load(str(tmp_path / "bomb.0.et"), 0)


def test_gzip_of_several_members_and_trailing_zeros_reads_like_gzip(tmp_path: Path) -> None:
    data = trace_bytes([make_node(i, f"n{i}", 4) for i in range(20)])
    path = tmp_path / "t.0.et"
    path.write_bytes(gzip.compress(data[:30]) + gzip.compress(data[30:]) + bytes(7))
    assert TraceLoader().load(str(path), 0).num_nodes == 20
    path.write_bytes(gzip.compress(data) + b"junk")
    with pytest.raises(TraceError, match="corrupt gzip"):
        TraceLoader().load(str(path), 0)
    path.write_bytes(zlib.compress(data))  # zlib, not gzip: not a trace
    with pytest.raises(TraceError):
        TraceLoader().load(str(path), 0)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifos_devices_and_folders_are_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "t.0.et")
    (tmp_path / "t.1.et").mkdir()
    done = run_cli("trace", "inspect", str(tmp_path / "t"), timeout=30)  # would block forever on open()
    assert done.returncode == 1 and "t.0.et" in done.stderr and "not a regular file" in done.stderr
    with pytest.raises(TraceError, match=r"t\.1\.et: trace file is a folder"):
        TraceLoader().load(str(tmp_path / "t.1.et"), 1)
    if os.path.exists("/dev/zero"):
        with pytest.raises(InputError, match="not a regular file"):
            resolve_workload("/dev/zero")
        with pytest.raises(TraceError, match="not a regular file"):
            TraceLoader().load("/dev/zero")


def test_a_huge_rank_number_in_a_file_name_is_no_huge_list(tmp_path: Path) -> None:
    for rank in (0, 10**12):
        write_trace_file(tmp_path / f"trace.{rank}.et", [make_node(1, "n", 4)])
    started = time.perf_counter()
    assert main(["trace", "inspect", str(tmp_path)]) == 1
    assert time.perf_counter() - started < 5
    with pytest.raises(InputError, match=r"rank\(s\) 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 \.\.\. are missing"):
        resolve_workload(str(tmp_path))


def test_a_billion_ranks_fail_fast_with_an_estimate(tmp_path: Path) -> None:
    network = tmp_path / "huge.yml"
    network.write_text("topology: [ Ring ]\nnpus_count: [ 1000000000 ]\nbandwidth: [ 50 ]\nlatency: [ 500 ]\n")
    started = time.perf_counter()
    done = run_cli("--workload", str(SHIPPED), "--network", str(network), timeout=60)
    assert time.perf_counter() - started < 30
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "1,000,000,000" in done.stderr and "ASTRASIM_PY_MAX_RANKS" in done.stderr


def test_deeply_nested_json_inputs_are_one_line_errors(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    host = tmp_path / "host.json"
    host.write_text('{"schema": "1.1.1-chakra.0.0.4", "nodes": ' + deep + "}")
    profile = tmp_path / "profile.json"
    profile.write_text(deep)
    for argv in (["trace", "convert", "pytorch", str(host), "-o", str(tmp_path / "o")],
                 ["trace", "synthesize", "--from-profile", str(profile), "-o", str(tmp_path / "s")]):
        done = run_cli(*argv)
        assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert "nested too deeply" in done.stderr


def test_deeply_nested_tensor_arguments_of_a_host_trace_need_no_recursion() -> None:
    from workload.convert.pytorch_trace import Argument

    value: Any = [1, 2, 3, 4, 5, "cuda:0"]
    for _ in range(50_000):
        value = [value, [7, 8, 9, 10, 11, "cpu"]]
    tensors = Argument("GenericList[Tensor(float)]", value, None).tensors()
    assert len(tensors) == 50_001 and tensors[0].tensor_id == 1


# ---- hostile PyTorch traces -----------------------------------------------------------------------------------

PYTORCH = Path(__file__).parent / "fixtures" / "pytorch"
ODD_VALUES = [None, -1, 0, 2**70, 1.5, float("nan"), float("inf"), "x", "", [], {}, [1, 2], {"a": 1}, True, "[1,2]"]


def _replace_values(doc: Any, rng: random.Random, count: int) -> None:
    """Replace ``count`` values anywhere in a JSON document by values of other types and ranges."""
    places: list[tuple[Any, Any]] = []
    stack = [doc]
    while stack:
        value = stack.pop()
        keys = value.keys() if isinstance(value, dict) else range(len(value)) if isinstance(value, list) else ()
        for key in keys:
            places.append((value, key))
            stack.append(value[key])
    for parent, key in rng.sample(places, min(count, len(places))):
        parent[key] = rng.choice(ODD_VALUES)


def test_mutated_pytorch_traces_convert_or_give_an_input_error(tmp_path: Path) -> None:
    from workload.convert.pytorch import convert

    folder = PYTORCH / "v1_0_4_kineto"
    originals = {name: json.loads((folder / name).read_text()) for name in
                 ("host_rank0.json", "host_rank1.json", "kineto_rank0.json", "kineto_rank1.json")}
    rng = random.Random(7)
    refused = 0
    for k in range(60):
        docs = json.loads(json.dumps(originals))  # a fresh copy
        _replace_values(docs[rng.choice(sorted(docs))], rng, rng.randint(1, 3))
        for name, doc in docs.items():
            (tmp_path / name).write_text(json.dumps(doc))
        hosts = [str(tmp_path / f"host_rank{r}.json") for r in range(2)]
        kineto = [str(tmp_path / f"kineto_rank{r}.json") for r in range(2)] if k % 2 else None
        try:
            convert(hosts, str(tmp_path / "out" / "t"), kineto)
        except InputError as e:
            refused += 1
            assert "\n" not in str(e)
    assert refused > 5


def test_zero_filled_data_is_no_stream_of_empty_nodes(tmp_path: Path) -> None:
    data = trace_bytes([make_node(1, "a", 4), make_node(2, "b", 4, data_deps=[1])])
    warnings: list[str] = []
    (tmp_path / "tail.0.et").write_bytes(data + bytes(4096))  # a preallocated, zero-filled tail
    graph = TraceLoader(warn=warnings.append).load(str(tmp_path / "tail.0.et"), 0)
    assert graph.num_nodes == 2 and "the last 4,096 bytes are zeros" in warnings[0]
    (tmp_path / "hole.0.et").write_bytes(data[:-6] + bytes(64) + data[-6:])
    with pytest.raises(TraceError, match=r"byte offset \d+: a run of zero bytes"):
        TraceLoader().load(str(tmp_path / "hole.0.et"), 0)
    (tmp_path / "zeros.0.et").write_bytes(bytes(50 << 20))
    started = time.perf_counter()
    with pytest.raises(TraceError, match="empty file"):
        TraceLoader().load(str(tmp_path / "zeros.0.et"), 0)
    assert time.perf_counter() - started < 5


def test_more_messages_than_memory_can_decode_are_refused_while_framing() -> None:
    from workload.wire import frame_messages

    data = trace_bytes([make_node(i, "n", 4) for i in range(100)])
    assert len(frame_messages(data, max_messages=101)[0]) == 101
    with pytest.raises(LimitError, match="more than 100 messages"):
        frame_messages(data, max_messages=100)
