"""A stage program under construction: its nodes and the helpers that add them.

Every rank of a stage runs the same program and differs only in its communicator groups and send/recv peers,
which workload/llm/emit.py fills in. Compute nodes form one chain in program order (one GPU stream, as ASTRA-sim
runs one compute node at a time per rank); a collective or a send runs beside compute whenever no dependency
orders them. ASTRA-sim runs one communication node at a time per rank; the simulator's ``--comm-streams
communicator`` runs one per communicator (a collective's group, a send's peer), as NCCL's streams do, so the
data-parallel buckets no longer hold up tensor- or pipeline-parallel traffic. Overlap is expressed by what waits
for what.

A communicator runs its collectives in the order the host issued them, on every rank alike (NCCL queues them on
one stream), whatever order their data would allow: ``order_collectives`` chains each communicator's collectives
in issue order once a program is built.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from workload.llm.costs import Kernel
from workload.schema import NodeType

Peer = int | tuple[str, int]  # a pipeline stage offset, or (dimension, offset) along tp/cp/pp (wrapping around)


@dataclass(slots=True)
class Op:
    """A node of a stage program; its node id is its index + 1 (id 0 is the METADATA node).

    Collectives name a group kind (see workload/llm/ranks.py); sends and receives a peer and tag. ``host_us``
    marks a host-side (CPU) node of that duration."""

    name: str
    node_type: int
    phase: str  # fwd, bwd, recompute, optimizer, sync, tail
    deps: list[int]
    ctrl: list[int] = field(default_factory=list)
    kernel: Kernel | None = None
    comm_type: int = 0
    size_bytes: int = 0
    group: str = ""
    peer: Peer = 0
    tag: int = 0
    host_us: int | None = None
    sms: int = 0  # a collective run by a kernel on this many SMs rather than NCCL's (Transformer Engine userbuffers)
    library: str = ""  # a collective run by another library than NCCL (an expert-parallel exchange's DeepEP/HybridEP)


@dataclass(slots=True)
class StageProgram:
    """A stage's ops; ``layers`` its layers in order (a range, or with virtual stages those of its chunks)."""

    stage: int
    layers: range | tuple[int, ...]
    ops: list[Op]


