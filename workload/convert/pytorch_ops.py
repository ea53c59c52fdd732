"""What a PyTorch operator means for the simulator: communication (kind, size, group, peer) or compute
(operations, bytes touched), and which operators do no work at all (views, allocations).

Communication is read from ``record_param_comms`` records (what NCCL and other backends log, with the
collective's name, element counts, dtype and process group) when the operator has one, and otherwise from
the ``c10d::`` operator itself (its name and tensor arguments; gloo logs only these).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from workload.convert.pytorch_trace import Argument, HostNode, Tensor

# Operators that only make views, allocate or read metadata: no time, no data written.
ZERO_WORK_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand", "expand_as",
    "as_strided", "squeeze", "unsqueeze", "select", "slice", "narrow", "detach", "detach_", "alias", "empty",
    "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resolve_conj", "resolve_neg", "split",
    "split_with_sizes", "chunk", "unbind", "flatten", "unflatten", "lift_fresh", "numpy_T", "mT", "view_as",
    "diagonal", "movedim", "swapaxes", "contiguous", "to", "set_", "record_stream", "is_same_size", "size",
    "stride", "resize_", "_has_compatible_shallow_copy_type"})

# Kinds of communication (normalised names) the simulator runs; the others are skipped with a warning.
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
P2P_KINDS = ("send", "recv")
# Records that move no data (synchronisation and bookkeeping).
SILENT_KINDS = frozenset({"wait", "init", "coalesced", "split", "nccl_comm_init"})

_KIND_PREFIXES = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
                  ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("send", "send"), ("recv", "recv"),
                  ("barrier", "barrier"), ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"))

# c10::ScalarType names as record_param_comms writes them, and common aliases.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2, "char": 1, "int8": 1, "byte": 1,
    "uint8": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4, "uint16": 2,
    "uint32": 4, "uint64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
}

# Argument positions of c10d operators (used when the trace has no op_schema to name them).
_C10D_INPUT_ARG = {"allgather_": 1, "_allgather_base_": 1, "allgather_coalesced_": 1,
                   "allgather_into_tensor_coalesced_": 1, "reduce_scatter_": 1, "_reduce_scatter_base_": 1,
                   "reduce_scatter_tensor_coalesced_": 1, "alltoall_": 1, "alltoall_base_": 1, "gather_": 1,
                   "scatter_": 1}


@dataclass(slots=True)
class CommOp:
    """One communication operation as recorded on this rank."""

    kind: str  # a COLLECTIVE_KINDS or P2P_KINDS entry, or the normalised name of something unsupported
    size_bytes: int
    pg_ref: str | int | None  # process-group name (or, before schema 1.0.3, backend id); None = unknown
    pg_ranks: tuple[int, ...] | None  # group members, when the record itself says
    peer: int | None  # group-local peer rank of a send/recv
    tag: int
    blocking: bool  # False when the caller asked for async_op=True (later ops need not wait)


def communication_kind(name: str) -> str:
    """Normalise a collective's name ("c10d::_allgather_base_", "nccl:all_reduce", "allreduce_coalesced")."""
    base = name.rsplit(":", 1)[-1].lower().replace("_", "")
    for prefix, kind in _KIND_PREFIXES:
        if base.startswith(prefix):
            return kind
    return base or "unknown"


def is_communication(top: HostNode, subtree: list[HostNode]) -> bool:
    return top.name.startswith("c10d::") or any(n.name == "record_param_comms" for n in subtree)


