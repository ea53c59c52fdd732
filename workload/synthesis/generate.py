"""Generate per-rank traces from a profile: any rank count, any size, the same bytes for the same seed.

Each rank class's skeleton becomes a template once; every rank of the class instantiates it with its own
communicator groups and peers. ``scale`` = k + f repeats the skeleton k times (as k iterations: each copy
starts when the previous one's last nodes are done) and adds one copy thinned to a share f of its nodes
(a dropped node's children inherit its dependencies). Decisions that several ranks must agree on (keeping a
collective or a message, its size, its tag) depend only on the seed and the event, never on the rank, so every
rank of a group issues the same collectives with the same sizes and every send meets its receive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workload.errors import InputError
from workload.groups import process_groups_node
from workload.schema import CollectiveType, NodeType
from workload.synthesis.layout import Layout
from workload.synthesis.profile import Profile, Token
from workload.synthesis.values import Deck, keyed_uniform
from workload.tools.generate import RankLists
from workload.writer import make_node

_TYPES = {"comp": NodeType.COMP_NODE, "cpu": NodeType.COMP_NODE, "coll": NodeType.COMM_COLL_NODE,
          "send": NodeType.COMM_SEND_NODE, "recv": NodeType.COMM_RECV_NODE, "host_coll": NodeType.COMM_COLL_NODE,
          "host_send": NodeType.COMM_SEND_NODE, "host_recv": NodeType.COMM_RECV_NODE,
          "load": NodeType.MEM_LOAD_NODE, "store": NodeType.MEM_STORE_NODE, "meta": NodeType.METADATA_NODE,
          "invalid": NodeType.INVALID_NODE}
_NAMES = {"comp": "comp", "cpu": "cpu_op", "send": "send", "recv": "recv", "host_send": "host_send",
          "host_recv": "host_recv", "load": "mem_load", "store": "mem_store", "meta": "meta", "invalid": "invalid"}


@dataclass(slots=True)
class _Node:
    token: Token
    values: tuple[int, ...]
    data: list[int]
    ctrl: list[int]
    tag: int = 0


@dataclass(slots=True)
class _Template:
    nodes: list[_Node] = field(default_factory=list)
    families: set[int] = field(default_factory=set)


def generate(profile: Profile, npus: int | None = None, scale: float = 1.0, seed: int = 0) -> RankLists:
    """Node messages per rank for ``npus`` ranks (default: the profile's) at ``scale`` times the nodes per rank;
    each rank's list is built when it is asked for."""
    if not (scale > 0 and math.isfinite(scale)):
        raise InputError(f"--scale must be a positive number (got {scale})")
    npus = profile.layout.num_ranks if npus is None else npus
    if npus < 1:
        raise InputError(f"--npus must be at least 1 (got {npus})")
    layout = profile.layout.resized(npus, growth_order(profile))
    rank_class = [layout.rank_class(r) for r in range(npus)]
    shared = {f for f in range(len(layout.families)) if profile.layout.mixes_classes(f)}
    event_values = _event_values(profile, scale, seed, shared)
    templates = {c: _template(profile, c, scale, seed, shared, event_values) for c in sorted(set(rank_class))}
    gids: dict[tuple[int, tuple[int, ...]], int] = {}
    for f in range(len(layout.families)):
        if layout.families[f].default:
            continue
        for r in range(npus):
            if f in templates[rank_class[r]].families:
                members = layout.group(r, f)
                assert members is not None
                gids.setdefault((f, members), len(gids) + 1)
    return RankLists(npus, lambda r: _instantiate(r, layout, templates[rank_class[r]], gids))


def nodes_per_rank(profile: Profile, scale: float = 1.0) -> int:
    """The most nodes a generated rank can have at ``scale`` (its METADATA node included)."""
    longest = max((len(c.sequence) for c in profile.classes), default=0)
    return math.ceil(longest * scale) + 1


def growth_order(profile: Profile) -> list[int]:
    """Grid dimensions in the order they are grown to add ranks: the ones fewest collectives span first (the
    data-parallel dimension of a typical training trace), outer before inner on ties."""
    dims = profile.layout.dims
    weight = [0] * len(dims)
    for cls in profile.classes:
        for t in cls.sequence:
            tok = profile.tokens[t]
            if tok.kind == "coll":
                fam = profile.layout.families[tok.comm[1]]
                for d in range(len(dims)) if fam.default else fam.dims:
                    weight[d] += cls.ranks
    return sorted(range(len(dims)), key=lambda d: (weight[d], -d))


def _order(tokens: Sequence[Token], c: int) -> list[int]:
    n = len(tokens)
    children: list[list[int]] = [[] for _ in range(n)]
    remaining = [0] * n
    for pos, tok in enumerate(tokens):
        for off in {*tok.deps, *tok.ctrl}:
            children[pos + off].append(pos)
            remaining[pos] += 1
    order = [p for p in range(n) if remaining[p] == 0]
    for p in order:  # the list grows while it is walked
        for ch in children[p]:
            remaining[ch] -= 1
            if remaining[ch] == 0:
                order.append(ch)
    if len(order) != n:
        raise InputError(f"profile class {c}: its dependencies form a cycle")
    return order


def _events(profile: Profile, c: int, shared: set[int]) -> list[tuple[Any, ...]]:
    """Per node of a class, what the ranks involved agree on: ("coll", family, k) for the k-th collective on a
    family whose groups mix classes (``shared``), ("coll", family, k, class) on any other family, ("msg", number)
    for a send or receive, () for a node of this rank alone."""
    cls = profile.classes[c]
    events: list[tuple[Any, ...]] = []
    per_family: dict[int, int] = {}
    messages = iter(cls.messages)
    for t in cls.sequence:
        tok = profile.tokens[t]
        if tok.kind == "coll":
            k = per_family.get(tok.comm[1], 0)
            per_family[tok.comm[1]] = k + 1
            events.append(("coll", tok.comm[1], k) if tok.comm[1] in shared else ("coll", tok.comm[1], k, c))
        elif tok.kind in ("send", "recv"):
            events.append(("msg", next(messages)))
        else:
            events.append(())
    return events


def _copies(scale: float) -> tuple[int, float, int]:
    """(whole copies, share of the thinned copy, copies in all)."""
    full = math.floor(scale)
    share = scale - full
    return full, share, full + (1 if share > 1e-9 else 0)


def _event_values(profile: Profile, scale: float, seed: int, shared: set[int]
                  ) -> dict[tuple[Any, ...], tuple[int, ...]]:
    """The values of every shared event, by (copy, event..., bin). They come from the whole profile, not one
    rank: each bin's multiset is dealt out over its events in a seeded order, so sizes keep their proportions
    and every rank of a group (both ends of a message) looks up the same value."""
    by_bin: dict[int, set[tuple[Any, ...]]] = {}
    for c in range(len(profile.classes)):
        for pos, ev in enumerate(_events(profile, c, shared)):
            if ev:
                by_bin.setdefault(profile.tokens[profile.classes[c].sequence[pos]].bin, set()).add(ev)
    out: dict[tuple[Any, ...], tuple[int, ...]] = {}
    for b, events in sorted(by_bin.items()):
        deck = Deck(profile.bins, np.random.default_rng([seed, 3, b]))
        ordered = sorted(events)
        for copy in range(_copies(scale)[2]):
            for ev in ordered:
                out[(copy, *ev, b)] = deck.draw(b)
    return out


def _template(profile: Profile, c: int, scale: float, seed: int, shared: set[int],
              event_values: dict[tuple[Any, ...], tuple[int, ...]]) -> _Template:
    cls = profile.classes[c]
    tokens = [profile.tokens[t] for t in cls.sequence]
    n = len(tokens)
    order = _order(tokens, c)
    events = _events(profile, c, shared)
    full, share, copies = _copies(scale)
    rng = np.random.default_rng([seed, 1, c])
    deck = Deck(profile.bins, np.random.default_rng([seed, 2, c]))
    out = _Template(families={tok.comm[1] for tok in tokens if tok.kind == "coll"})
    sinks: list[int] = []
    for copy in range(copies):
        if copy < full:
            keep = [True] * n
        else:
            keep = [keyed_uniform(seed, "keep", copy, *ev) < share if ev else bool(rng.random() < share)
                    for ev in events]
        index = [-1] * n
        count = len(out.nodes)
        for pos in range(n):
            if keep[pos]:
                index[pos] = count
                count += 1
        inherited: dict[int, set[int]] = {}  # dropped position -> the kept nodes it stands for
        deps: dict[int, tuple[set[int], set[int]]] = {}
        for pos in order:
            tok = tokens[pos]
            data: set[int] = set()
            ctrl: set[int] = set()
            for offsets, into in ((tok.deps, data), (tok.ctrl, ctrl)):
                for off in offsets:
                    q = pos + off
                    if keep[q]:
                        into.add(index[q])
                    else:
                        into.update(inherited[q])
            if keep[pos]:
                deps[pos] = (data, ctrl - data)
            else:
                inherited[pos] = data | ctrl
        has_child = set()
        for pos in range(n):
            if not keep[pos]:
                continue
            tok = tokens[pos]
            data, ctrl = deps[pos]
            has_child.update(data, ctrl)
            if not data and not ctrl:
                data = set(sinks)
            ev = events[pos]
            values = event_values[(copy, *ev, tok.bin)] if ev else deck.draw(tok.bin)
            tag = 1 + copy * profile.num_messages + ev[1] if tok.kind in ("send", "recv") else 0
            out.nodes.append(_Node(tok, values, sorted(data), sorted(ctrl), tag))
        kept = [index[pos] for pos in range(n) if keep[pos]]
        if kept:
            sinks = [i for i in kept if i not in has_child]
    return out


def _instantiate(rank: int, layout: Layout, template: _Template, gids: dict[tuple[int, tuple[int, ...]], int]
                 ) -> list[Any]:
    groups: dict[int, tuple[int, ...]] = {}
    pg_of: dict[int, str] = {}
    for f in sorted(template.families):
        members = layout.group(rank, f)
        if members is None:
            pg_of[f] = ""
        else:
            gid = gids[(f, members)]
            groups[gid] = members
            pg_of[f] = str(gid)
    first = 1 if groups else 0
    nodes: list[Any] = [process_groups_node(0, groups)] if groups else []
    counters: dict[str, int] = {}
    for k, node in enumerate(template.nodes):
        tok, v = node.token, node.values
        kind = tok.kind
        attrs: list[tuple[str, Any]] = [("is_cpu_op", kind == "cpu" or kind.startswith("host_"))]
        duration = v[0] if kind in ("comp", "cpu", "meta", "invalid") else v[-1]
        if kind in ("comp", "cpu"):
            attrs += [(name, x) for name, x in (("num_ops", v[1]), ("tensor_size", v[2])) if x >= 0]
            stem = _NAMES[kind]
        elif kind in ("coll", "host_coll"):
            ctype = tok.comm[0]
            stem = (CollectiveType(ctype).name.lower() if 0 <= ctype <= max(CollectiveType) else "collective")
            stem = ("host_" if kind == "host_coll" else "") + stem
            if ctype >= 0:
                attrs.append(("comm_type", ctype))
            if v[0] >= 0:
                attrs.append(("comm_size", v[0]))
            if kind == "coll":
                if pg_of[tok.comm[1]]:
                    attrs.append(("pg_name", pg_of[tok.comm[1]]))
                if tok.involved_dim is not None:
                    attrs.append(("involved_dim", list(tok.involved_dim)))
                if tok.priority is not None:
                    attrs.append(("comm_priority", tok.priority))
        elif kind in ("send", "recv"):
            peer = layout.peer(rank, tok.comm[0], tok.comm[1])
            src, dst = (rank, peer) if kind == "send" else (peer, rank)
            attrs += [("comm_src", src), ("comm_dst", dst), ("comm_size", v[0]), ("comm_tag", node.tag)]
            stem = _NAMES[kind]
        elif kind in ("host_send", "host_recv"):
            attrs += [("comm_size", v[0])] if v[0] >= 0 else []
            stem = _NAMES[kind]
        elif kind in ("load", "store"):
            attrs.append(("tensor_size", v[0]))
            stem = _NAMES[kind]
        else:
            attrs = []
            stem = _NAMES[kind]
        number = counters.get(stem, 0)
        counters[stem] = number + 1
        nodes.append(make_node(k + first, f"{stem}_{number}", _TYPES[kind], data_deps=[d + first for d in node.data],
                               ctrl_deps=[d + first for d in node.ctrl], duration_micros=max(0, duration),
                               attrs=attrs))
    return nodes
