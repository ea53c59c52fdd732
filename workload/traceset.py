"""Find and load the per-rank traces a ``--workload`` argument names.

Accepted forms: an ASTRA-sim prefix (``dir/trace`` -> ``dir/trace.<r>.et``), the same written as
``dir/trace.et`` when per-rank siblings exist, a folder holding ``<name>.<r>.et`` files, or one single
file that every rank runs. Files may be gzip-compressed and may also be named ``.et.gz``.
"""

from __future__ import annotations

import os
import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workload.errors import InputError, LimitError, TraceError, shown
from workload.files import shown_path
from workload.graph import TraceGraph
from workload.legacy import apply_era_reading, is_pre_1_0
from workload.limits import env_limit, format_bytes
from workload.protoscan import PADDING
from workload.reader import decode_trace
from workload.validate import validate
from workload.variants import Variants
from workload.wire import read_trace_buffer

# ".eg": the per-rank files of Chakra's first schema (ASTRA-sim 2.0's early examples)
_RANK_FILE = re.compile(r"^(?P<name>.+)\.(?P<rank>[0-9]+)\.(?P<ext>et|eg)(?P<gz>\.gz)?$")
DEFAULT_MAX_RANKS = 1 << 20  # far beyond any simulated system; a mistyped count is refused before loading
MAX_RANKS_ENV = "ASTRASIM_PY_MAX_RANKS"
_MIN_RANK_STATE_BYTES = 1024  # what a simulated rank holds besides its nodes (queues, counters, results)
_NODE_STATE_BYTES = 24  # per node and rank: dependency counters and issue heaps


@dataclass(frozen=True, slots=True)
class TraceSet:
    """The trace files of a workload: one per rank, or a single file shared by every rank.

    A generated workload (workload/generated.py) has ``contents``: a rank's file bytes, built on demand; its
    ``files`` then only name the ranks in messages."""

    source: str
    files: tuple[str, ...]
    shared: bool
    contents: Callable[[int], bytes] | None = field(default=None, compare=False)
    # a generated workload's description of each rank without its trace: (key, values) as in
    # simulator/references.py's rank_references, so that only one trace per class of equal ranks is built
    structure: Callable[[int], tuple[bytes, tuple[Any, ...]]] | None = field(default=None, compare=False)

    @property
    def num_ranks(self) -> int | None:
        """How many ranks the files define (None for a shared single file, which fits any count)."""
        return None if self.shared else len(self.files)

    def file_for(self, rank: int) -> str:
        return self.files[0] if self.shared else self.files[rank]

    def describe(self) -> str:
        if self.shared:
            return f"{self.files[0]} (one file, run by every rank)"
        if len(self.files) == 1:
            return f"{self.files[0]} (1 rank)"
        return f"{self.files[0]} ... {self.files[-1]} ({len(self.files)} ranks)"

    def check_ranks(self, num_npus: int) -> None:
        """Raise InputError unless there is one trace per NPU (a shared file fits any count)."""
        if not self.shared and len(self.files) != num_npus:
            raise InputError(
                f"workload {self.source} has {len(self.files)} per-rank traces but the network has "
                f"{num_npus} NPUs: they must match (one trace per NPU)")


def _rank_files(directory: str, name: str | None) -> dict[str, dict[int, str]]:
    """{trace name: {rank: path}} for the ``<name>.<rank>.et[.gz]`` (or ``.eg``) files of a directory."""
    found: dict[str, dict[int, str]] = {}
    preference: dict[tuple[str, int], tuple[bool, bool]] = {}
    try:
        entries = sorted(os.listdir(directory or "."))
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return found
    for entry in entries:
        m = _RANK_FILE.match(entry)
        if m is None or (name is not None and m["name"] != name):
            continue
        rank = int(m["rank"])
        rank_of = (m["name"], rank)
        rank_preference = (m["ext"] == "eg", bool(m["gz"]))  # when several forms exist: .et before .eg, plain first
        if rank_of not in preference or rank_preference < preference[rank_of]:
            preference[rank_of] = rank_preference
            found.setdefault(m["name"], {})[rank] = os.path.join(directory, entry)
    return found


