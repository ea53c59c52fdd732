"""Stage programs -> per-rank Chakra ET files.

Every rank of a stage runs the same program, so a stage's compute nodes are serialized once and their bytes
reused for each of its ranks; collectives are serialized once per distinct communicator group, and only sends
and receives (whose peers differ on every rank) per rank.

With a groups file (the form ASTRA-sim 2.x runs), collectives over every rank name a group of every rank too.
ASTRA-sim numbers a collective's chunk-streams by the rank's count of every stream it started before, group
collectives included, unless the collective names a group (then by the group's own count); pipeline stages
issue different numbers of group collectives, so an unnamed collective over every rank (the gradient norm's
all-reduce) would get a different number on each stage and never pair. A group of every rank runs on the same
topology and dimensions as an unnamed collective, so the time is the same in both simulators.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

from compute.devices import Device
from compute.roofline import Roofline
from workload.groups import process_groups_node
from workload.limits import format_bytes
from workload.llm.build import build_programs
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import Group, ParallelPlan, RankMap
from workload.llm.program import Op, StageProgram
from workload.schema import COMM_LIBRARY, COMM_SMS, NodeType
from workload.traceset import Pace
from workload.wire import frame_payloads
from workload.writer import make_metadata, make_node, serialize

GENERATED_VERSION = "1.0.0"


def roofline_duration_us(roofline: Roofline, flops: int, size_bytes: int) -> int:
    """A kernel's roofline time rounded to whole microseconds (the trace's unit), at least 1 for a kernel that does
    any work: 0 reads as no recorded duration (1 ns in ASTRA-sim, and a warning that compute went untimed)."""
    return max(round(roofline.time_ns(flops, size_bytes) / 1000), 1 if flops > 0 or size_bytes > 0 else 0)


class TraceEmitter:
    """Serializes the programs of every stage for every rank; ``device`` fills compute durations."""

    def __init__(self, programs: list[StageProgram], ranks: RankMap, device: Device | None = None,
                 metadata: dict[str, Any] | None = None, groups_file: bool = False) -> None:
        self.programs = programs
        self.ranks = ranks
        # communicator groups in a comm-group JSON beside the traces (ASTRA-sim 2.x stops at METADATA nodes)
        # instead of a METADATA node in every trace
        self.groups_file = groups_file
        self.roofline = Roofline(device.peak_tflops * 1e12, device.memory_bw_GBps * 1e9) if device else None
        self.header = serialize(make_metadata(GENERATED_VERSION, metadata))
        self._compute: dict[int, list[bytes | None]] = {}
        self._collectives: dict[tuple[int, int, str], bytes] = {}
        self._templates: dict[int, list[tuple[str, Any, tuple[int, ...]]]] = {}
        # the number of the group of every rank written to the groups file (after the others), or 0 for none
        numbered = {g.gid for by_rank in ranks.groups.values() for g in by_rank.values()}
        self.world_gid = max(numbered) + 1 if groups_file and 0 in numbered else 0

    def _stage_compute(self, program: StageProgram) -> list[bytes | None]:
        cached = self._compute.get(program.stage)
        if cached is None:
            cached = [self._compute_node(i + 1, op) if op.node_type == NodeType.COMP_NODE else None
                      for i, op in enumerate(program.ops)]
            self._compute[program.stage] = cached
        return cached

    def _compute_node(self, node_id: int, op: Op) -> bytes:
        if op.host_us is not None:  # a host-side wait: a CPU node timed by its duration
            return serialize(make_node(node_id, op.name, NodeType.COMP_NODE, data_deps=op.deps, ctrl_deps=op.ctrl,
                                       duration_micros=op.host_us, attrs=[("is_cpu_op", True)]))
        kernel = op.kernel
        assert kernel is not None
        duration = roofline_duration_us(self.roofline, kernel.flops, kernel.size_bytes) if self.roofline else 0
        return serialize(make_node(node_id, op.name, NodeType.COMP_NODE, data_deps=op.deps, ctrl_deps=op.ctrl,
                                   duration_micros=duration,
                                   attrs=[("is_cpu_op", False), ("num_ops", kernel.flops),
                                          ("tensor_size", kernel.size_bytes), *kernel.attributes()]))

    def _written_group(self, rank: int, kind: str) -> Group:
        """``rank``'s group of ``kind`` as the traces name it: a group of every rank gets ``world_gid``."""
        group = self.ranks.group(rank, kind)
        assert group is not None, f"rank {rank} has no {kind} group"
        if group.gid == 0 and self.world_gid:
            return Group(self.world_gid, tuple(range(self.ranks.plan.world_size)))
        return group

    def _collective_node(self, stage: int, node_id: int, op: Op, rank: int) -> bytes:
        group = self._written_group(rank, op.group)
        key = (stage, node_id, group.pg_name)
        data = self._collectives.get(key)
        if data is None:
            attrs: list[tuple[str, Any]] = [("is_cpu_op", False), ("comm_type", op.comm_type),
                                            ("comm_size", op.size_bytes)]
            if group.pg_name:
                attrs.append(("pg_name", group.pg_name))
            if op.sms:
                attrs.append((COMM_SMS, op.sms))
            if op.library:
                attrs.append((COMM_LIBRARY, op.library))
            data = serialize(make_node(node_id, op.name, NodeType.COMM_COLL_NODE, data_deps=op.deps,
                                       ctrl_deps=op.ctrl, attrs=attrs))
            self._collectives[key] = data
        return data

    def _p2p_node(self, node_id: int, op: Op, rank: int) -> bytes:
        peer = self.ranks.peer(rank, op.peer)
        src, dst = (rank, peer) if op.node_type == NodeType.COMM_SEND_NODE else (peer, rank)
        return serialize(make_node(node_id, op.name, op.node_type, data_deps=op.deps, ctrl_deps=op.ctrl,
                                   attrs=[("is_cpu_op", False), ("comm_src", src), ("comm_dst", dst),
                                          ("comm_size", op.size_bytes), ("comm_tag", op.tag)]))

    def rank_bytes(self, rank: int) -> bytes:
        """The whole ET file of ``rank``: GlobalMetadata, its process groups (node 0), then its program."""
        stage = self.ranks.coords(rank)[2]
        program = self.programs[stage]
        compute = self._stage_compute(program)
        payloads = [self.header]
        groups = {} if self.groups_file else self.ranks.rank_groups(rank)
        if groups:
            payloads.append(serialize(process_groups_node(0, groups)))
        for i, op in enumerate(program.ops):
            data = compute[i]
            if data is None:
                if op.node_type == NodeType.COMM_COLL_NODE:
                    data = self._collective_node(stage, i + 1, op, rank)
                else:
                    data = self._p2p_node(i + 1, op, rank)
            payloads.append(data)
        return frame_payloads(payloads)

    def structure(self, rank: int) -> tuple[bytes, tuple[tuple[Any, ...], ...]]:
        """The rank described without its trace, for folding equal ranks (simulator/quotient.py): a key equal
        for ranks whose traces differ only in the ranks they name (same stage program, same METADATA node), and
        the distinct values they name in the template's order: ("peer", True, rank) for sends and receives,
        ("group", collective types, members (() for all ranks), group number) for collectives. It describes the
        traces with METADATA nodes (the simulator folds from it only when no groups file is given)."""
        stage = self.ranks.coords(rank)[2]
        template = self._templates.get(stage)
        if template is None:
            slots: dict[tuple[str, Any], set[int]] = {}
            for op in self.programs[stage].ops:
                if op.node_type == NodeType.COMM_COLL_NODE:
                    slots.setdefault(("group", op.group), set()).add(op.comm_type)
                elif op.node_type in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
                    slots.setdefault(("peer", op.peer), set())
            template = self._templates[stage] = [(kind, which, tuple(sorted(types)))
                                                 for (kind, which), types in slots.items()]
        metadata = not self.groups_file and bool(self.ranks.rank_groups(rank))
        # slots naming the same rank or group (a ring of two: next = previous) are one value, as in the trace
        merged: dict[tuple[Any, ...], set[int]] = {}
        pattern = []
        for kind, which, types in template:
            if kind == "peer":
                value: tuple[Any, ...] = ("peer", True, self.ranks.peer(rank, which))
            else:
                group = self.ranks.group(rank, which)
                assert group is not None, f"rank {rank} has no {which} group"
                value = ("group", group.ranks if group.gid else (), group.gid)
            pattern.append(list(merged).index(value) if value in merged else len(merged))
            merged.setdefault(value, set()).update(types)
        key = hashlib.blake2b(repr((stage, metadata, template, pattern)).encode(), digest_size=20).digest()
        values = tuple(("group", tuple(sorted(types)), v[1], v[2]) if v[0] == "group" else v
                       for v, types in merged.items())
        return key, values

    def all_groups(self) -> dict[str, list[int]]:
        """Every numbered communicator group, as ASTRA-sim's comm-group JSON holds them ({"1": [ranks], ...}),
        with the group of every rank when the traces name it (``world_gid``)."""
        found = {g.gid: g.ranks for by_rank in self.ranks.groups.values() for g in by_rank.values() if g.gid}
        if self.world_gid:
            found[self.world_gid] = tuple(range(self.ranks.plan.world_size))
        return {str(gid): list(found[gid]) for gid in sorted(found)}

    def write(self, prefix: str, progress: Callable[[str], None] | None = None) -> list[str]:
        """Write ``<prefix>.<rank>.et`` for every rank (and, with ``groups_file``, ``<prefix>.comm_groups.json``);
        returns the trace paths. ``progress`` gets a line every 10 s while that takes long (16,384 ranks of Llama-3
        405B: 8.1 GB in 2.5 minutes)."""
        directory = os.path.dirname(prefix)
        if directory:
            os.makedirs(directory, exist_ok=True)
        if self.groups_file:
            with open(f"{prefix}.comm_groups.json", "w") as f:
                json.dump(self.all_groups(), f)
                f.write("\n")
        paths = []
        world = self.ranks.plan.world_size
        pace, written = Pace(progress), 0
        for rank in range(world):
            path = f"{prefix}.{rank}.et"
            with open(path, "wb") as f:
                written += f.write(self.rank_bytes(rank))
            paths.append(path)
            pace.tick(lambda done=written: f"writing traces: {len(paths):,} of {world:,} ranks, {format_bytes(done)}")
        return paths


def generate_traces(model: ModelConfig, plan: ParallelPlan, prefix: str, device: Device | None = None,
                    options: TrainingOptions | None = None) -> list[str]:
    """Validate, build and write the traces of one iteration of ``model`` under ``plan``; returns the paths."""
    options = options or TrainingOptions()
    model.validate()
    plan.validate(model)
    options.validate(plan.zero_stage, plan.sequence_parallel, plan.tp, plan.pp)
    ranks = options.rank_map(plan, model)
    return TraceEmitter(build_programs(model, plan, options), ranks, device).write(prefix)
