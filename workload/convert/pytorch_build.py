"""One rank's host trace (and Kineto timing) as Chakra nodes.

Granularity: a compute node per top-level operator, i.e. an operator with no operator above it (annotations
such as thread roots, ``## forward ##`` or ``autograd::engine::evaluate_function: ...`` do not count), so
nested operators are not counted twice; its children's tensors and timing are rolled into it. Operators
that only make views or allocate are folded away. A ``c10d::`` operator, or one holding a
``record_param_comms`` record, is a communication node.

Dependencies keep every node's id above those of its parents, so the graph cannot have a cycle:
- data: an operator depends on the last earlier node that wrote a storage it reads (tensors are tracked
  by storage id, so views and in-place updates are followed);
- program order: each node waits for the previous node of its thread, except that nothing waits for a
  collective issued with ``async_op=True`` (its consumers do, through the data it writes);
- communication order: each collective or send/recv waits for the rank's previous one, so every rank
  issues them in its recorded order.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from workload.convert import pytorch_ops as ops
from workload.convert.pytorch_groups import GroupTable
from workload.convert.pytorch_kineto import DeviceTrace
from workload.convert.pytorch_shapes import op_shape
from workload.convert.pytorch_trace import HostNode, HostTrace
from workload.errors import InputError
from workload.groups import process_groups_node
from workload.schema import CollectiveType, NodeType
from workload.writer import make_node

COLLECTIVE_TYPES = {"all_reduce": CollectiveType.ALL_REDUCE, "all_gather": CollectiveType.ALL_GATHER,
                    "reduce_scatter": CollectiveType.REDUCE_SCATTER, "all_to_all": CollectiveType.ALL_TO_ALL,
                    "broadcast": CollectiveType.BROADCAST}


@dataclass(slots=True, eq=False)
class Unit:
    """A top-level operator and everything it called."""

    node: HostNode
    subtree: list[HostNode]
    comm: ops.CommOp | None
    zero_work: bool


@dataclass(slots=True)
class Report:
    """What the conversion left out or could not know, counted over all ranks."""

    unsupported: Counter[str] = field(default_factory=Counter)  # communication the simulator cannot run
    unknown_group: int = 0
    compute: int = 0
    timed: int = 0  # compute nodes with a duration from Kineto or the trace

    def warnings(self, ranks: int) -> list[str]:
        lines = []
        if self.unsupported:
            shown = ", ".join(f"{name} x{count}" for name, count in self.unsupported.most_common())
            lines.append(f"skipped {sum(self.unsupported.values())} communication op(s) the simulator cannot "
                         f"run or that lack a size or peer ({shown}) over {ranks} rank(s)")
        if self.unknown_group:
            lines.append(f"{self.unknown_group} collective(s) do not say which process group they use (gloo "
                         "records none): they were assigned to the default group of all ranks")
        if self.compute and not self.timed:
            lines.append("no operator timing in the host traces and no --kineto traces: compute nodes have "
                         "duration 0 (they carry num_ops and tensor_size for the roofline model)")
        return lines


def find_units(trace: HostTrace) -> list[Unit]:
    """The top-level operators of a trace in id order."""
    units: list[Unit] = []
    stack = list(reversed(trace.roots))
    while stack:
        node = trace.nodes[stack.pop()]
        if node.is_operator():
            subtree = _subtree(trace, node)
            units.append(Unit(node, subtree, ops.comm_op(node, subtree)
                              if ops.is_communication(node, subtree) else None, ops.is_zero_work(subtree)))
        else:
            stack.extend(reversed(node.children))
    units.sort(key=lambda u: u.node.id)
    return units


def _subtree(trace: HostTrace, top: HostNode) -> list[HostNode]:
    out, stack = [], [top.id]
    while stack:
        node = trace.nodes[stack.pop()]
        out.append(node)
        stack.extend(node.children)
    out.sort(key=lambda n: n.id)
    return out


def register_groups(units: list[Unit], groups: GroupTable, where: str) -> None:
    """Add the groups that collective records describe themselves (rank start/stride/size)."""
    for u in units:
        if u.comm is not None and isinstance(u.comm.pg_ref, str) and u.comm.pg_ranks is not None:
            groups.add(u.comm.pg_ref, u.comm.pg_ranks, where)


class RankBuilder:
    """Turns the units of one rank into Chakra nodes."""

    def __init__(self, rank: int, trace: HostTrace, units: list[Unit], device: DeviceTrace | None,
                 groups: GroupTable, report: Report) -> None:
        self.rank, self.trace, self.units, self.device = rank, trace, units, device
        self.groups, self.report = groups, report
        self.device_timed = bool(device and device.device_events) or trace.has_device_nodes()
        self.shift = 1 if units and units[0].node.id == 0 else 0  # id 0 is the METADATA node's

    def build(self) -> list[Any]:
        emitted: dict[int, Unit] = {}
        kinds: dict[int, tuple[NodeType, list[tuple[str, Any]], int]] = {}
        for u in self.units:
            made = self._describe(u)
            if made is not None:
                emitted[u.node.id] = u
                kinds[u.node.id] = made
        data = self._data_deps(emitted)
        nodes: list[Any] = []
        if self.groups.has_subgroups():
            nodes.append(process_groups_node(0, self.groups.declared()))
        last_of_thread: dict[int, int] = {}
        last_comm: int | None = None
        for node_id, u in emitted.items():
            node_type, attrs, duration_us = kinds[node_id]
            ctrl = set()
            if u.node.tid in last_of_thread:
                ctrl.add(last_of_thread[u.node.tid])
            is_comm = node_type != NodeType.COMP_NODE
            if is_comm and last_comm is not None:
                ctrl.add(last_comm)
            if not (is_comm and u.comm is not None and not u.comm.blocking):
                last_of_thread[u.node.tid] = node_id
            if is_comm:
                last_comm = node_id
            deps = sorted(data.get(node_id, ()))
            nodes.append(make_node(
                node_id + self.shift, _display_name(u), node_type, data_deps=[d + self.shift for d in deps],
                ctrl_deps=[c + self.shift for c in sorted(ctrl - set(deps))], duration_micros=duration_us,
                attrs=attrs, inputs=_io(u.node, "inputs"), outputs=_io(u.node, "outputs")))
        return nodes

    def _timing(self, u: Unit) -> tuple[float, float]:
        """(device time the unit launched, its host time), in µs."""
        device_us = sum(n.host_duration_us or 0.0 for n in u.subtree if n.device_category is not None)
        host_us = u.node.host_duration_us or 0.0
        if self.device is not None:
            device_us += sum(self.device.device_us.get(n.rf_id, 0.0) for n in u.subtree if n.rf_id is not None)
            if u.node.rf_id is not None:
                host_us = self.device.host_us.get(u.node.rf_id, host_us)
        return device_us, host_us

    def _describe(self, u: Unit) -> tuple[NodeType, list[tuple[str, Any]], int] | None:
        """(node type, attributes, duration µs) of a unit, or None when it becomes no node."""
        device_us, host_us = self._timing(u)
        common = [("rf_id", u.node.rf_id or 0), ("tid", u.node.tid)]
        if u.comm is not None:
            return self._describe_comm(u, u.comm, round(device_us or host_us), common)
        if u.zero_work and device_us == 0:
            return None
        self.report.compute += 1
        on_cpu = self.device_timed and device_us == 0
        duration = host_us if on_cpu or not self.device_timed else device_us
        if duration > 0:
            self.report.timed += 1
        shape = op_shape(u.node)  # for --compute-model kernels
        attrs = [("is_cpu_op", on_cpu), ("num_ops", ops.num_ops(u.node)),
                 ("tensor_size", ops.tensor_bytes(u.node)), *common, *(shape.attributes() if shape else [])]
        return NodeType.COMP_NODE, attrs, round(duration)

    def _describe_comm(self, u: Unit, comm: ops.CommOp, duration_us: int, common: list[tuple[str, Any]]
                       ) -> tuple[NodeType, list[tuple[str, Any]], int] | None:
        if comm.kind in ops.SILENT_KINDS:
            return None
        if (comm.kind not in COLLECTIVE_TYPES and comm.kind not in ops.P2P_KINDS) or comm.size_bytes <= 0:
            self.report.unsupported[_display_name(u) + ("" if comm.size_bytes > 0 else " (no size)")] += 1
            return None
        name = self.groups.resolve(comm.pg_ref)
        if name is None and self.groups.has_subgroups():
            self.report.unknown_group += 1
        if comm.kind in COLLECTIVE_TYPES:
            attrs: list[tuple[str, Any]] = [("is_cpu_op", False), ("comm_type", int(COLLECTIVE_TYPES[comm.kind])),
                                            ("comm_size", comm.size_bytes)]
            number = self.groups.number(name)
            if number is not None:
                attrs.append(("pg_name", str(number)))
            return NodeType.COMM_COLL_NODE, attrs + common, duration_us
        if comm.peer is None:
            self.report.unsupported[f"{_display_name(u)} (no peer)"] += 1
            return None
        members = self.groups.ranks_of(name)
        if not 0 <= comm.peer < len(members):
            raise InputError(f"{self.trace.path}: node {u.node.id} ({u.node.name}): peer rank {comm.peer} is "
                             f"outside its process group of {len(members)} rank(s)")
        peer = members[comm.peer]
        if peer == self.rank:
            raise InputError(f"{self.trace.path}: node {u.node.id} ({u.node.name}): rank {self.rank} "
                             "communicates with itself (are the host traces given in rank order?)")
        src, dst = (self.rank, peer) if comm.kind == "send" else (peer, self.rank)
        node_type = NodeType.COMM_SEND_NODE if comm.kind == "send" else NodeType.COMM_RECV_NODE
        attrs = [("is_cpu_op", False), ("comm_src", src), ("comm_dst", dst), ("comm_size", comm.size_bytes),
                 ("comm_tag", comm.tag)]
        return node_type, attrs + common, duration_us

    def _data_deps(self, emitted: dict[int, Unit]) -> dict[int, set[int]]:
        """Producer -> consumer links by storage, each from a smaller id to a larger one."""
        owner: dict[int, int] = {}
        for node_id, u in emitted.items():
            for n in u.subtree:
                owner[n.id] = node_id
        last_writer: dict[int, int] = {}
        deps: dict[int, set[int]] = {}
        for node_id in sorted(owner):
            unit_id = owner[node_id]
            node = self.trace.nodes[node_id]
            if emitted[unit_id].comm is not None:  # communication reads all its buffers
                reads, writes = node.tensors(), ops.written_tensors(node)
            else:
                reads = node.tensors("inputs")
                writes = [] if ops.is_zero_work([node]) else node.tensors("outputs")
            for t in reads:
                writer = last_writer.get(t.storage_id)
                if writer is not None and writer < unit_id:
                    deps.setdefault(unit_id, set()).add(writer)
            for t in writes:
                if t.storage_id > 0:
                    last_writer[t.storage_id] = unit_id
        return deps


def _display_name(u: Unit) -> str:
    """The operator's name; a bare record_param_comms is named after its collective."""
    if u.node.name == "record_param_comms" and u.comm is not None:
        return f"record_param_comms:{u.comm.kind}"
    return u.node.name


def _io(node: HostNode, which: str) -> dict[str, str]:
    args = node.inputs if which == "inputs" else node.outputs
    return {"values": "", "shapes": json.dumps([a.shape for a in args], separators=(",", ":")),
            "types": json.dumps([a.type for a in args], separators=(",", ":"))}