def _per_rank(source: str, prefix_name: str, ranks: dict[int, str]) -> TraceSet:
    count = max(ranks) + 1
    if len(ranks) != count:  # name the first gaps without walking a range as long as the largest rank number
        missing: list[int] = []
        expected = 0
        for r in sorted(ranks):
            missing.extend(range(expected, min(r, expected + 11 - len(missing))))
            if len(missing) > 10:
                break
            expected = r + 1
        listed = ", ".join(str(r) for r in missing[:10]) + (" ..." if count - len(ranks) > 10 else "")
        raise InputError(f"workload {shown_path(source)}: trace files for rank(s) {listed} are missing (found "
                         f"{len(ranks):,} of {shown_path(prefix_name)}.0.et ... {count - 1}.et)")
    return TraceSet(source, tuple(ranks[r] for r in range(count)), shared=False)


def resolve_workload(workload: str) -> TraceSet:
    """Turn a ``--workload`` argument into its trace files. Raises InputError when nothing matches."""
    source = workload
    if os.path.isdir(workload):
        groups = _rank_files(workload, None)
        if not groups:
            raise InputError(f"workload folder {shown_path(workload)} holds no per-rank trace files "
                             "(<name>.<rank>.et)")
        if len(groups) > 1:
            names = ", ".join(shown(n) for n in sorted(groups)[:10]) + (" ..." if len(groups) > 10 else "")
            raise InputError(f"workload folder {shown_path(workload)} holds several traces ({names}): "
                             f"name one as {shown_path(os.path.join(workload, '<name>'))}")
        (name, ranks), = groups.items()
        return _per_rank(source, os.path.join(workload, name), ranks)

    candidates = [workload]
    for suffix in (".et", ".et.gz"):
        if workload.endswith(suffix):
            candidates.append(workload[: -len(suffix)])
    for prefix in candidates:
        directory, name = os.path.split(prefix)
        ranks = _rank_files(directory, name).get(name)
        if ranks:
            return _per_rank(source, prefix, ranks)
    if os.path.isfile(workload) and workload.endswith((".yml", ".yaml")):
        raise InputError(f"{shown_path(workload)}: a YAML file, not a Chakra trace: a generator mapping (generate: "
                         "...) is built in memory by a simulation (--workload) or a sweep; to look into its traces, "
                         "write them with `astrasim-py trace generate KIND ... -o DIR`")
    if os.path.isfile(workload):
        return TraceSet(source, (workload,), shared=True)
    if os.path.exists(workload):
        raise InputError(f"workload {shown_path(workload)}: not a regular file (a trace must be a file, a "
                         "prefix of per-rank files or a folder of them)")
    raise InputError(f"workload {shown_path(workload)}: no such file, and no per-rank traces "
                     f"{shown_path(workload)}.0.et, .1.et, ...")


