"""Learn a Profile from per-rank traces: abstract every rank, lay the ranks out on a grid, group identically
shaped ranks into classes, and store values as obfuscated bins."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from workload.errors import TraceError
from workload.graph import TraceGraph
from workload.groups import metadata_groups, missing_groups_hint
from workload.schema import NodeType
from workload.synthesis import layout as lay
from workload.synthesis.profile import BIN_KINDS, Profile, RankClass, Token
from workload.synthesis.stats import summarize
from workload.synthesis.values import ABSENT, Bin, obfuscate, quantize
from workload.validate import validate

Members = tuple[int, ...] | None  # a communicator group, None for the all-NPU default
MEDIAN_SAMPLE = 16  # member ranks whose per-node median stands for a class's compute values
_COMM = {NodeType.COMM_COLL_NODE: "coll", NodeType.COMM_SEND_NODE: "send", NodeType.COMM_RECV_NODE: "recv"}
_OTHER = {NodeType.MEM_LOAD_NODE: "load", NodeType.MEM_STORE_NODE: "store", NodeType.METADATA_NODE: "meta",
          NodeType.INVALID_NODE: "invalid"}


@dataclass(slots=True)
class _Part:
    """What one trace file contributes, independent of the rank running it."""

    path: str
    kinds: list[str]
    deps: list[tuple[int, ...]]
    ctrl: list[tuple[int, ...]]
    values: list[tuple[int, ...]]
    comm_type: list[int]
    involved: list[tuple[bool, ...] | None]
    priority: list[int | None]
    node_ids: list[int]  # for error messages only; never stored
    pg_names: dict[int, str]  # position -> pg_name of a collective
    p2p: dict[int, tuple[int, int, int]]  # position -> (comm_src, comm_dst, comm_tag), -1 when absent
    declared: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(slots=True)
class _Rank:
    part: _Part
    groups: dict[int, Members]  # position of a collective -> its group
    shifts: dict[int, tuple[int, int]] = field(default_factory=dict)  # position of a send/recv -> (dim, shift)


def learn(graphs: Sequence[TraceGraph], comm_groups: Mapping[int, Sequence[int]] | None = None, *,
          digits: int = 3, noise: float = 0.0, seed: int = 0, bins_per_octave: int = 4,
          warn: Callable[[str], None] | None = None) -> Profile:
    """The profile of one trace per rank (the same graph object may serve several ranks)."""
    warn = warn or (lambda message: None)
    num_ranks = len(graphs)
    parts: dict[int, _Part] = {}
    ranks = []
    for r, graph in enumerate(graphs):
        part = parts.get(id(graph))
        if part is None:
            part = parts[id(graph)] = _abstract(graph)
        ranks.append(_Rank(part, _resolve_groups(r, part, comm_groups or {}, num_ranks)))
    pairs = _match_messages(ranks)
    layout_dims, families, family_of = _grid(num_ranks, ranks, pairs)
    for (r, i), (d, j) in pairs.items():
        dim, shift = lay.shift_between(layout_dims, r, d) or (0, 0)
        ranks[r].shifts[i] = (dim, shift)
        ranks[d].shifts[j] = (dim, -shift)
    _check_collective_sequences(ranks, warn)

    signatures = [_signature(rk, family_of) for rk in ranks]
    rank_class = _classes(signatures)
    messages = _message_ids(pairs, rank_class)
    if messages is None:  # peers of alike ranks are not alike: give every rank its own class
        rank_class = list(range(num_ranks))
        messages = _message_ids(pairs, rank_class)
        assert messages is not None
    class_dims, class_of = lay.class_dims(layout_dims, rank_class)
    layout = lay.Layout(layout_dims, class_dims, class_of, families, explicit=any(f.groups for f in families))

    rng = np.random.default_rng([seed, 0x5EED])
    bins: list[Bin] = []
    bin_of: dict[tuple[object, ...], int] = {}
    tokens: list[Token] = []
    token_of: dict[Token, int] = {}
    send_ids, recv_ids = messages
    classes = []
    members_of: dict[int, list[int]] = {}
    for r, c in enumerate(rank_class):
        members_of.setdefault(c, []).append(r)
    for c in range(len(members_of)):
        members = members_of[c]
        rk = ranks[members[0]]
        part = rk.part
        values = _representative_values([ranks[m].part for m in members[:MEDIAN_SAMPLE]])
        sequence, msgs = [], []
        for i, kind in enumerate(part.kinds):
            bkey = (*_bin_key(kind, values[i], bins_per_octave), part.comm_type[i])
            b = bin_of.get(bkey)
            if b is None:
                b = bin_of[bkey] = len(bins)
                bins.append(Bin(BIN_KINDS[kind]))
            if kind != "recv":  # a message's size counts once, with its send
                bins[b].add(obfuscate(values[i], digits, noise, rng))
            comm: tuple[int, ...] = ()
            if kind == "coll":
                comm = (part.comm_type[i], family_of[rk.groups[i]])
            elif kind in ("send", "recv"):
                comm = rk.shifts[i]
                msgs.append(send_ids[(c, i)] if kind == "send" else recv_ids[(c, i)])
            elif kind == "host_coll":
                comm = (part.comm_type[i],)
            token = Token(kind, b, part.deps[i], part.ctrl[i], comm, part.involved[i], part.priority[i])
            t = token_of.get(token)
            if t is None:
                t = token_of[token] = len(tokens)
                tokens.append(token)
            sequence.append(t)
        classes.append(RankClass(len(members), sequence, msgs))
    for b in bins:
        b.sort()
    privacy = {"significant_digits": digits, "noise": noise, "bins_per_octave": bins_per_octave}
    summary = summarize(graphs, [members_of[c][0] for c in range(len(classes))], digits)
    return Profile(layout, tokens, classes, bins, len(send_ids), privacy, summary)


def _abstract(graph: TraceGraph) -> _Part:
    n = graph.num_nodes
    validate(graph)
    attrs = graph.attrs
    types = graph.types.astype(np.int64).tolist()
    is_cpu = (attrs.integers("is_cpu_op", n)[0] != 0).tolist()
    declared: dict[int, tuple[int, ...]] = {}
    keep = np.ones(n, dtype=bool)
    for i in np.flatnonzero(graph.types == NodeType.METADATA_NODE).tolist():
        groups = metadata_groups(graph, i)
        if groups is not None:
            keep[i] = False
            for name, members in groups:
                try:
                    declared[int(name)] = tuple(members)
                except ValueError:
                    continue
    index = np.flatnonzero(keep)
    position = np.full(n + 1, -1, dtype=np.int64)
    position[index] = np.arange(index.size)

    def offsets(ptr: np.ndarray, ids: np.ndarray) -> list[tuple[int, ...]]:
        where = np.searchsorted(graph.ids, ids)
        found = where < n
        found[found] = graph.ids[where[found]] == ids[found]
        parent = np.where(found, position[np.minimum(where, n)], -1)
        out = []
        for i in index.tolist():
            own = int(position[i])
            ps = {int(p) - own for p in parent[ptr[i] : ptr[i + 1]].tolist() if p >= 0 and p != own}
            out.append(tuple(sorted(ps)))
        return out

    ints = {name: attrs.integers(name, n) for name in ("num_ops", "tensor_size", "comm_size", "comm_type",
                                                       "comm_src", "comm_dst", "comm_tag", "comm_priority")}
    pg_names = attrs.strings("pg_name")
    involved = attrs.bool_lists("involved_dim")
    duration = graph.duration_micros.astype(np.int64).tolist()

    def value(name: str, i: int) -> int:
        v, present = ints[name]
        return int(v[i]) if present[i] else ABSENT

    part = _Part(graph.path, [], offsets(graph.data_ptr, graph.data_deps), offsets(graph.ctrl_ptr, graph.ctrl_deps),
                 [], [], [], [], [], {}, {}, declared)
    for pos, i in enumerate(index.tolist()):
        t = types[i]
        if t == NodeType.COMP_NODE:
            kind = "cpu" if is_cpu[i] else "comp"
            vals: tuple[int, ...] = (duration[i], value("num_ops", i), value("tensor_size", i))
        elif t in _COMM:
            kind = ("host_" if is_cpu[i] else "") + _COMM[NodeType(t)]
            vals = (value("comm_size", i), duration[i])
        elif t in (NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE):
            kind, vals = _OTHER[NodeType(t)], (value("tensor_size", i), duration[i])
        else:
            kind, vals = _OTHER[NodeType(t)], (duration[i],)
        part.kinds.append(kind)
        part.values.append(vals)
        part.comm_type.append(value("comm_type", i) if kind in ("coll", "host_coll") else ABSENT)
        part.involved.append(tuple(involved[i]) if kind == "coll" and i in involved else None)
        part.priority.append(value("comm_priority", i) if kind == "coll" and ints["comm_priority"][1][i] else None)
        part.node_ids.append(graph.node_id(i))
        if kind == "coll":
            part.pg_names[pos] = pg_names.get(i, "")
        elif kind in ("send", "recv"):
            part.p2p[pos] = (value("comm_src", i), value("comm_dst", i), value("comm_tag", i))
    return part


def _resolve_groups(rank: int, part: _Part, comm_groups: Mapping[int, Sequence[int]],
                    num_ranks: int) -> dict[int, Members]:
    table = {int(k): tuple(v) for k, v in comm_groups.items()}
    table.update(part.declared)
    out: dict[int, Members] = {}
    for pos, name in part.pg_names.items():
        if name in ("", "0"):
            out[pos] = None
            continue
        error = None
        try:
            members = table.get(int(name))
        except ValueError:
            members, error = None, f"pg_name {name!r} is not a communicator group number"
        if members is not None and not members:
            members = tuple(range(num_ranks))
        if members is None:
            raise TraceError(error or f"communicator group {name} is not defined", path=part.path, rank=rank,
                             node_id=part.node_ids[pos],
                             hint=missing_groups_hint(part.path))
        if rank not in members or any(not 0 <= m < num_ranks for m in members):
            raise TraceError(f"communicator group {name} ({list(members)[:16]}) does not fit rank {rank} of "
                             f"{num_ranks} ranks", path=part.path, rank=rank, node_id=part.node_ids[pos])
        out[pos] = tuple(sorted(set(members)))
    return out


def _match_messages(ranks: list[_Rank]) -> dict[tuple[int, int], tuple[int, int]]:
    """{(sender rank, send position): (receiver rank, receive position)}, matched on (src, dst, tag, size) in order."""
    recvs: dict[tuple[int, int, int, int], deque[tuple[int, int]]] = {}
    for d, rk in enumerate(ranks):
        for pos, (src, _dst, tag) in rk.part.p2p.items():
            if rk.part.kinds[pos] == "recv":
                recvs.setdefault((src, d, tag, rk.part.values[pos][0]), deque()).append((d, pos))
    pairs = {}
    for r, rk in enumerate(ranks):
        for pos, (_src, dst, tag) in rk.part.p2p.items():
            if rk.part.kinds[pos] != "send":
                continue
            size = rk.part.values[pos][0]
            queue = recvs.get((r, dst, tag, size))
            if not queue:
                raise TraceError(f"send to rank {dst} (tag {tag}, {size} bytes) has no matching receive in rank "
                                 f"{dst}'s trace", path=rk.part.path, rank=r, node_id=rk.part.node_ids[pos],
                                 hint="sends and receives match on source, destination, tag and size")
            pairs[(r, pos)] = queue.popleft()
    for (src, d, tag, size), queue in recvs.items():
        if queue:
            rk = ranks[d]
            raise TraceError(f"receive from rank {src} (tag {tag}, {size} bytes) has no matching send in rank "
                             f"{src}'s trace", path=rk.part.path, rank=d, node_id=rk.part.node_ids[queue[0][1]])
    return pairs


def _grid(num_ranks: int, ranks: list[_Rank], pairs: Mapping[tuple[int, int], tuple[int, int]]
          ) -> tuple[tuple[int, ...], tuple[lay.Family, ...], dict[Members, int]]:
    """Grid sizes, group families and the family of every group (explicit groups when no grid fits)."""
    used = sorted({g for rk in ranks for g in rk.groups.values() if g is not None})
    has_default = any(g is None for rk in ranks for g in rk.groups.values())
    deltas = [d - r for (r, _), (d, _) in pairs.items()]
    dims = lay.infer_dims(num_ranks, used, deltas)
    found = [lay.family_of_group(dims, g) for g in used]
    if any(f is None for f in found) or \
            any(lay.shift_between(dims, r, d) is None for (r, _), (d, _) in pairs.items()):
        dims, keys = (num_ranks,), [lay.Family(groups=(g,)) for g in used]
    else:
        keys = [f for f in found if f is not None]
    families: list[lay.Family] = [lay.Family(default=True)] if has_default else []
    index: dict[lay.Family, int] = {}
    for key in sorted(set(keys), key=repr):
        index[key] = len(families)
        families.append(key)
    family_of: dict[Members, int] = {g: index[k] for g, k in zip(used, keys, strict=True)}
    if has_default:
        family_of[None] = 0
    return dims, tuple(families), family_of


def _check_collective_sequences(ranks: list[_Rank], warn: Callable[[str], None]) -> None:
    by_group: dict[Members, dict[int, list[tuple[int, int]]]] = {}
    for r, rk in enumerate(ranks):
        for pos, g in sorted(rk.groups.items()):
            by_group.setdefault(g, {}).setdefault(r, []).append((rk.part.comm_type[pos], rk.part.values[pos][0]))
    for g, seqs in by_group.items():
        members = g if g is not None else tuple(range(len(ranks)))
        first = seqs.get(members[0], [])
        odd = [m for m in members if seqs.get(m, []) != first]
        if odd:
            warn(f"ranks {list(members)[:8]} share a communicator group but issue different collectives on it "
                 f"(rank {odd[0]} differs from rank {members[0]}); the synthetic traces will differ the same way")


def _signature(rk: _Rank, family_of: Mapping[Members, int]) -> bytes:
    """What must be equal for two ranks to share a class: everything synthesis keeps except compute values."""
    p = rk.part
    rows = []
    for i, kind in enumerate(p.kinds):
        comm: object = None
        if kind == "coll":
            comm = (p.comm_type[i], family_of[rk.groups[i]], p.values[i][0], p.involved[i], p.priority[i])
        elif kind in ("send", "recv"):
            comm = (rk.shifts[i], p.values[i][0])
        elif kind in ("load", "store", "host_coll"):
            comm = (p.values[i][0], p.comm_type[i])
        rows.append((kind, p.deps[i], p.ctrl[i], comm))
    return hashlib.blake2b(repr(rows).encode(), digest_size=16).digest()


def _classes(signatures: Sequence[bytes]) -> list[int]:
    index: dict[bytes, int] = {}
    return [index.setdefault(s, len(index)) for s in signatures]


def _message_ids(pairs: Mapping[tuple[int, int], tuple[int, int]], rank_class: Sequence[int]
                 ) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]] | None:
    """Message numbers of (class, send position) and (class, receive position), or None when ranks of one class
    send the same node to receivers that do not agree on the receiving class and position."""
    receiver: dict[tuple[int, int], tuple[int, int]] = {}
    sender: dict[tuple[int, int], tuple[int, int]] = {}
    for (r, i), (d, j) in pairs.items():
        s, t = (rank_class[r], i), (rank_class[d], j)
        if receiver.setdefault(s, t) != t or sender.setdefault(t, s) != s:
            return None
    send_ids = {s: k for k, s in enumerate(sorted(receiver))}
    return send_ids, {t: send_ids[s] for t, s in sender.items()}


def _representative_values(parts: Sequence[_Part]) -> list[tuple[int, ...]]:
    """Per node, the median over the member ranks of each value (the values themselves for a single file)."""
    distinct = list({id(p): p for p in parts}.values())
    if len(distinct) == 1:
        return distinct[0].values
    out = []
    for i, first in enumerate(distinct[0].values):
        stacked = np.array([p.values[i] for p in distinct], dtype=np.float64)
        med = np.median(stacked, axis=0)
        out.append(tuple(round(v) if f >= 0 else f for v, f in zip(med.tolist(), first, strict=True)))
    return out


def _bin_key(kind: str, values: tuple[int, ...], bins_per_octave: int) -> tuple[object, ...]:
    group = BIN_KINDS[kind]
    if group in ("coll", "p2p"):  # by size (and collective type): all ranks of a group, both ends of a message, agree
        return group, len(values), quantize(values[0], bins_per_octave)
    return (group, len(values), *(quantize(v, bins_per_octave) for v in values))
