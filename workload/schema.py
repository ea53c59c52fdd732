"""The Chakra execution-trace schema, declared here and wire-compatible with Chakra's ``et_def.proto``.

Field numbers and types are the wire contract; names follow Chakra so that JSON dumps read the same.
The message classes live in a private descriptor pool, so they never clash with an installed copy of
the official ``chakra`` package in the same process. They are built on first use (``schema.Node`` ...):
reading and simulating traces does not need the protobuf runtime at all.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

PACKAGE = "ChakraProtoMsg"
MESSAGES = ("Node", "GlobalMetadata", "AttributeProto", "IOInfo", "Tensor")
# A node attribute of astrasim-py's own (ASTRA-sim ignores it): the SMs a collective's kernel occupies when it is
# not NCCL's (Transformer Engine's userbuffers); read by --sm-sharing (simulator/sm_sharing.py)
COMM_SMS = "comm_sms"
# Another of its own: the library that runs a collective when it is not NCCL (an expert-parallel exchange's DeepEP or
# HybridEP); read by the NCCL-like collective model (simulator/collectives/exchange.py)
COMM_LIBRARY = "comm_library"


class NodeType(enum.IntEnum):
    INVALID_NODE = 0
    METADATA_NODE = 1
    MEM_LOAD_NODE = 2
    MEM_STORE_NODE = 3
    COMP_NODE = 4
    COMM_SEND_NODE = 5
    COMM_RECV_NODE = 6
    COMM_COLL_NODE = 7


class CollectiveType(enum.IntEnum):
    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


def node_type_name(value: int) -> str:
    """The NodeType name of a node's type number, or the number itself when no type has it."""
    return NodeType(value).name if 0 <= value <= max(NodeType) else str(value)


def collective_name(value: int) -> str:
    """The CollectiveType name of a comm_type value, or the number itself when no collective has it."""
    return CollectiveType(value).name if 0 <= value <= max(CollectiveType) else str(value)


# The AttributeProto value oneof: (scalar type, list element type) pairs numbered 3.., in this order.
# Each entry: (type name used in field names, protobuf FieldDescriptorProto type, wire type of one scalar).
ATTRIBUTE_VALUE_TYPES: tuple[tuple[str, int, int], ...] = (
    ("double", 1, 1),
    ("float", 2, 5),
    ("int32", 5, 0),
    ("int64", 3, 0),
    ("uint32", 13, 0),
    ("uint64", 4, 0),
    ("sint32", 17, 0),
    ("sint64", 18, 0),
    ("fixed32", 7, 5),
    ("fixed64", 6, 1),
    ("sfixed32", 15, 5),
    ("sfixed64", 16, 1),
    ("bool", 8, 0),
    ("string", 9, 2),
    ("bytes", 12, 2),
)


def scalar_field_number(type_name: str) -> int:
    """Field number of ``<type_name>_val`` in AttributeProto (its list is this number + 1)."""
    for i, (name, _, _) in enumerate(ATTRIBUTE_VALUE_TYPES):
        if name == type_name:
            return 3 + 2 * i
    raise KeyError(type_name)


def _list_message_name(type_name: str) -> str:
    return type_name[0].upper() + type_name[1:] + "List"


def _build_file() -> Any:
    from google.protobuf import descriptor_pb2

    _F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="astrasim_et_def.proto", package=PACKAGE, syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, int, bool, str]]) -> None:
        m = f.message_type.add(name=name)
        for fname, number, ftype, repeated, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=ftype)
            fd.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if type_name:
                fd.type_name = f".{PACKAGE}.{type_name}"

    attr = f.message_type.add(name="AttributeProto")
    attr.oneof_decl.add(name="value")
    attr.field.add(name="name", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    attr.field.add(name="doc_string", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    for i, (tname, ptype, _) in enumerate(ATTRIBUTE_VALUE_TYPES):
        number = 3 + 2 * i
        attr.field.add(name=f"{tname}_val", number=number, type=ptype, label=_F.LABEL_OPTIONAL, oneof_index=0)
        attr.field.add(
            name=f"{tname}_list",
            number=number + 1,
            type=_F.TYPE_MESSAGE,
            type_name=f".{PACKAGE}.{_list_message_name(tname)}",
            label=_F.LABEL_OPTIONAL,
            oneof_index=0,
        )
    for tname, ptype, _ in ATTRIBUTE_VALUE_TYPES:
        message(_list_message_name(tname), [("values", 1, ptype, True, "")])

    message("GlobalMetadata", [("version", 1, _F.TYPE_STRING, False, ""),
                               ("attr", 2, _F.TYPE_MESSAGE, True, "AttributeProto")])

    node_type = f.enum_type.add(name="NodeType")
    for member in NodeType:
        node_type.value.add(name=member.name, number=member.value)
    coll_type = f.enum_type.add(name="CollectiveCommType")
    for member in CollectiveType:
        coll_type.value.add(name=member.name, number=member.value)

    message("Node", [
        ("id", 1, _F.TYPE_UINT64, False, ""),
        ("name", 2, _F.TYPE_STRING, False, ""),
        ("type", 3, _F.TYPE_ENUM, False, "NodeType"),
        ("ctrl_deps", 4, _F.TYPE_UINT64, True, ""),
        ("data_deps", 5, _F.TYPE_UINT64, True, ""),
        ("start_time_micros", 6, _F.TYPE_UINT64, False, ""),
        ("duration_micros", 7, _F.TYPE_UINT64, False, ""),
        ("inputs", 8, _F.TYPE_MESSAGE, False, "IOInfo"),
        ("outputs", 9, _F.TYPE_MESSAGE, False, "IOInfo"),
        ("attr", 10, _F.TYPE_MESSAGE, True, "AttributeProto"),
    ])
    message("IOInfo", [("values", 1, _F.TYPE_STRING, False, ""),
                       ("shapes", 2, _F.TYPE_STRING, False, ""),
                       ("types", 3, _F.TYPE_STRING, False, "")])
    message("Tensor", [("tensor_id", 1, _F.TYPE_UINT64, False, ""),
                       ("storage_id", 2, _F.TYPE_UINT64, False, ""),
                       ("offset", 3, _F.TYPE_UINT64, False, ""),
                       ("num_elem", 4, _F.TYPE_UINT64, False, ""),
                       ("elem_bytes", 5, _F.TYPE_UINT64, False, ""),
                       ("device", 6, _F.TYPE_STRING, False, "")])
    return f


@functools.cache
def _pool() -> Any:
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    pool.Add(_build_file())
    return pool


@functools.cache
def message_class(name: str) -> type:
    """The generated message class for a message name of the schema (e.g. "Node", "BoolList")."""
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"{PACKAGE}.{name}"))


def list_class(type_name: str) -> type:
    """The list message class for an attribute value type name (e.g. "bool" -> BoolList)."""
    return message_class(_list_message_name(type_name))


def __getattr__(name: str) -> type:
    if name in MESSAGES:
        return message_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
