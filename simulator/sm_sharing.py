"""Communication kernels take SMs from the compute they overlap (``--sm-sharing``).

An NCCL collective is a GPU kernel with one thread block per channel, and each block keeps a streaming
multiprocessor (SM) busy from the kernel's launch (it spins until its peers arrive) to its end. A GEMM or
attention kernel that runs meanwhile gets the remaining SMs: its tiles are spread over ``S - c`` SMs instead of
``S``, so it takes ``S / (S - c)`` times as long. That is the first-order cost of overlapping data-parallel
gradient and parameter collectives with the backward and forward passes; NVIDIA's forums show it can be worse (a
single-wave GEMM of 132 blocks beside a 24-block all-gather on an H100 nearly doubles: the blocks that did not
fit run as a second wave), so this is the mild end of the effect. Memory-bound kernels are not slowed: a fraction
of the SMs already saturates HBM, and a collective's own HBM traffic at network rates is small beside it.

The blocks come from the NCCL-like model's choice (``Candidate.channels``), or from the collective's
``comm_sms`` attribute where a kernel other than NCCL's runs it (Transformer Engine's userbuffers: 16 SMs), and
the SM count from the device file (``compute_units``). A kernel's slowdown is fixed when it starts, from the
SMs held then (kernels are short beside the collectives that overlap them). Sends and receives hold none:
tensor-parallel ring exchanges run on copy engines (Transformer Engine's userbuffers) and pipeline sends are
small.
"""

from __future__ import annotations

import numpy as np

from workload.graph import TraceGraph
from workload.schema import COMM_SMS

SM_BOUND_CLASSES = ("gemm", "attention")  # op_class values whose kernels spread over every SM


class SmSharing:
    """One rank's SMs held by its running collectives, and the slowdown of the compute-bound kernels it starts."""

    __slots__ = ("bound", "held", "holding", "stated", "total")

    def __init__(self, graph: TraceGraph, total_sms: int) -> None:
        self.total = total_sms
        self.held = 0
        self.holding: dict[int, int] = {}  # collective node -> blocks it holds
        self.bound = sm_bound_nodes(graph)
        self.stated = _stated_sms(graph)

    def hold(self, node: int, blocks: int) -> None:
        """Collective ``node`` runs; ``blocks`` NCCL would launch for it (its comm_sms attribute wins)."""
        blocks = self.stated.get(node, blocks)
        self.holding[node] = blocks
        self.held += blocks

    def release(self, node: int) -> None:
        self.held -= self.holding.pop(node, 0)

    def scaled(self, node: int, runtime_ns: int) -> int:
        """``runtime_ns`` of compute node ``node`` started now."""
        if not self.held or not self.bound[node]:
            return runtime_ns
        free = max(self.total - self.held, 1)
        return -(-runtime_ns * self.total // free)


def sm_bound_nodes(graph: TraceGraph) -> list[bool]:
    """Per node: a kernel whose work spreads over every SM (its op_class is a GEMM or attention); cached."""
    cached = graph.cache.get("sm_bound")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    bound = np.zeros(graph.num_nodes, dtype=bool)
    if graph.attrs.has("op_class"):
        for i, text in graph.attrs.strings("op_class", strict=False).items():
            bound[i] = text.lower() in SM_BOUND_CLASSES
    out = bound.tolist()
    graph.cache["sm_bound"] = out
    return out


def _stated_sms(graph: TraceGraph) -> dict[int, int]:
    """Per collective node carrying a positive comm_sms attribute: its value; cached."""
    cached = graph.cache.get("comm_sms")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    out: dict[int, int] = {}
    if graph.attrs.has(COMM_SMS):
        values, present = graph.attrs.integers(COMM_SMS, graph.num_nodes, strict=False)
        out = {int(i): int(values[i]) for i in np.flatnonzero(present & (values > 0))}
    graph.cache["comm_sms"] = out
    return out
