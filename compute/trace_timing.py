"""Every GPU compute node of a trace timed by the kernel model (``--compute-model kernels``), once per distinct
trace, with an account of the nodes it could only estimate.

A node's operator shape comes from its Chakra attributes (compute/shapes.py); shapes repeat (every layer of a
stage runs the same GEMMs), so each distinct attribute set is timed once. A node without a usable shape is timed
from ``num_ops``/``tensor_size`` by the model's fallback (a roofline at the device's kernel efficiencies), and one
with neither replays its recorded duration; the run says how many and why, once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from compute.kernels import KernelModel
from compute.shapes import SHAPE_BOOL_ATTRIBUTES, SHAPE_INT_ATTRIBUTES, OpShape, shape_from_attributes
from workload.graph import TraceGraph
from workload.schema import NodeType

REPLAY = -1  # the node's time: its recorded duration


@dataclass(slots=True)
class NodeTimes:
    """Per node index: the kernel model's time in ns (0: finishes at once) or REPLAY; and how nodes were timed."""

    ns: list[int]
    shaped: int = 0
    estimated: Counter[str] = field(default_factory=Counter)  # why a node fell back to FLOPs and bytes -> count
    replayed: int = 0
    example: str = ""


def node_times(graph: TraceGraph, model: KernelModel, gpu_compute: np.ndarray, num_ops: list[int],
               tensor_size: list[int], has_work: np.ndarray) -> NodeTimes:
    """The times of ``graph``'s GPU compute nodes (``gpu_compute`` mask); ``has_work``: the node carries num_ops or
    tensor_size. Nodes with equal attributes are timed once. Cached on the graph per model."""
    key = ("kernel_times", id(model))
    cached = graph.cache.get(key)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    n = graph.num_nodes
    attrs = graph.attrs
    out = NodeTimes([REPLAY] * n)
    nodes = np.flatnonzero(gpu_compute)
    classes = attrs.strings("op_class", strict=False) if attrs.has("op_class") and nodes.size else {}
    dtypes = attrs.strings("dtype", strict=False) if attrs.has("dtype") and classes else {}
    names = {None: 0}
    codes = np.zeros((n, 2), dtype=np.int64)  # op_class and dtype as small integers (0: absent)
    for column, strings in enumerate((classes, dtypes)):
        for i, text in strings.items():
            codes[i, column] = names.setdefault(text, len(names))
    text_of = {code: text for text, code in names.items()}
    keys = [k for k in (*SHAPE_INT_ATTRIBUTES, *SHAPE_BOOL_ATTRIBUTES) if classes and attrs.has(k)]
    columns = [codes, np.asarray(num_ops, dtype=np.int64)[:, None], np.asarray(tensor_size, dtype=np.int64)[:, None],
               has_work.astype(np.int64)[:, None]]
    for k in keys:
        values, present = attrs.integers(k, n, strict=False)
        columns += [values[:, None], present.astype(np.int64)[:, None]]
    table = np.hstack(columns)[nodes]
    distinct, inverse = np.unique(table, axis=0, return_inverse=True)
    times = np.empty(len(distinct), dtype=np.int64)
    kinds = np.empty(len(distinct), dtype=np.int64)  # 0 shaped, 1 estimated, 2 replayed
    reasons: list[str] = []
    for row, values in enumerate(distinct.tolist()):
        op_class, dtype, ops, size, work = text_of[values[0]], text_of[values[1]], values[2], values[3], values[4]
        found: OpShape | None = None
        why = "no op_class attribute"
        if op_class is not None:
            extra = {k: (v if k in SHAPE_INT_ATTRIBUTES else bool(v)) for k, v, present in
                     zip(keys, values[5::2], values[6::2], strict=True) if present}
            found, why = shape_from_attributes({"op_class": op_class, "dtype": dtype, **extra})
        reasons.append(why)
        if found is not None:
            times[row], kinds[row] = model.time_ns(found, ops, max(size, 0)), 0
        elif work:
            times[row], kinds[row] = model.time_ns(None, max(ops, 0), max(size, 0)), 1
        else:
            times[row], kinds[row] = REPLAY, 2
    inverse = inverse.reshape(-1)
    ns = np.full(n, REPLAY, dtype=np.int64)
    ns[nodes] = times[inverse]
    out.ns = ns.tolist()
    node_kinds = kinds[inverse]
    out.shaped = int(np.count_nonzero(node_kinds == 0))
    out.replayed = int(np.count_nonzero(node_kinds == 2))
    for row, count in zip(*np.unique(inverse[node_kinds == 1], return_counts=True), strict=True):
        out.estimated[reasons[int(row)]] += int(count)
    unshaped = nodes[node_kinds != 0]
    if unshaped.size:
        i = int(unshaped[0])
        out.example = f"node {graph.node_id(i)} ({graph.name(i)!r})"
    graph.cache[key] = out
    return out


def describe(counts: NodeTimes, total: int, path: str) -> str:
    """The run's one warning about nodes the kernel model could not time by shape ('' when there are none)."""
    estimated = sum(counts.estimated.values())
    if not estimated and not counts.replayed:
        return ""
    parts = []
    if estimated:
        why = "; ".join(f"{reason}: {n:,}" for reason, n in counts.estimated.most_common(3))
        parts.append(f"{estimated:,} of {total:,} GPU compute nodes have no usable operator shape ({why}) and are "
                     "estimated from num_ops/tensor_size by a roofline at the device's kernel efficiencies")
    if counts.replayed:
        parts.append(f"{counts.replayed:,} {'more' if estimated else f'of {total:,} GPU compute nodes'} carry "
                     "neither an operator shape nor num_ops/tensor_size and replay their recorded durations")
    return (f"--compute-model kernels: {'; '.join(parts)} (e.g. {path}: {counts.example}); give compute nodes op_class "
            "and shape attributes, as `astrasim-py trace generate llm` writes them")


def is_gpu_compute(types: np.ndarray, is_cpu: np.ndarray) -> np.ndarray:
    return (types == NodeType.COMP_NODE) & ~is_cpu
