"""Reading PyTorch host execution traces (ExecutionTraceObserver JSON, schemas 1.0.2 to 1.1.1).

A host trace is a JSON object ``{"schema": "1.1.1-chakra.0.0.4", "pid": ..., "nodes": [...]}``; every node
records one RecordFunction scope: ``id``, ``name``, ``ctrl_deps`` (the id of the enclosing scope, i.e. its
parent in the call tree), ``inputs``/``outputs`` (parallel ``values``/``shapes``/``types`` lists) and
``attrs`` (a list of ``{"name", "type", "value"}``: ``rf_id``, ``tid``, ``op_schema``, ...). Node ids grow in
the order scopes were entered, across threads. What changed between the schema versions we read:
1.0.3 names a collective's process group by a (name, description) pair instead of a backend id; 1.0.4 adds
``kernel_backend``/``kernel_file``; 1.1.0 adds collective attributes (``collective_name``, ``dtype``,
``in_msg_nelems``, ``pg_name``, ...) to ``record_param_comms``; 1.1.1 adds ``strides`` and ``tensor_range``.
A trace merged with its device trace (Chakra's trace linker) may also carry ``inclusive_dur``/``dur``
on host nodes and device nodes with a ``cat`` such as ``kernel``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from workload.errors import InputError
from workload.files import shown_path
from workload.limits import DEFAULT_MAX_TRACE_BYTES, MAX_TRACE_BYTES_ENV, env_limit, read_capped

SUPPORTED_SCHEMAS = ((1, 0, 2), (1, 1, 1))
THREAD_ROOT = "[pytorch|profiler|execution_trace|thread]"
PG_INIT = "## process_group:init ##"
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


@dataclass(slots=True, eq=False)
class Tensor:
    """One tensor argument: identity (tensor and storage ids) and size."""

    tensor_id: int
    storage_id: int
    offset: int
    numel: int
    itemsize: int

    @property
    def size_bytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(slots=True, eq=False)
class Argument:
    """One input or output of a node: its type string, value and shape as recorded."""

    type: str
    value: Any
    shape: Any

    def tensors(self) -> list[Tensor]:
        """The tensors this argument holds (a tensor, or lists/tuples of them)."""
        if "Tensor" not in self.type:
            return []
        found: list[Tensor] = []
        _collect_tensors(self.value, found)
        return found


def _collect_tensors(value: Any, found: list[Tensor]) -> None:
    stack = [value]  # depth-first without recursion: argument lists may nest arbitrarily deep
    while stack:
        value = stack.pop()
        if type(value) is not list:
            continue
        if len(value) == 6 and type(value[5]) is str and \
                type(value[0]) is type(value[1]) is type(value[2]) is type(value[3]) is type(value[4]) is int:
            found.append(Tensor(value[0], value[1], value[2], value[3], value[4]))
        else:
            stack.extend(reversed(value))


@dataclass(slots=True, eq=False)
class HostNode:
    """One recorded scope of the host trace."""

    id: int
    name: str
    parent: int
    attrs: dict[str, Any]
    inputs: list[Argument]
    outputs: list[Argument]
    host_duration_us: float | None  # only in traces merged with their device trace
    device_category: str | None  # set on device (GPU) nodes of merged traces
    children: list[int] = field(default_factory=list)
    _tensors: dict[str, list[Tensor]] = field(default_factory=dict)

    @property
    def tid(self) -> int:
        """The recording thread (0 when the trace gives none, or no whole number)."""
        value = self.attrs.get("tid", 0)
        if isinstance(value, str) and value.isdecimal():
            return int(value)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def rf_id(self) -> int | None:
        value = self.attrs.get("rf_id")
        return int(value) if isinstance(value, int) else None

    @property
    def op_schema(self) -> str:
        return str(self.attrs.get("op_schema") or "")

    def is_operator(self) -> bool:
        """A real operator (dispatcher op, collective record or compiled kernel), not an annotation."""
        if self.device_category is not None:
            return False
        return bool(self.op_schema) or self.name == "record_param_comms" \
            or self.attrs.get("kernel_backend") == "triton" or self.name.startswith(("aten::", "c10d::"))

    def tensors(self, which: str = "both") -> list[Tensor]:
        """Tensors among the "inputs", the "outputs" or "both" (computed once)."""
        found = self._tensors.get(which)
        if found is None:
            args = self.inputs if which == "inputs" else self.outputs if which == "outputs" \
                else self.inputs + self.outputs
            found = self._tensors[which] = [t for a in args for t in a.tensors()]
        return found


@dataclass(slots=True, eq=False)
class HostTrace:
    """A parsed host trace: nodes by id, with the call tree built and checked."""

    path: str
    schema: str
    version: tuple[int, int, int]
    pid: int | None
    nodes: dict[int, HostNode]
    roots: list[int]
    process_groups: list[dict[str, Any]]  # the process_group:init records, as written

    def has_device_nodes(self) -> bool:
        return any(n.device_category is not None for n in self.nodes.values())


def read_json(path: str, what: str) -> Any:
    """Parse a plain or gzip-compressed JSON file (a regular file, at most the trace size limit once
    decompressed); one-line InputError naming the file otherwise."""
    limit = env_limit(MAX_TRACE_BYTES_ENV, DEFAULT_MAX_TRACE_BYTES)
    data = read_capped(path, what, limit, f"set {MAX_TRACE_BYTES_ENV}=SIZE (e.g. 8GiB) to allow larger traces")
    try:
        return json.loads(data)
    except UnicodeDecodeError:
        raise InputError(f"{shown_path(path)}: not JSON (binary data): expected a {what}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{shown_path(path)}: not JSON (line {e.lineno}, column {e.colno}: {e.msg}): expected a "
                         f"{what}") from None
    except RecursionError:
        raise InputError(f"{shown_path(path)}: JSON nested too deeply to be a {what}") from None


def duration_us(value: Any) -> float:
    """A recorded duration in µs: a finite, non-negative number (anything else counts as 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        return 0.0
    return float(value)


def schema_version(schema: Any) -> tuple[int, int, int] | None:
    """(1, 1, 1) from "1.1.1-chakra.0.0.4"; None when the text is not a version."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)(?:-.*)?", str(schema))
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def parse_host_trace(doc: Any, path: str) -> HostTrace:
    """Check a decoded host trace and build its call tree."""
    if not isinstance(doc, dict) or "nodes" not in doc or "schema" not in doc:
        hint = " (this is a Kineto/Chrome trace: pass it with --kineto)" \
            if isinstance(doc, dict) and "traceEvents" in doc else ""
        raise InputError(f"{path}: not a PyTorch execution trace: expected a JSON object with 'schema' and "
                         f"'nodes'{hint}")
    version = schema_version(doc["schema"])
    low, high = SUPPORTED_SCHEMAS
    if version is None or not low <= version <= high:
        raise InputError(f"{path}: unsupported execution-trace schema {doc['schema']!r} (supported: "
                         f"{'.'.join(map(str, low))} to {'.'.join(map(str, high))}, PyTorch 2.1 and later)")
    if not isinstance(doc["nodes"], list):
        raise InputError(f"{path}: 'nodes' is not a list")
    nodes: dict[int, HostNode] = {}
    process_groups: list[dict[str, Any]] = []
    for k, raw in enumerate(doc["nodes"]):
        node = _parse_node(raw, k, path)
        if node.id in nodes:
            raise InputError(f"{path}: node id {node.id} appears twice (node ids must be unique)")
        nodes[node.id] = node
        if node.name == PG_INIT:
            process_groups.extend(_process_groups(node, path))
    roots = _build_tree(nodes, path)
    pid = doc.get("pid")
    return HostTrace(path, str(doc["schema"]), version, pid if isinstance(pid, int) else None, nodes, roots,
                     process_groups)


def load_host_trace(path: str) -> HostTrace:
    return parse_host_trace(read_json(path, "PyTorch execution trace"), path)


def _parse_node(raw: Any, k: int, path: str) -> HostNode:
    if not isinstance(raw, dict):
        raise InputError(f"{path}: node #{k} is not a JSON object")
    node_id, name = raw.get("id"), raw.get("name")
    if not isinstance(node_id, int) or isinstance(node_id, bool) or node_id < 0:
        raise InputError(f"{path}: node #{k} has no valid 'id' (a non-negative integer)")
    if not isinstance(name, str):
        raise InputError(f"{path}: node {node_id} has no 'name'")
    parent = raw.get("ctrl_deps", raw.get("parent"))
    if parent is None:
        parent = node_id  # a root
    if not isinstance(parent, int) or isinstance(parent, bool):
        raise InputError(f"{path}: node {node_id}: 'ctrl_deps' must be the id of the enclosing node")
    raw_attrs = raw.get("attrs") or []
    if not isinstance(raw_attrs, list):
        raise InputError(f"{path}: node {node_id}: 'attrs' must be a list of {{name, type, value}} objects")
    attrs = {a["name"]: a.get("value") for a in reversed(raw_attrs)
             if type(a) is dict and type(a.get("name")) is str}  # the first of a name wins
    duration = raw.get("inclusive_dur", raw.get("dur"))
    category = raw.get("cat")
    return HostNode(node_id, name, parent, attrs, _arguments(raw.get("inputs"), node_id, "inputs", path),
                    _arguments(raw.get("outputs"), node_id, "outputs", path),
                    duration_us(duration) if isinstance(duration, (int, float)) else None,
                    str(category).lower() if isinstance(category, str) else None)


def _arguments(io: Any, node_id: int, which: str, path: str) -> list[Argument]:
    if io is None:
        return []
    if not isinstance(io, dict) or not all(isinstance(io.get(k) or [], list) for k in ("values", "shapes", "types")):
        raise InputError(f"{path}: node {node_id}: '{which}' must be an object with 'values', 'shapes' and "
                         "'types' lists (schema 1.0.2 and later)")
    values = io.get("values") or []
    types = io.get("types") or []
    shapes = io.get("shapes") or []
    if len(types) == len(values) == len(shapes):
        return [Argument(str(t), v, s) for v, t, s in zip(values, types, shapes, strict=True)]
    return [Argument(str(types[i]) if i < len(types) else "", v, shapes[i] if i < len(shapes) else None)
            for i, v in enumerate(values)]


def _process_groups(node: HostNode, path: str) -> list[dict[str, Any]]:
    for arg in node.inputs:
        if isinstance(arg.value, str):
            try:
                groups = json.loads(arg.value)
            except (json.JSONDecodeError, RecursionError):
                raise InputError(f"{shown_path(path)}: node {node.id} ({PG_INIT}): the process-group list is not "
                                 "JSON (or nested too deeply)") from None
            if isinstance(groups, dict):  # some versions key the groups by name
                groups = [{"pg_name": k, **v} for k, v in groups.items() if isinstance(v, dict)]
            if not isinstance(groups, list):
                raise InputError(f"{path}: node {node.id} ({PG_INIT}): expected a list of process groups")
            return [g for g in groups if isinstance(g, dict)]
    return []


def _build_tree(nodes: dict[int, HostNode], path: str) -> list[int]:
    """Link children to parents; roots are nodes that are their own parent or whose parent is absent.
    Every other node must reach a root: a loop of parents is an error in the input."""
    roots = []
    for node in nodes.values():
        if node.parent == node.id or node.parent not in nodes:
            roots.append(node.id)
        else:
            nodes[node.parent].children.append(node.id)
    reached = _reachable(nodes, roots)
    if len(reached) != len(nodes):
        start = min(set(nodes) - reached)
        loop = [start]
        while nodes[loop[-1]].parent not in loop:
            loop.append(nodes[loop[-1]].parent)
        cycle = loop[loop.index(nodes[loop[-1]].parent):]
        shown = " -> ".join(str(i) for i in cycle[:8]) + (" ..." if len(cycle) > 8 else "")
        raise InputError(f"{path}: the nodes' 'ctrl_deps' (parent) links form a cycle: {shown} -> {cycle[0]} "
                         "(each node must lie under a thread root)")
    for node in nodes.values():
        node.children.sort()
    roots.sort()
    return roots


def _reachable(nodes: dict[int, HostNode], roots: list[int]) -> set[int]:
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        seen.add(n)
        stack.extend(nodes[n].children)
    return seen
