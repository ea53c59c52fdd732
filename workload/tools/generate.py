"""``astrasim-py trace generate``: microbenchmark traces, one ``<name>.<rank>.et`` file per rank.

Every generator returns, per rank, the list of Node messages; ``write_rank_traces`` writes them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from workload.errors import InputError
from workload.schema import CollectiveType, NodeType
from workload.writer import make_node, write_trace

GENERATED_VERSION = "1.0.0"
COLLECTIVE_NAMES = {
    "all_reduce": CollectiveType.ALL_REDUCE,
    "all_gather": CollectiveType.ALL_GATHER,
    "reduce_scatter": CollectiveType.REDUCE_SCATTER,
    "all_to_all": CollectiveType.ALL_TO_ALL,
    "broadcast": CollectiveType.BROADCAST,
}
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes from "1048576", "1MiB", "64KiB", "1.5GB" (KB/MB/GB decimal, KiB/MiB/GiB and K/M/G binary)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if m is None or m[2].lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 1048576, 64KiB, 1MiB, 1GB)")
    value = float(m[1]) * _UNITS[m[2].lower()]
    if value != int(value) or value < 0:
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def size_label(size_bytes: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= factor and size_bytes % factor == 0:
            return f"{size_bytes // factor}{unit}"
    return f"{size_bytes}B"


def collective(npus: int, comm_type: CollectiveType, size_bytes: int, *, repeat: int = 1,
               pg_name: str | None = None, involved_dim: Sequence[bool] | None = None,
               duration_micros: int = 0) -> list[list[Any]]:
    """Each rank issues ``repeat`` collectives in a chain (``duration_micros`` only matters for broadcast)."""
    traces = []
    for _rank in range(npus):
        nodes = []
        for k in range(repeat):
            attrs: list[tuple[str, Any]] = [("is_cpu_op", False), ("comm_type", int(comm_type)),
                                            ("comm_size", size_bytes)]
            if pg_name is not None:
                attrs.append(("pg_name", pg_name))
            if involved_dim is not None:
                attrs.append(("involved_dim", list(involved_dim)))
            nodes.append(make_node(k, f"{comm_type.name.lower()}_{size_label(size_bytes)}_{k}",
                                   NodeType.COMM_COLL_NODE, data_deps=[k - 1] if k else [],
                                   duration_micros=duration_micros, attrs=attrs))
        traces.append(nodes)
    return traces


def compute(npus: int, count: int, *, duration_micros: int = 0, num_ops: int = 0, tensor_size: int = 0,
            independent: bool = False) -> list[list[Any]]:
    """``count`` compute nodes per rank, chained unless ``independent``; timed by duration or by roofline."""
    traces = []
    for _rank in range(npus):
        nodes = []
        for k in range(count):
            attrs: list[tuple[str, Any]] = [("is_cpu_op", False)]
            if num_ops or tensor_size:
                attrs += [("num_ops", num_ops), ("tensor_size", tensor_size)]
            deps = [k - 1] if k and not independent else []
            nodes.append(make_node(k, f"compute_{k}", NodeType.COMP_NODE, data_deps=deps,
                                   duration_micros=duration_micros, attrs=attrs))
        traces.append(nodes)
    return traces


def sendrecv_ring(npus: int, size_bytes: int, *, iterations: int = 1, tag_base: int = 0) -> list[list[Any]]:
    """Each rank sends to rank+1 and receives from rank-1 (mod npus), ``iterations`` times in sequence.

    The send and receive of one iteration are independent; the next iteration waits for both. Tags are
    ``tag_base + iteration`` so that the pairs match.
    """
    if npus < 2:
        raise ValueError("a send/recv ring needs at least 2 NPUs")
    traces = []
    for rank in range(npus):
        nodes = []
        prev: list[int] = []
        for k in range(iterations):
            send_id, recv_id = 2 * k, 2 * k + 1
            tag = tag_base + k
            nodes.append(make_node(send_id, f"send_{k}", NodeType.COMM_SEND_NODE, data_deps=prev, attrs=[
                ("is_cpu_op", False), ("comm_src", rank), ("comm_dst", (rank + 1) % npus),
                ("comm_size", size_bytes), ("comm_tag", tag)]))
            nodes.append(make_node(recv_id, f"recv_{k}", NodeType.COMM_RECV_NODE, data_deps=prev, attrs=[
                ("is_cpu_op", False), ("comm_src", (rank - 1) % npus), ("comm_dst", rank),
                ("comm_size", size_bytes), ("comm_tag", tag)]))
            prev = [send_id, recv_id]
        traces.append(nodes)
    return traces


def memory(npus: int, tensor_size: int, *, kind: str = "load", count: int = 1) -> list[list[Any]]:
    """``count`` chained remote-memory loads or stores of ``tensor_size`` bytes per rank."""
    node_type = {"load": NodeType.MEM_LOAD_NODE, "store": NodeType.MEM_STORE_NODE}[kind]
    traces = []
    for _rank in range(npus):
        traces.append([make_node(k, f"mem_{kind}_{k}", node_type, data_deps=[k - 1] if k else [],
                                 attrs=[("is_cpu_op", False), ("tensor_size", tensor_size)])
                       for k in range(count)])
    return traces


def write_rank_traces(prefix: str, traces: list[list[Any]]) -> list[str]:
    """Write ``<prefix>.<rank>.et`` for every rank; returns the paths."""
    directory = os.path.dirname(prefix)
    if directory:
        os.makedirs(directory, exist_ok=True)
    paths = []
    for rank, nodes in enumerate(traces):
        path = f"{prefix}.{rank}.et"
        write_trace(path, nodes, version=GENERATED_VERSION)
        paths.append(path)
    return paths


GENERATOR_KEYS = {
    "collective": ("type", "size", "repeat", "pg_name"),
    "compute": ("count", "duration_us", "num_ops", "tensor_size", "independent"),
    "sendrecv": ("size", "iterations"),
    "memory": ("tensor_size", "access", "count"),
}


def from_spec(spec: dict[str, Any], npus: int, where: str = "workload") -> list[list[Any]]:
    """The traces a generator mapping describes, e.g. ``{generate: collective, type: all_reduce, size: 64MiB}``.

    Keys are those of ``astrasim-py trace generate KIND`` (with ``_`` for ``-``); sizes may carry units.
    Bad specs raise InputError naming ``where``.
    """
    kind = spec.get("generate")
    if kind not in GENERATOR_KEYS:
        raise InputError(f"{where}: 'generate' must be one of {', '.join(GENERATOR_KEYS)} (got {kind!r})")
    unknown = sorted(set(spec) - {"generate", *GENERATOR_KEYS[kind]})
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)} for a generated {kind} workload; "
                         f"valid: {', '.join(GENERATOR_KEYS[kind])}")

    def size(key: str, default: Any = None) -> int:
        value = spec.get(key, default)
        if value is None:
            raise InputError(f"{where}: a generated {kind} workload needs '{key}'")
        try:
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
                else parse_size(str(value))
        except ValueError as e:
            raise InputError(f"{where}: '{key}': {e}") from None

    def count(key: str, default: int) -> int:
        value = spec.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{where}: '{key}' must be a whole number >= 0 (got {value!r})")
        return value

    if kind == "collective":
        ctype = spec.get("type")
        if ctype not in COLLECTIVE_NAMES:
            raise InputError(f"{where}: collective 'type' must be one of {', '.join(COLLECTIVE_NAMES)} "
                             f"(got {ctype!r})")
        return collective(npus, COLLECTIVE_NAMES[ctype], size("size"), repeat=max(1, count("repeat", 1)),
                          pg_name=spec.get("pg_name"))
    if kind == "compute":
        return compute(npus, count("count", 1), duration_micros=count("duration_us", 0),
                       num_ops=count("num_ops", 0), tensor_size=size("tensor_size", 0),
                       independent=bool(spec.get("independent", False)))
    if kind == "sendrecv":
        if npus < 2:
            raise InputError(f"{where}: a send/recv ring needs at least 2 NPUs")
        return sendrecv_ring(npus, size("size"), iterations=max(1, count("iterations", 1)))
    access = spec.get("access", "load")
    if access not in ("load", "store"):
        raise InputError(f"{where}: 'access' must be load or store (got {access!r})")
    return memory(npus, size("tensor_size"), kind=access, count=max(1, count("count", 1)))


def spec_label(spec: dict[str, Any]) -> str:
    """A short, file-name-safe label of a generator mapping (e.g. ``collective-all_reduce-64MiB``)."""
    parts = [str(spec.get("generate"))] + [str(spec[k]) for k in GENERATOR_KEYS.get(spec.get("generate"), ())
                                           if k in spec]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))[:120]
