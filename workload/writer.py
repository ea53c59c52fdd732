"""Write Chakra ET files with the attribute types the ecosystem's readers expect."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workload import schema
from workload.errors import TraceError
from workload.graph import TraceGraph
from workload.wire import encode_varint

# The value field each well-known attribute is written with (older C++ readers read only that field).
ATTRIBUTE_TYPES: dict[str, str] = {
    "is_cpu_op": "bool_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "comm_priority": "int32_val",
    "tensor_size": "uint64_val",
    "num_ops": "int64_val",
    "pg_name": "string_val",
    "involved_dim": "bool_list",
    "rf_id": "int64_val",
    "fw_parent": "int64_val",
    "seq_id": "int64_val",
    "scope": "int64_val",
    "tid": "int64_val",
    "fw_tid": "int64_val",
    "stream": "int64_val",
    "op_schema": "string_val",
}

# An explicit "id = 0" field: what the writer emits for a node that would otherwise serialize to zero
# bytes, because a zero-length message ends the official readers' loop.
_EXPLICIT_ZERO_ID = b"\x08\x00"


def _infer_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool_val"
    if isinstance(value, int):
        return "int64_val"
    if isinstance(value, float):
        return "double_val"
    if isinstance(value, str):
        return "string_val"
    if isinstance(value, bytes):
        return "bytes_val"
    if isinstance(value, (list, tuple)):
        items = list(value)
        if all(isinstance(v, bool) for v in items):
            return "bool_list"
        if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            return "int64_list"
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
            return "double_list"
        if all(isinstance(v, str) for v in items):
            return "string_list"
    raise TypeError(f"cannot store {type(value).__name__} as a Chakra attribute")


def set_attribute(attr: Any, name: str, value: Any, type_name: str | None = None) -> None:
    """Fill an AttributeProto with ``value`` as ``type_name`` (e.g. ``int64_val``), or the ecosystem's type."""
    attr.name = name
    if type_name == "":  # an attribute written with a name and no value
        return
    kind = type_name or ATTRIBUTE_TYPES.get(name) or _infer_type(value)
    if kind.endswith("_list"):
        getattr(attr, kind).values.extend(value)
    else:
        setattr(attr, kind, value)


def make_node(
    node_id: int,
    name: str,
    node_type: schema.NodeType | int,
    *,
    data_deps: Sequence[int] = (),
    ctrl_deps: Sequence[int] = (),
    duration_micros: int = 0,
    start_time_micros: int = 0,
    attrs: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
    inputs: Mapping[str, str] | None = None,
    outputs: Mapping[str, str] | None = None,
) -> Any:
    """A Node message. Attributes are given as {name: value} or (name, value) pairs, or (name, type, value)
    triples to force a value field; well-known names get the ecosystem's types."""
    try:
        node = schema.Node(id=node_id, name=name, type=int(node_type), duration_micros=duration_micros,
                           start_time_micros=start_time_micros)
        node.data_deps.extend(data_deps)
        node.ctrl_deps.extend(ctrl_deps)
        items = attrs.items() if isinstance(attrs, Mapping) else attrs
        for item in items:
            if len(item) == 3:
                set_attribute(node.attr.add(), item[0], item[2], item[1])
            else:
                set_attribute(node.attr.add(), item[0], item[1])
    except ValueError as e:  # a value from the user's input beyond its field's range (uint64 ids, int64 sizes)
        raise TraceError(f"a value does not fit its trace field ({e})",
                         node_id=node_id) from None
    if inputs is not None:
        node.inputs.CopyFrom(schema.IOInfo(**inputs))
    if outputs is not None:
        node.outputs.CopyFrom(schema.IOInfo(**outputs))
    return node


def make_metadata(version: str = "1.0.0", attrs: Mapping[str, Any] | None = None) -> Any:
    meta = schema.GlobalMetadata(version=version)
    for name, value in (attrs or {}).items():
        set_attribute(meta.attr.add(), name, value)
    return meta


def serialize(message: Any) -> bytes:
    """A message's bytes, never empty (see _EXPLICIT_ZERO_ID)."""
    data = message.SerializeToString()
    return data or _EXPLICIT_ZERO_ID


class TraceWriter:
    """Writes one ET file: the GlobalMetadata first, then nodes as they are added.

    Use as a context manager. A path ending in ``.gz`` is gzip-compressed.
    """

    def __init__(self, path: str | os.PathLike[str], version: str = "1.0.0",
                 metadata: Mapping[str, Any] | None = None) -> None:
        self.path = os.fspath(path)
        opener = gzip.open if self.path.endswith(".gz") else open
        self._file = opener(self.path, "wb")
        self._write(make_metadata(version, metadata))
        self.count = 0

    def _write(self, message: Any) -> None:
        data = serialize(message)
        self._file.write(encode_varint(len(data)))
        self._file.write(data)

    def add(self, node: Any) -> None:
        self._write(node)
        self.count += 1

    def add_many(self, nodes: Iterable[Any]) -> None:
        for node in nodes:
            self.add(node)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_trace(path: str | os.PathLike[str], nodes: Iterable[Any], version: str = "1.0.0",
                metadata: Mapping[str, Any] | None = None) -> int:
    """Write a whole trace; returns the number of nodes written."""
    with TraceWriter(path, version, metadata) as w:
        w.add_many(nodes)
        return w.count


def node_message(graph: TraceGraph, index: int) -> Any:
    """Re-create the Node message of a decoded node (attribute types preserved)."""
    return make_node(
        graph.node_id(index), graph.name(index), int(graph.types[index]),
        data_deps=graph.data_deps_of(index), ctrl_deps=graph.ctrl_deps_of(index),
        duration_micros=int(graph.duration_micros[index]),
        start_time_micros=int(graph.start_time_micros[index]),
        attrs=graph.attributes(index),
        inputs=graph.io_info(index, "inputs"), outputs=graph.io_info(index, "outputs"),
    )


def graph_messages(graph: TraceGraph) -> Iterable[Any]:
    """The graph's nodes as messages, in their original file order."""
    order = graph.record.argsort(kind="stable")
    for i in order.tolist():
        yield node_message(graph, i)
