"""The vectorised reader decodes exactly what the protobuf runtime decodes."""

from __future__ import annotations

import gzip
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import trace_bytes
from workload import schema
from workload.reader import decode_trace, read_trace
from workload.wire import encode_varint, frame_payloads
from workload.writer import make_metadata, make_node, serialize

U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
U32 = st.integers(0, 2**32 - 1)
TEXT = st.text(max_size=12)

SCALARS = {
    "double_val": st.floats(allow_nan=False, width=64),
    "float_val": st.floats(allow_nan=False, width=32),
    "int32_val": I32, "int64_val": I64, "uint32_val": U32, "uint64_val": U64,
    "sint32_val": I32, "sint64_val": I64, "fixed32_val": U32, "fixed64_val": U64,
    "sfixed32_val": I32, "sfixed64_val": I64, "bool_val": st.booleans(),
    "string_val": TEXT, "bytes_val": st.binary(max_size=8),
}
LISTS = {k.replace("_val", "_list"): st.lists(v, max_size=4) for k, v in SCALARS.items()}


@st.composite
def attributes(draw: st.DrawFn) -> tuple[str, str, object]:
    kind = draw(st.sampled_from(sorted(SCALARS) + sorted(LISTS)))
    value = draw((SCALARS | LISTS)[kind])
    name = draw(st.sampled_from(["comm_type", "comm_size", "num_ops", "tensor_size", "pg_name", "x", ""]))
    return name, kind, value


@st.composite
def nodes(draw: st.DrawFn) -> list:
    count = draw(st.integers(0, 8))
    ids = draw(st.lists(U64, min_size=count, max_size=count, unique=True))
    out = []
    for node_id in ids:
        node = make_node(
            node_id, draw(TEXT), draw(st.integers(0, 7)),
            data_deps=draw(st.lists(U64, max_size=4)), ctrl_deps=draw(st.lists(U64, max_size=4)),
            duration_micros=draw(U64), start_time_micros=draw(U64),
            attrs=draw(st.lists(attributes(), max_size=4)),
            inputs=draw(st.none() | st.fixed_dictionaries({"values": TEXT, "shapes": TEXT, "types": TEXT})),
        )
        out.append(node)
    return out


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_matches_protobuf(data: bytes) -> None:
    graph = decode_trace(data)
    _, *payload = _split(data)
    messages = [schema.Node.FromString(p) for p in payload]
    assert graph.num_nodes == len(messages)
    order = graph.record.argsort(kind="stable")  # file order
    for msg, i in zip(messages, order.tolist(), strict=True):
        assert graph.node_id(i) == msg.id
        assert graph.name(i) == msg.name
        assert int(graph.types[i]) == msg.type
        assert graph.data_deps_of(i) == list(msg.data_deps)
        assert graph.ctrl_deps_of(i) == list(msg.ctrl_deps)
        assert int(graph.duration_micros[i]) == msg.duration_micros
        assert int(graph.start_time_micros[i]) == msg.start_time_micros
        want_inputs = ({"values": msg.inputs.values, "shapes": msg.inputs.shapes, "types": msg.inputs.types}
                       if msg.HasField("inputs") else None)
        assert graph.io_info(i, "inputs") == want_inputs
        got = graph.attributes(i)
        assert len(got) == len(msg.attr)
        for (name, kind, value), a in zip(got, msg.attr, strict=True):
            which = a.WhichOneof("value") or ""
            assert (name, kind) == (a.name, which)
            expect = getattr(a, which) if which else None
            if which.endswith("_list"):
                expect = list(expect.values)
            assert _same(value, expect), (name, kind, value, expect)


def _split(data: bytes) -> list[bytes]:
    from workload.wire import frame_messages
    starts, ends = frame_messages(data)
    return [data[s:e] for s, e in zip(starts, ends, strict=True)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes())
def test_reader_decodes_what_protobuf_decodes(node_list: list) -> None:
    assert_matches_protobuf(trace_bytes(node_list))


def test_unpacked_repeated_and_repeated_scalar_fields_follow_protobuf() -> None:
    # id written twice (last wins), deps written unpacked and packed mixed, name twice
    body = (b"\x08\x05" + b"\x12\x01a" + b"\x08\x07" + b"\x28\x03" + b"\x2a\x02\x04\x05" + b"\x28\x06"
            + b"\x12\x02bc" + b"\x20\x09")
    data = frame_payloads([serialize(make_metadata()), body])
    assert_matches_protobuf(data)
    g = decode_trace(data)
    assert (g.node_id(0), g.name(0), g.data_deps_of(0), g.ctrl_deps_of(0)) == (7, "bc", [3, 4, 5, 6], [9])


def test_attribute_with_two_value_fields_follows_oneof_rules() -> None:
    attr = schema.AttributeProto(name="comm_size", int64_val=3).SerializeToString()
    attr += schema.AttributeProto(uint64_val=9).SerializeToString()  # a later oneof member replaces it
    lst = schema.AttributeProto(name="l", int64_list=schema.message_class("Int64List")(values=[1, 2]))
    lst2 = schema.AttributeProto(int64_list=schema.message_class("Int64List")(values=[3]))
    merged = lst.SerializeToString() + lst2.SerializeToString()  # the same list field twice merges
    node = make_node(1, "n", 4).SerializeToString()
    body = node + b"\x52" + encode_varint(len(attr)) + attr + b"\x52" + encode_varint(len(merged)) + merged
    data = frame_payloads([serialize(make_metadata()), body])
    assert_matches_protobuf(data)
    g = decode_trace(data)
    assert g.attributes(0) == [("comm_size", "uint64_val", 9), ("l", "int64_list", [1, 2, 3])]


def test_unknown_fields_are_skipped() -> None:
    node = make_node(4, "n", 4, duration_micros=2).SerializeToString()
    unknown = b"\xa8\x06\x01" + b"\xb2\x06\x02hi" + b"\xbd\x06\x00\x00\x00\x00" + b"\xb9\x06" + bytes(8)
    data = frame_payloads([serialize(make_metadata()), unknown + node + unknown])
    assert_matches_protobuf(data)


def test_gzip_input_reads_the_same(tmp_path) -> None:
    nodes_ = [make_node(i, f"n{i}", 4, data_deps=[i - 1] if i else [], duration_micros=i) for i in range(50)]
    plain = tmp_path / "t.0.et"
    plain.write_bytes(trace_bytes(nodes_))
    packed = tmp_path / "g.0.et"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = read_trace(plain), read_trace(packed)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.duration_micros, b.duration_micros)
    assert [a.name(i) for i in range(50)] == [b.name(i) for i in range(50)]


def test_nodes_are_indexed_in_ascending_id_order() -> None:
    nodes_ = [make_node(i, f"n{i}", 4) for i in (30, 10, 20)]
    g = decode_trace(trace_bytes(nodes_))
    assert g.ids.tolist() == [10, 20, 30]
    assert [g.name(i) for i in range(3)] == ["n10", "n20", "n30"]
    assert g.record.tolist() == [1, 2, 0]
    assert g.index_of(20) == 1 and g.index_of(25) is None


def test_metadata_and_version_are_read() -> None:
    data = frame_payloads([serialize(make_metadata("0.0.4", {"schema": "1.0.2-chakra.0.0.4"}))])
    g = decode_trace(data)
    assert (g.version, g.metadata, g.num_nodes) == ("0.0.4", {"schema": "1.0.2-chakra.0.0.4"}, 0)