def comm_op(top: HostNode, subtree: list[HostNode]) -> CommOp:
    """The communication a c10d operator or record_param_comms subtree performs."""
    records = [n for n in subtree if n.name == "record_param_comms"]
    rpc = next((r for r in records if _rpc_kind(r) not in SILENT_KINDS), records[0] if records else None)
    c10d = top if top.name.startswith("c10d::") else None
    kind = _rpc_kind(rpc) if rpc is not None else "unknown"
    if (kind in SILENT_KINDS or kind == "unknown") and c10d is not None:
        kind = communication_kind(c10d.name)
    size = 0
    if rpc is not None:
        size = sum(_rpc_size(r) for r in records if _rpc_kind(r) == kind) if len(records) > 1 else _rpc_size(rpc)
    if size == 0 and c10d is not None:
        size = sum(t.size_bytes for t in _c10d_input(c10d).tensors())
    pg_ref, pg_ranks, peer = (*_rpc_group(rpc), _rpc_peer(rpc)) if rpc is not None else (None, None, None)
    tag, blocking = 0, True
    if c10d is not None:
        args = _named_args(c10d)
        if peer is None:
            peer = _int_arg(args.get("dst", args.get("src")))
        tag = _int_arg(args.get("tag")) or 0
        asynchronous = args.get("async_op")
        blocking = not (asynchronous is not None and asynchronous.value is True)
    return CommOp(kind, size, pg_ref, pg_ranks, peer, tag, blocking)


def _rpc_shift(rpc: HostNode) -> int:
    """record_param_comms inputs: [input tensors,] seq, process group, rank, name, splits..., world size."""
    return 0 if rpc.inputs and "Tensor" in rpc.inputs[0].type else 1


def _rpc_input(rpc: HostNode, position: int) -> Argument | None:
    i = position - _rpc_shift(rpc)
    return rpc.inputs[i] if 0 <= i < len(rpc.inputs) else None


def _rpc_kind(rpc: HostNode | None) -> str:
    if rpc is None:
        return "unknown"
    name = rpc.attrs.get("collective_name")
    if not isinstance(name, str):
        arg = _rpc_input(rpc, 4)
        name = arg.value if arg is not None and isinstance(arg.value, str) else ""
    return communication_kind(name)


def _rpc_size(rpc: HostNode) -> int:
    nelems = rpc.attrs.get("in_msg_nelems")
    if _rpc_kind(rpc) == "recv" and not nelems:
        nelems = rpc.attrs.get("out_msg_nelems")
    dtype = str(rpc.attrs.get("dtype", "")).lower().removeprefix("torch.")
    if isinstance(nelems, int) and dtype in DTYPE_BYTES:
        return nelems * DTYPE_BYTES[dtype]
    tensors = rpc.inputs[0].tensors() if _rpc_shift(rpc) == 0 else []
    if not tensors and _rpc_kind(rpc) == "recv":
        tensors = [t for a in rpc.outputs for t in a.tensors()]
    return sum(t.size_bytes for t in tensors)


def _rpc_group(rpc: HostNode) -> tuple[str | int | None, tuple[int, ...] | None]:
    ref: str | int | None = None
    name = rpc.attrs.get("pg_name")
    if isinstance(name, str) and name:
        ref = name
    else:
        arg = _rpc_input(rpc, 2)
        value = arg.value if arg is not None else None
        if isinstance(value, list) and value and isinstance(value[0], str):
            ref = value[0]  # (pg_name, pg_desc) since schema 1.0.3
        elif isinstance(value, str) and value:
            ref = value
        elif isinstance(value, int) and not isinstance(value, bool):
            ref = value  # a backend id, resolved through the process-group list (schema 1.0.2)
    start, stride, size = (rpc.attrs.get(k) for k in ("global_rank_start", "global_rank_stride", "pg_size"))
    ranks = None
    if all(isinstance(v, int) for v in (start, stride, size)) and size > 0 and stride > 0 and start >= 0:
        ranks = tuple(start + i * stride for i in range(size))
    return ref, ranks


def _rpc_peer(rpc: HostNode) -> int | None:
    if _rpc_kind(rpc) not in P2P_KINDS:
        return None
    return _int_arg(_rpc_input(rpc, 3))


def _int_arg(arg: Argument | None) -> int | None:
    if arg is None or isinstance(arg.value, bool) or not isinstance(arg.value, int):
        return None
    return arg.value


def schema_argument_names(op_schema: str) -> list[str]:
    """Argument names of "ns::op(Tensor[] tensors, int dst, bool async_op=True) -> ..." in order."""
    start = op_schema.find("(")
    if start < 0:
        return []
    depth, parts, current = 0, [], ""
    for ch in op_schema[start + 1:]:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    names = []
    for part in parts:
        words = part.split("=")[0].split()
        if words and words[-1] != "*":
            names.append(words[-1])
    return names


