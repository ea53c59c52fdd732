"""``astrasim-py trace generate``: microbenchmark traces, one ``<name>.<rank>.et`` file per rank.

Every generator returns a RankTraces: per rank, the list of Node messages, built when that rank is asked for
(so memory holds one rank at a time); ``write_rank_traces`` writes them, and ``estimated_bytes`` sizes them
before anything is built.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from workload.errors import InputError, printable, shown
from workload.limits import INT64_MAX, parse_size
from workload.schema import CollectiveType, NodeType
from workload.wire import encode_varint
from workload.writer import TraceWriter, make_metadata, make_node, serialize

GENERATED_VERSION = "1.0.0"
COLLECTIVE_NAMES = {
    "all_reduce": CollectiveType.ALL_REDUCE,
    "all_gather": CollectiveType.ALL_GATHER,
    "reduce_scatter": CollectiveType.REDUCE_SCATTER,
    "all_to_all": CollectiveType.ALL_TO_ALL,
    "broadcast": CollectiveType.BROADCAST,
}
MAX_DURATION_MICROS = INT64_MAX // 1000  # longer would overflow the simulator's nanosecond clock


def size_label(size_bytes: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= factor and size_bytes % factor == 0:
            return f"{size_bytes // factor}{unit}"
    return f"{size_bytes}B"


class RankTraces(Sequence[list[Any]]):
    """The node lists of ``npus`` ranks, ``nodes_per_rank`` each, node ``k`` of rank ``r`` being
    ``node(r, k)``. A rank's list is built (and kept, so a caller may change it) when it is asked for; the writer
    streams the ranks nobody asked for node by node, and when ``same_on_every_rank`` copies the first file."""

    def __init__(self, npus: int, nodes_per_rank: int, node: Callable[[int, int], Any],
                 same_on_every_rank: bool = False) -> None:
        self.npus = npus
        self.nodes_per_rank = nodes_per_rank
        self.node = node
        self.same_on_every_rank = same_on_every_rank
        self.built: dict[int, list[Any]] = {}

    def __len__(self) -> int:
        return self.npus

    def __getitem__(self, rank: Any) -> Any:
        if isinstance(rank, slice):
            return [self[r] for r in range(*rank.indices(self.npus))]
        rank = range(self.npus)[rank]
        nodes = self.built.get(rank)
        if nodes is None:
            nodes = self.built[rank] = [self.node(rank, k) for k in range(self.nodes_per_rank)]
        return nodes

    def __setitem__(self, rank: int, nodes: Sequence[Any]) -> None:
        """Replace a rank's nodes (kept like a built rank, and written as given)."""
        self.built[range(self.npus)[rank]] = list(nodes)

    def __iter__(self) -> Iterator[list[Any]]:
        return (self[r] for r in range(self.npus))

    def stream(self, rank: int) -> Iterator[Any]:
        """The nodes of ``rank`` one at a time (its list, if it was built), never all held at once."""
        built = self.built.get(rank)
        return iter(built) if built is not None else (self.node(rank, k) for k in range(self.nodes_per_rank))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(
            a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def estimated_bytes(self) -> int:
        """The bytes all files will take, from the size of one node (the last, whose ids are the largest)."""
        header = len(serialize(make_metadata(GENERATED_VERSION))) + 1
        if not self.npus or not self.nodes_per_rank:
            return self.npus * header
        sample = len(serialize(self.node(self.npus - 1, self.nodes_per_rank - 1)))
        return self.npus * (header + self.nodes_per_rank * (sample + len(encode_varint(sample))))


class RankLists(Sequence[list[Any]]):
    """Per-rank node lists, each built by ``build(rank)`` when asked for and not kept: written rank by rank,
    they never occupy memory all at once."""

    def __init__(self, npus: int, build: Callable[[int], list[Any]]) -> None:
        self.npus = npus
        self.build = build

    def __len__(self) -> int:
        return self.npus

    def __getitem__(self, rank: Any) -> Any:
        if isinstance(rank, slice):
            return [self[r] for r in range(*rank.indices(self.npus))]
        return self.build(range(self.npus)[rank])


def collective(npus: int, comm_type: CollectiveType, size_bytes: int, *, repeat: int = 1,
               pg_name: str | None = None, involved_dim: Sequence[bool] | None = None,
               duration_micros: int = 0) -> RankTraces:
    """Each rank issues ``repeat`` collectives in a chain (``duration_micros`` only matters for broadcast)."""
    attrs: list[tuple[str, Any]] = [("is_cpu_op", False), ("comm_type", int(comm_type)), ("comm_size", size_bytes)]
    if pg_name is not None:
        attrs.append(("pg_name", pg_name))
    if involved_dim is not None:
        attrs.append(("involved_dim", list(involved_dim)))

    def node(_rank: int, k: int) -> Any:
        return make_node(k, f"{comm_type.name.lower()}_{size_label(size_bytes)}_{k}", NodeType.COMM_COLL_NODE,
                         data_deps=[k - 1] if k else [], duration_micros=duration_micros, attrs=attrs)

    return RankTraces(npus, repeat, node, same_on_every_rank=True)


def compute(npus: int, count: int, *, duration_micros: int = 0, num_ops: int = 0, tensor_size: int = 0,
            independent: bool = False) -> RankTraces:
    """``count`` compute nodes per rank, chained unless ``independent``; timed by duration or by roofline."""
    attrs: list[tuple[str, Any]] = [("is_cpu_op", False)]
    if num_ops or tensor_size:
        attrs += [("num_ops", num_ops), ("tensor_size", tensor_size)]

    def node(_rank: int, k: int) -> Any:
        deps = [k - 1] if k and not independent else []
        return make_node(k, f"compute_{k}", NodeType.COMP_NODE, data_deps=deps, duration_micros=duration_micros,
                         attrs=attrs)

    return RankTraces(npus, count, node, same_on_every_rank=True)


def sendrecv_ring(npus: int, size_bytes: int, *, iterations: int = 1, tag_base: int = 0) -> RankTraces:
    """Each rank sends to rank+1 and receives from rank-1 (mod npus), ``iterations`` times in sequence.

    The send and receive of one iteration are independent; the next iteration waits for both. Tags are
    ``tag_base + iteration`` so that the pairs match.
    """
    if npus < 2:
        raise ValueError("a send/recv ring needs at least 2 NPUs")

    def node(rank: int, k: int) -> Any:
        iteration, send = k // 2, k % 2 == 0
        prev = [2 * iteration - 2, 2 * iteration - 1] if iteration else []
        src, dst = (rank, (rank + 1) % npus) if send else ((rank - 1) % npus, rank)
        return make_node(k, f"{'send' if send else 'recv'}_{iteration}",
                         NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE, data_deps=prev, attrs=[
                             ("is_cpu_op", False), ("comm_src", src), ("comm_dst", dst), ("comm_size", size_bytes),
                             ("comm_tag", tag_base + iteration)])

    return RankTraces(npus, 2 * iterations, node)


def memory(npus: int, tensor_size: int, *, kind: str = "load", count: int = 1) -> RankTraces:
    """``count`` chained remote-memory loads or stores of ``tensor_size`` bytes per rank."""
    node_type = {"load": NodeType.MEM_LOAD_NODE, "store": NodeType.MEM_STORE_NODE}[kind]

    def node(_rank: int, k: int) -> Any:
        return make_node(k, f"mem_{kind}_{k}", node_type, data_deps=[k - 1] if k else [],
                         attrs=[("is_cpu_op", False), ("tensor_size", tensor_size)])

    return RankTraces(npus, count, node, same_on_every_rank=True)


def write_rank_traces(prefix: str, traces: Sequence[Sequence[Any]]) -> list[str]:
    """Write ``<prefix>.<rank>.et`` for every rank, one rank at a time; returns the paths."""
    directory = os.path.dirname(prefix)
    if directory:
        os.makedirs(directory, exist_ok=True)
    paths = []
    lazy = traces if isinstance(traces, RankTraces) else None
    copy_first = lazy is not None and lazy.same_on_every_rank and not lazy.built
    for rank in range(len(traces)):
        path = f"{prefix}.{rank}.et"
        if copy_first and rank:
            shutil.copyfile(paths[0], path)
        else:
            with TraceWriter(path, GENERATED_VERSION) as w:
                w.add_many(lazy.stream(rank) if lazy is not None else traces[rank])
        paths.append(path)
    return paths


GENERATOR_KEYS = {
    "collective": ("type", "size", "repeat", "pg_name"),
    "compute": ("count", "duration_us", "num_ops", "tensor_size", "independent"),
    "sendrecv": ("size", "iterations"),
    "memory": ("tensor_size", "access", "count"),
}


MAX_NODES_PER_RANK = 100_000_000  # a microbenchmark rank beyond this is a typo (its file would pass 2 GiB)
# parameter -> (least, greatest) whole value, for the command line and generator mappings alike
LIMITS = {"repeat": (1, MAX_NODES_PER_RANK), "count": (1, MAX_NODES_PER_RANK),
          "iterations": (1, MAX_NODES_PER_RANK // 2), "duration_us": (0, MAX_DURATION_MICROS),
          "num_ops": (0, INT64_MAX)}


def from_spec(spec: dict[str, Any], npus: int, where: str = "workload") -> RankTraces:
    """The traces a generator mapping describes, e.g. ``{generate: collective, type: all_reduce, size: 64MiB}``.

    Keys are those of ``astrasim-py trace generate KIND`` (with ``_`` for ``-``); sizes may carry units.
    Bad specs raise InputError naming ``where``.
    """
    kind = spec.get("generate")
    if kind not in GENERATOR_KEYS:
        raise InputError(f"{where}: 'generate' must be one of {', '.join(GENERATOR_KEYS)} (got {shown(kind)})")
    unknown = sorted(set(spec) - {"generate", *GENERATOR_KEYS[kind]})
    if unknown:
        names = ", ".join(printable(str(k))[:40] for k in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
        raise InputError(f"{where}: unknown key(s) {names} for a generated {kind} workload; valid: "
                         f"{', '.join(GENERATOR_KEYS[kind])}")

    def size(key: str, default: Any = None) -> int:
        value = spec.get(key, default)
        if value is None:
            raise InputError(f"{where}: a generated {kind} workload needs '{key}'")
        try:
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX:
                return value
            return parse_size(str(value))
        except ValueError as e:
            raise InputError(f"{where}: '{key}': {e}") from None

    def count(key: str, default: int) -> int:
        value = spec.get(key, default)
        low, high = LIMITS[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InputError(f"{where}: '{key}' must be a whole number from {low} to {high:,} (got {shown(value)})")
        return value

    if kind == "collective":
        ctype = spec.get("type")
        if ctype not in COLLECTIVE_NAMES:
            raise InputError(f"{where}: collective 'type' must be one of {', '.join(COLLECTIVE_NAMES)} "
                             f"(got {shown(ctype)})")
        pg_name = spec.get("pg_name")
        if (pg_name is not None and not isinstance(pg_name, (str, int))) or isinstance(pg_name, bool):
            raise InputError(f"{where}: 'pg_name' must be a communicator group name (got {shown(pg_name)})")
        return collective(npus, COLLECTIVE_NAMES[ctype], size("size"), repeat=count("repeat", 1),
                          pg_name=None if pg_name is None else str(pg_name))
    if kind == "compute":
        return compute(npus, count("count", 1), duration_micros=count("duration_us", 0),
                       num_ops=count("num_ops", 0), tensor_size=size("tensor_size", 0),
                       independent=bool(spec.get("independent", False)))
    if kind == "sendrecv":
        if npus < 2:
            raise InputError(f"{where}: a send/recv ring needs at least 2 NPUs")
        return sendrecv_ring(npus, size("size"), iterations=count("iterations", 1))
    access = spec.get("access", "load")
    if access not in ("load", "store"):
        raise InputError(f"{where}: 'access' must be load or store (got {shown(access)})")
    return memory(npus, size("tensor_size"), kind=access, count=count("count", 1))


def spec_label(spec: dict[str, Any]) -> str:
    """A short, file-name-safe label of a generator mapping (e.g. ``collective-all_reduce-64MiB``)."""
    parts = [str(spec.get("generate"))] + [str(spec[k]) for k in GENERATOR_KEYS.get(spec.get("generate"), ())
                                           if k in spec]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))[:120]
