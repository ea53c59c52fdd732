"""Checks that make a decoded trace safe to simulate, and the dependency structure they produce.

Every problem is a TraceError naming the node and saying what to do; the file and rank are filled in
by the caller that knows them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from workload.errors import TraceError
from workload.graph import TraceGraph
from workload.schema import CollectiveType, NodeType

# Attributes a node type cannot do without (ASTRA-sim stops with an exception when they are missing).
# Communication nodes marked ``is_cpu_op`` are host-side records of a collective (PyTorch traces have
# them) and need none: they are replayed by their duration.
REQUIRED_ATTRIBUTES: dict[NodeType, tuple[str, ...]] = {
    NodeType.COMM_COLL_NODE: ("comm_type", "comm_size"),
    NodeType.COMM_SEND_NODE: ("comm_dst", "comm_size", "comm_tag"),
    NodeType.COMM_RECV_NODE: ("comm_src", "comm_size", "comm_tag"),
    NodeType.MEM_LOAD_NODE: ("tensor_size",),
    NodeType.MEM_STORE_NODE: ("tensor_size",),
}
NON_NEGATIVE_ATTRIBUTES = ("comm_size", "comm_src", "comm_dst", "comm_tag", "tensor_size", "num_ops",
                           "comm_priority")


@dataclass(slots=True, eq=False)
class Dependencies:
    """The dependency graph as node indices: each node's distinct parents (data and control together)
    and children, in CSR form, plus what was dropped on request (dependencies that can never be met)."""

    parent_ptr: np.ndarray
    parents: np.ndarray
    child_ptr: np.ndarray
    children: np.ndarray
    dropped_dangling: int  # dependency edges dropped because their parent is not in the file
    dangling_parents: int  # distinct absent parent ids among them
    dropped_self: int  # self-dependencies dropped

    @property
    def num_parents(self) -> np.ndarray:
        return np.diff(self.parent_ptr)


def validate(graph: TraceGraph, *, drop_dangling: bool = False) -> Dependencies:
    """Check ids, types, attributes and dependencies; return the dependency structure (cached on the graph)."""
    key = f"deps:{drop_dangling}"
    if key in graph.cache:
        return graph.cache[key]
    check_unique_ids(graph)
    check_node_types(graph)
    check_attributes(graph)
    deps = resolve_dependencies(graph, drop_dangling=drop_dangling)
    check_acyclic(graph, deps)
    graph.cache[key] = deps
    return deps


def check_unique_ids(graph: TraceGraph) -> None:
    ids = graph.ids
    dup = np.flatnonzero(ids[1:] == ids[:-1])
    if dup.size:
        node_id = int(ids[dup[0]])
        count = int(np.unique(ids[dup]).size)
        raise TraceError(f"duplicate node id ({count} id(s) appear more than once)", node_id=node_id,
                         hint="every node of a rank's trace needs its own id")


def check_node_types(graph: TraceGraph) -> None:
    bad = np.flatnonzero((graph.types < 0) | (graph.types > max(NodeType)))
    if bad.size:
        i = int(bad[0])
        valid = ", ".join(f"{t.value}={t.name}" for t in NodeType)
        raise TraceError(f"unknown node type {int(graph.types[i])}", node_id=graph.node_id(i),
                         hint=f"valid types: {valid}")


def check_attributes(graph: TraceGraph, changed: Collection[str] | None = None) -> None:
    """Check attribute values and the attributes each node type needs; ``changed``: only the values of these
    attributes changed since the graph passed (a variant, workload/variants.py)."""
    n = graph.num_nodes
    attrs = graph.attrs
    present: dict[str, np.ndarray] = {}
    for name in (*NON_NEGATIVE_ATTRIBUTES, "comm_type"):
        if changed is not None and name not in changed:
            continue
        values, mask = attrs.integers(name, n)
        present[name] = mask
        nodes = np.flatnonzero(mask)
        _check_values(graph, name, nodes, values[nodes])
    if changed is not None and "is_cpu_op" not in changed:
        return  # which nodes need which attributes is unchanged
    is_cpu, _ = attrs.integers("is_cpu_op", n)
    host_side = (is_cpu != 0) & (graph.types >= NodeType.COMM_SEND_NODE)
    for node_type, names in REQUIRED_ATTRIBUTES.items():
        of_type = (graph.types == node_type) & ~host_side
        for name in names:
            if name not in present:
                present[name] = attrs.integers(name, n)[1]
            missing = np.flatnonzero(of_type & ~present[name])
            if missing.size:
                i = int(missing[0])
                more = f" ({missing.size} such nodes)" if missing.size > 1 else ""
                hint = f"a {node_type.name} needs {', '.join(names)}"
                if graph.version and not graph.version.startswith("1."):
                    # e.g. ASTRA-sim's 2.0-era examples: Chakra 0.0.4 traces whose collectives carry no size in any
                    # field, which ASTRA-sim 2.x cannot run either
                    hint += (f"; this trace is Chakra schema {graph.version} and holds no such value in any other "
                             "field: regenerate it with a current Chakra")
                raise TraceError(f"{node_type.name} without its '{name}' attribute{more}", node_id=graph.node_id(i),
                                 hint=hint)


def check_changed_values(graph: TraceGraph, occurrences: np.ndarray, changed: Collection[str]) -> None:
    """check_attributes for a graph whose attribute values (of the attributes ``changed``) differ only at
    ``occurrences``, each the first of its name on its node, since it passed: the same errors, found among those
    occurrences alone."""
    if "is_cpu_op" in changed:  # which nodes need which attributes may change too
        check_attributes(graph, changed)
        return
    attrs = graph.attrs
    name_ids = attrs.name_id[occurrences]
    values = attrs.integers_at(occurrences)
    for name in (*NON_NEGATIVE_ATTRIBUTES, "comm_type"):
        if name in changed:
            which = name_ids == attrs.names.index(name)
            _check_values(graph, name, attrs.node[occurrences[which]], values[which])


def _check_values(graph: TraceGraph, name: str, nodes: np.ndarray, values: np.ndarray) -> None:
    """Refuse, naming the first node, a value out of the attribute's range; ``nodes`` (ascending) are nodes with the
    attribute and ``values`` their values."""
    if name in NON_NEGATIVE_ATTRIBUTES:
        neg = np.flatnonzero(values < 0)
        if neg.size:
            k = int(neg[0])
            raise TraceError(f"attribute '{name}' is negative ({int(values[k])})", node_id=graph.node_id(int(nodes[k])))
    if name == "comm_type":
        coll = graph.types[nodes] == NodeType.COMM_COLL_NODE
        bad = np.flatnonzero(coll & ((values < 0) | (values > max(CollectiveType))))
        if bad.size:
            k = int(bad[0])
            valid = ", ".join(f"{t.value}={t.name}" for t in CollectiveType)
            raise TraceError(f"unknown collective comm_type {int(values[k])}", node_id=graph.node_id(int(nodes[k])),
                             hint=f"valid types: {valid}")


def resolve_dependencies(graph: TraceGraph, *, drop_dangling: bool = False) -> Dependencies:
    """Map data and control dependencies to node indices, merged and de-duplicated per node."""
    n = graph.num_nodes
    child = np.concatenate((np.repeat(np.arange(n), np.diff(graph.data_ptr)),
                            np.repeat(np.arange(n), np.diff(graph.ctrl_ptr))))
    parent_ids = np.concatenate((graph.data_deps, graph.ctrl_deps))
    pos = np.searchsorted(graph.ids, parent_ids)
    found = pos < n
    found[found] = graph.ids[pos[found]] == parent_ids[found]
    dropped = absent = 0
    if not found.all():
        missing = np.flatnonzero(~found)
        dropped = int(missing.size)
        absent = int(np.unique(parent_ids[missing]).size)
        if not drop_dangling:
            k = int(missing[0])
            raise TraceError(
                f"depends on node {int(parent_ids[k])}, which is not in the file"
                f" ({dropped} dependencies in this file name {absent} absent node(s))",
                node_id=graph.node_id(int(child[k])),
                hint="fix the trace, or pass --drop-dangling-deps to ignore such dependencies")
        child, pos = child[found], pos[found]
    own = child == pos
    self_deps = int(np.count_nonzero(own))
    if self_deps:
        if not drop_dangling:
            node_id = graph.node_id(int(child[np.flatnonzero(own)[0]]))
            raise TraceError(f"dependency cycle: node {node_id} depends on itself ({self_deps} such nodes)",
                             node_id=node_id,
                             hint="fix the trace, or pass --drop-dangling-deps to ignore such dependencies")
        child, pos = child[~own], pos[~own]
    pairs = np.sort(child.astype(np.int64) * n + pos)  # by child, then parent
    pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if pairs.size else pairs
    child, parent = pairs // n, pairs % n
    parent_ptr = _pointers(child, n)
    order = np.argsort(parent, kind="stable")
    child_ptr = _pointers(parent[order], n)
    return Dependencies(parent_ptr=parent_ptr, parents=parent, child_ptr=child_ptr, children=child[order],
                        dropped_dangling=dropped, dangling_parents=absent, dropped_self=self_deps)


def _pointers(sorted_owner: np.ndarray, n: int) -> np.ndarray:
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(sorted_owner, minlength=n), out=ptr[1:])
    return ptr


def topological_order(deps: Dependencies) -> list[int]:
    """Node indices with every node after its parents (Kahn's algorithm, lowest index first among equals);
    nodes on or behind a cycle are left out."""
    remaining = deps.num_parents.tolist()
    child_ptr = deps.child_ptr.tolist()
    children = deps.children.tolist()
    order = [i for i, r in enumerate(remaining) if r == 0]
    for i in order:  # the list grows while it is walked
        for c in children[child_ptr[i] : child_ptr[i + 1]]:
            remaining[c] -= 1
            if remaining[c] == 0:
                order.append(c)
    return order


def check_acyclic(graph: TraceGraph, deps: Dependencies) -> None:
    """Raise TraceError naming the nodes of a cycle, if there is one."""
    n = graph.num_nodes
    owner = np.repeat(np.arange(n), np.diff(deps.parent_ptr))
    if np.all(deps.parents < owner):
        return  # every dependency points to a smaller id: no cycle is possible
    remaining = deps.num_parents.tolist()
    ready = [i for i in range(n) if remaining[i] == 0]
    child_ptr = deps.child_ptr.tolist()
    children = deps.children.tolist()
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for c in children[child_ptr[i] : child_ptr[i + 1]]:
            remaining[c] -= 1
            if remaining[c] == 0:
                ready.append(c)
    if done == n:
        return
    cycle = _find_cycle(deps, [r > 0 for r in remaining])
    ids = [graph.node_id(i) for i in cycle]
    shown = " -> ".join(str(i) for i in [*ids[:12], ids[0]]) if len(ids) <= 12 else \
        " -> ".join(str(i) for i in ids[:12]) + f" -> ... ({len(ids)} nodes)"
    raise TraceError(f"dependency cycle: {shown} (each waits for the next)", node_id=ids[0],
                     hint="a node cannot (indirectly) depend on itself; remove one of these dependencies")


def _find_cycle(deps: Dependencies, stuck: list[bool]) -> list[int]:
    """A cycle among the stuck nodes: each stuck node has a stuck parent, so following parents must loop."""
    start = stuck.index(True)
    seen: dict[int, int] = {}
    path: list[int] = []
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        lo, hi = int(deps.parent_ptr[node]), int(deps.parent_ptr[node + 1])
        node = next(p for p in deps.parents[lo:hi].tolist() if stuck[p])
    return path[seen[node]:]  # each node waits for the next one, and the last for the first
