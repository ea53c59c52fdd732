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
from typing import Any

import numpy as np

from compute.kernels import KernelModel
from compute.shapes import OpShape, shape_from_attributes
from workload.graph import TraceGraph
from workload.schema import NodeType

REPLAY = -1  # the node's time: its recorded duration
INT_KEYS = ("gemm_m", "gemm_n", "gemm_k", "gemm_batch", "attn_batch", "attn_heads", "attn_kv_heads", "attn_head_dim",
            "attn_seq_q", "attn_seq_kv")
BOOL_KEYS = ("attn_causal", "attn_backward", "attn_flash")


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
    tensor_size. Cached on the graph per model."""
    key = ("kernel_times", id(model))
    cached = graph.cache.get(key)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    n = graph.num_nodes
    attrs = graph.attrs
    out = NodeTimes([REPLAY] * n)
    classes = attrs.strings("op_class", strict=False) if attrs.has("op_class") else {}
    dtypes = attrs.strings("dtype", strict=False) if attrs.has("dtype") and classes else {}
    columns = {k: attrs.integers(k, n, strict=False) for k in (*INT_KEYS, *BOOL_KEYS) if classes and attrs.has(k)}
    shapes: dict[tuple[Any, ...], tuple[OpShape | None, str]] = {}
    for i in np.flatnonzero(gpu_compute).tolist():
        op_class = classes.get(i)
        found: OpShape | None = None
        why = "no op_class attribute"
        if op_class is not None:
            values = tuple((k, int(v[i]) if k in INT_KEYS else bool(v[i])) for k, (v, present) in columns.items()
                           if present[i])
            signature = (op_class, dtypes.get(i), values)
            if signature not in shapes:
                attributes = {"op_class": op_class, "dtype": dtypes.get(i), **dict(values)}
                shapes[signature] = shape_from_attributes(attributes)
            found, why = shapes[signature]
        if found is not None:
            out.ns[i] = model.time_ns(found, num_ops[i], max(tensor_size[i], 0))
            out.shaped += 1
        elif has_work[i]:
            out.ns[i] = model.time_ns(None, max(num_ops[i], 0), max(tensor_size[i], 0))
            out.estimated[why] += 1
        else:
            out.replayed += 1
        if found is None and not out.example:
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
        parts.append(f"{counts.replayed:,} carry neither and replay their recorded durations")
    return (f"--compute-model kernels: {'; '.join(parts)} (e.g. {path}: {counts.example}); give compute nodes op_class "
            "and shape attributes, as `astrasim-py trace generate llm` writes them")


def is_gpu_compute(types: np.ndarray, is_cpu: np.ndarray) -> np.ndarray:
    return (types == NodeType.COMP_NODE) & ~is_cpu