class TraceLoader:
    """Loads traces, decoding each distinct file content only once, and (``checks``, the default) validates
    them for simulation; inspection tools load without checks, to show any trace that decodes.

    Identical per-rank files (common for microbenchmarks) share one immutable TraceGraph; a file that differs from
    one decoded before only in values (its own node ids, names, peers, group numbers) is read as its variant
    (workload/variants.py) without being decoded.
    """

    def __init__(self, *, drop_dangling: bool = False, warn: Callable[[str], None] | None = None,
                 checks: bool = True) -> None:
        self.drop_dangling = drop_dangling
        self.checks = checks
        self._warn = warn or (lambda message: None)
        self._by_content: dict[tuple[int, int], list[TraceGraph]] = {}
        self._repeats: dict[str, int] = {}  # a trace warning already given for one file -> how many more had it
        self._variants = Variants()

    def load(self, path: str, rank: int | None = None, contents: Callable[[int], bytes] | None = None) -> TraceGraph:
        """The graph of the trace file ``path`` (or, with ``contents``, of the bytes it gives for ``rank``)."""
        if contents is None:
            data = read_trace_buffer(path, PADDING)
        else:
            data = np.frombuffer(contents(rank or 0) + bytes(PADDING), dtype=np.uint8)
        try:  # the same bytes as a decoded trace but for values: read as its variant (workload/variants.py)
            variant = self._variants.read(data, path, self.checks)
        except TraceError as e:
            raise e.located(path=path, rank=rank) from None
        if variant is not None:
            graph, new = variant
            if not new:
                return graph  # the bytes of a trace read before
        else:
            key = (len(data), zlib.crc32(memoryview(data)))
            for graph in self._by_content.get(key, ()):
                if np.array_equal(graph.buf, data):  # confirm: a checksum match alone is not proof
                    return graph
            graph = self._decode(data, path, rank)
            self._by_content.setdefault(key, []).append(graph)
        deps = validate(graph, drop_dangling=self.drop_dangling) if self.checks else None
        for w in graph.warnings:
            if w in self._repeats:  # per-rank files of one set usually share their warnings: each is given once
                self._repeats[w] += 1
            else:
                self._repeats[w] = 0
                self._warn(f"{path}: {w}")
        if deps is not None and deps.dropped_dangling:
            self._warn(f"{path}: dropped {deps.dropped_dangling} dependencies on {deps.dangling_parents} "
                       "node(s) absent from the file")
        if deps is not None and deps.dropped_self:
            self._warn(f"{path}: dropped {deps.dropped_self} dependencies of nodes on themselves")
        return graph

    def _decode(self, data: np.ndarray, path: str, rank: int | None) -> TraceGraph:
        """Decode (and, with checks, validate) one trace, errors naming file and rank; it becomes a template for
        the files after it."""
        try:
            graph = decode_trace(data, path)
        except TraceError as e:
            raise e.located(path=path, rank=rank) from None
        apply_era_reading(graph)  # a 0.0.4 trace's collectives as the ASTRA-sim of its era read them
        try:
            if self.checks:
                validate(graph, drop_dangling=self.drop_dangling)
        except TraceError as e:
            if is_pre_1_0(graph.version) and "Chakra schema" not in f"{e.problem} {e.hint}":
                e = TraceError(f"{e.problem} (in a trace read as Chakra schema {graph.version})", node_id=e.node_id,
                               offset=e.offset, hint=e.hint)
            raise e.located(path=path, rank=rank) from None
        self._variants.add(graph)
        return graph

    def report_repeats(self) -> None:
        """Say how many more files had the warnings given once (call after loading a set)."""
        repeated = sum(1 for count in self._repeats.values() if count)
        if repeated:
            most = max(self._repeats.values())
            self._warn(f"{'that warning' if repeated == 1 else f'{repeated} of those warnings'} also held for "
                       f"{most} more file(s) of the set, not repeated")
        self._repeats = {w: 0 for w in self._repeats}

    def load_set(self, traces: TraceSet, num_ranks: int, progress: Callable[[str], None] | None = None
                 ) -> list[TraceGraph]:
        """One graph per rank (the same object for ranks with identical files; a shared file is read once).
        ``progress`` gets a line every few seconds while that takes long (a minute for 32 ranks of 40,000 nodes,
        which showed nothing before the run's own progress lines)."""
        traces.check_ranks(num_ranks)
        contents = traces.contents
        first = self.load(traces.file_for(0), 0, contents) if num_ranks else None
        check_rank_count(num_ranks, first.num_nodes if first is not None else 0,
                         f"workload {shown_path(traces.source)}")
        if traces.shared:
            return [first] * num_ranks  # type: ignore[list-item]
        graphs = [first]
        pace = Pace(progress)
        doing = "building" if contents is not None else "reading"
        for r in range(1, num_ranks):
            graphs.append(self.load(traces.file_for(r), r, contents))
            pace.tick(lambda: f"{doing} traces: {len(graphs):,} of {num_ranks:,} ranks")
        self.report_repeats()
        return graphs  # type: ignore[return-value]


PROGRESS_FIRST_S, PROGRESS_EVERY_S = 5.0, 10.0  # as the run's own progress lines


class Pace:
    """Progress lines of a long step: the first after ``first_s`` seconds, then every ``every_s``."""

    def __init__(self, say: Callable[[str], None] | None, first_s: float | None = None,
                 every_s: float | None = None) -> None:
        first_s = PROGRESS_FIRST_S if first_s is None else first_s
        every_s = PROGRESS_EVERY_S if every_s is None else every_s
        self.say = say
        self.started = time.perf_counter()
        self.due = self.started + first_s
        self.every_s = every_s

    def tick(self, line: Callable[[], str]) -> None:
        if self.say is None:
            return
        now = time.perf_counter()
        if now >= self.due:
            self.due = now + self.every_s
            self.say(f"{line()}, {now - self.started:,.0f} s")


def check_rank_count(num_ranks: int, nodes_per_rank: int, what: str) -> None:
    """Refuse, with an estimate of the memory it needs, work over more ranks than the limit; ``what`` names the
    work in the message (e.g. "workload dir/trace")."""
    limit = env_limit(MAX_RANKS_ENV, DEFAULT_MAX_RANKS)
    if num_ranks > limit:
        need = num_ranks * (_MIN_RANK_STATE_BYTES + _NODE_STATE_BYTES * nodes_per_rank)
        raise LimitError(f"{what} on {num_ranks:,} ranks: the per-rank state alone needs at least "
                         f"{format_bytes(need)}; the limit is {limit:,} ranks (set {MAX_RANKS_ENV}=N to raise it)")