class Program:
    """The ops of one stage and the node helpers every part of the builder shares."""

    def __init__(self, kinds: set[str], ring_tag_base: int) -> None:
        self.ops: list[Op] = []
        self.last_compute = 0
        self.prev_compute = 0  # the compute node before last_compute (0: none)
        self.last_host = 0  # the host chain's last node (workload/llm/host.py; 0: none yet)
        self.kinds = kinds  # the group kinds this stage's ranks have (size > 1)
        self._next_ring_tag = ring_tag_base

    def add(self, op: Op) -> int:
        self.ops.append(op)
        return len(self.ops)

    def compute(self, name: str, kernel: Kernel, deps: list[int], phase: str) -> list[int]:
        """A kernel after the previous one (the compute chain) and after ``deps``."""
        ctrl = [self.last_compute] if self.last_compute and self.last_compute not in deps else []
        self.prev_compute = self.last_compute
        self.last_compute = self.add(Op(name, NodeType.COMP_NODE, phase, list(deps), ctrl, kernel=kernel))
        return [self.last_compute]

    def host(self, name: str, duration_us: int, deps: list[int], phase: str) -> list[int]:
        """A host-side wait of ``duration_us`` (a CPU node: it holds no GPU stream)."""
        return [self.add(Op(name, NodeType.COMP_NODE, phase, list(deps), host_us=duration_us))]

    def issue(self, name: str, duration_us: int, phase: str, waits_for: list[int] | None = None) -> int:
        """The host issuing the next block of kernels: a CPU node after the host's previous one (one thread issues
        in program order) and after ``waits_for`` (what the host synchronises on); the block's last kernel then
        waits for it (``issued``)."""
        deps = ([self.last_host] if self.last_host else []) + list(waits_for or [])
        self.last_host = self.add(Op(name, NodeType.COMP_NODE, phase, deps, host_us=duration_us))
        return self.last_host

    def issued(self, host_node: int | None) -> None:
        """The last compute node so far ends no earlier than ``host_node`` (None: no host model) has run."""
        if host_node and self.last_compute > host_node:
            self.ops[self.last_compute - 1].deps.append(host_node)

    def coll_id(self, name: str, kind: str, comm_type: int, size_bytes: int, deps: list[int], phase: str,
                sms: int = 0, library: str = "") -> int | None:
        """A collective on this rank's ``kind`` group; None without such a group (size 1) or data."""
        if kind not in self.kinds or size_bytes == 0:
            return None
        return self.add(Op(name, NodeType.COMM_COLL_NODE, phase, list(deps), comm_type=comm_type,
                           size_bytes=size_bytes, group=kind, sms=sms, library=library))

    def coll(self, name: str, kind: str, comm_type: int, size_bytes: int, deps: list[int], phase: str,
             sms: int = 0, library: str = "") -> list[int]:
        """Like coll_id; returns what the next node depends on (the collective, or else ``deps``)."""
        got = self.coll_id(name, kind, comm_type, size_bytes, deps, phase, sms, library)
        return deps if got is None else [got]

    def p2p(self, name: str, send: bool, peer: Peer, tag: int, size_bytes: int, deps: list[int], phase: str,
            group: str = "pp") -> list[int]:
        node_type = NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE
        return [self.add(Op(name, node_type, phase, list(deps), size_bytes=size_bytes, group=group, peer=peer,
                            tag=tag))]

    def ring_step(self, name: str, dim: str, size_bytes: int, send_deps: list[int], recv_deps: list[int],
                  phase: str) -> tuple[list[int], list[int]]:
        """One step of a ring along ``dim`` (tp or cp): send to the next rank, receive from the previous one.
        Both ends of a step carry the same tag: every rank of the stage runs this program."""
        tag = self._next_ring_tag
        self._next_ring_tag += 1
        sent = self.p2p(name + "_send", True, (dim, +1), tag, size_bytes, send_deps, phase, group=dim)
        received = self.p2p(name + "_recv", False, (dim, -1), tag, size_bytes, recv_deps, phase, group=dim)
        return sent, received


def order_collectives(ops: list[Op], communicator: Mapping[str, int]) -> None:
    """Make each communicator's collectives wait for the one issued before them (a control dependency), so that
    no two of them are left unordered, which would let two ranks reach them in opposite orders: a deadlock under
    NCCL, refused by the simulator. ``communicator`` maps a group kind to its communicator (kinds whose groups
    hold the same ranks share one).

    The issue order is the host's: a collective is issued right after the last node it waits for, ties in
    program order, where a node's place is its position in the program and a collective's place is where it
    was issued (the host goes on once it has issued a collective). That is not always program order: FSDP's
    prefetched parameter all-gathers (dense, then experts') are issued before the gradient reduce-scatters of the
    layer whose backward they overlap, though added after them. Chaining in this order cannot close a cycle:
    along every dependency (issue place, node id) decreases."""
    place = [0] * (len(ops) + 1)  # a node's place in the host's order (see above); ids start at 1
    issued: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for node, op in enumerate(ops, start=1):
        if op.node_type == NodeType.COMM_COLL_NODE:
            place[node] = max((place[d] for d in (*op.deps, *op.ctrl)), default=0)
            issued[communicator[op.group]].append((place[node], node))
        else:
            place[node] = node
    for order in issued.values():
        order.sort()
        for (_, before), (_, after) in pairwise(order):
            if not _waits_for(ops, after, before):
                ops[after - 1].ctrl.append(before)


def _waits_for(ops: list[Op], node: int, target: int) -> bool:
    """Whether ``node`` already waits for ``target``, directly or through nodes added after ``target``."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        op = ops[stack.pop() - 1]
        for dep in (*op.deps, *op.ctrl):
            if dep == target:
                return True
            if dep > target and dep not in seen:
                seen.add(dep)
                stack.append(dep)
    return False