def _named_args(node: HostNode) -> dict[str, Argument]:
    names = schema_argument_names(node.op_schema)
    if not names:  # no schema: the c10d signatures of PyTorch 2.x
        base = node.name.split("::", 1)[-1]
        if base in ("send", "recv_"):
            names = ["tensors", "process_group", "dst" if base == "send" else "src", "tag"]
    return {name: arg for name, arg in zip(names, node.inputs, strict=False)}


def written_tensors(node: HostNode) -> list[Tensor]:
    """The tensors a communication record writes: its outputs, and a c10d operator's output buffers (which
    it takes as arguments) or in-place ``tensors`` (except a send's)."""
    found = node.tensors("outputs")
    if node.name.startswith("c10d::"):
        for name, arg in _named_args(node).items():
            if name.startswith("output") or (name == "tensors" and communication_kind(node.name) != "send"):
                found.extend(arg.tensors())
    return found


def _c10d_input(node: HostNode) -> Argument:
    args = _named_args(node)
    for name in ("input_tensors", "input_tensor", "input", "inputs", "tensors", "tensor"):
        if name in args:
            return args[name]
    position = _C10D_INPUT_ARG.get(node.name.split("::", 1)[-1], 0)
    return node.inputs[position] if position < len(node.inputs) else Argument("", None, None)


def is_zero_work(subtree: list[HostNode]) -> bool:
    """True when every operator of the subtree only makes views or allocates."""
    return all(n.name.split("::", 1)[-1] in ZERO_WORK_OPS for n in subtree if n.is_operator())


def _shape(args: list[Argument], i: int) -> list[int] | None:
    if i >= len(args) or "Tensor" not in args[i].type:
        return None
    shape = args[i].shape
    if isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return shape
    return None


def _matmul_flops(a: list[int], b: list[int]) -> int:
    m, k = (a[-2], a[-1]) if len(a) >= 2 else (1, a[-1] if a else 1)
    n = b[-1] if len(b) >= 2 else 1
    batch = max(math.prod(a[:-2]), math.prod(b[:-2]))
    return 2 * batch * m * k * n


def _largest_numel(node: HostNode) -> int:
    return max((t.numel for t in node.tensors()), default=0)


def num_ops(node: HostNode) -> int:
    """Estimated arithmetic operations: exact for matrix products, convolutions and attention; one per
    element of the largest tensor otherwise."""
    base = re.sub(r"\..*$", "", node.name.split("::", 1)[-1])
    ins = node.inputs
    if base in ("mm", "matmul", "bmm"):
        a, b = _shape(ins, 0), _shape(ins, 1)
        if a and b:
            return _matmul_flops(a, b)
    if base in ("addmm", "baddbmm", "addbmm"):
        a, b = _shape(ins, 1), _shape(ins, 2)
        if a and b:
            return _matmul_flops(a, b)
    if base == "linear":
        x, w = _shape(ins, 0), _shape(ins, 1)
        if x and w and len(w) == 2:
            return 2 * math.prod(x) * w[0]
    if "convolution" in base or base in ("conv1d", "conv2d", "conv3d"):
        w, out = _shape(ins, 1), _shape(node.outputs, 0)
        if w and out:
            return 2 * math.prod(out) * math.prod(w[1:])
    if "scaled_dot_product" in base:
        q, k, v = _shape(ins, 0), _shape(ins, 1), _shape(ins, 2)
        if q and k and v and len(q) >= 2:
            batch, length, source = math.prod(q[:-2]), q[-2], k[-2]
            return 2 * batch * length * source * (q[-1] + v[-1])
    return _largest_numel(node)


def tensor_bytes(node: HostNode) -> int:
    """Bytes of the distinct tensors an operator reads and writes."""
    seen: set[tuple[int, int, int, int]] = set()
    total = 0
    for t in node.tensors():
        key = (t.tensor_id, t.storage_id, t.offset, t.numel)
        if key not in seen:
            seen.add(key)
            total += t.size_bytes
    return total
