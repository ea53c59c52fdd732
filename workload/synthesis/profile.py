"""A workload profile: what synthesis keeps of a set of traces, and its JSON form.

Kept: the rank layout (grid sizes, which grid dimensions decide a rank's trace shape, communicator groups as
the dimensions they span), one skeleton per class of identically shaped ranks (node kinds in issue order,
dependencies as relative positions, collective type, group family, point-to-point peer as a grid shift,
``involved_dim``, ``comm_priority``) and the numeric values (durations, sizes, operation counts) as log-spaced
bins of rounded, optionally noised multisets; a summary (type mix, depth, fan-in/out histograms, critical-path
phases, quantiles). Removed: node names, ids, op schemas, inputs/outputs, every string attribute and every
attribute synthesis does not need (rf_id, seq_id, scope, ...), group names, message tags, the metadata.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from workload.errors import InputError
from workload.files import parse_json, read_text, shown_path
from workload.synthesis.layout import Family, Layout
from workload.synthesis.values import Bin

FORMAT = "astrasim-py trace profile"
VERSION = 1
KINDS = ("comp", "cpu", "coll", "send", "recv", "host_coll", "host_send", "host_recv", "load", "store", "meta",
         "invalid")
FIELDS = {"comp": 3, "cpu": 3, "load": 2, "store": 2, "meta": 1, "invalid": 1}  # the rest: (comm_size, duration)
BIN_KINDS = {"comp": "compute", "cpu": "cpu", "coll": "coll", "send": "p2p", "recv": "p2p", "host_coll": "host",
             "host_send": "host", "host_recv": "host", "load": "memory", "store": "memory", "meta": "other",
             "invalid": "other"}
NOTES = ("Kept: rank grid, rank classes, per-class node skeletons (kind, relative dependencies, collective type, "
         "group family, peer shift), numeric values as binned rounded multisets, summary statistics. Removed: "
         "names, ids, op schemas, inputs/outputs, string attributes, group names, tags, trace metadata.")


def value_fields(kind: str) -> int:
    return FIELDS.get(kind, 2)


@dataclass(frozen=True, slots=True)
class Token:
    """One distinct skeleton node. ``comm`` is (comm_type, family) for a collective, (dim, shift) for a send or
    receive, (comm_type,) for a host-side communication record, () otherwise."""

    kind: str
    bin: int
    deps: tuple[int, ...]
    ctrl: tuple[int, ...] = ()
    comm: tuple[int, ...] = ()
    involved_dim: tuple[bool, ...] | None = None
    priority: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "bin": self.bin, "deps": list(self.deps)}
        if self.ctrl:
            out["ctrl"] = list(self.ctrl)
        if self.comm:
            out["comm"] = list(self.comm)
        if self.involved_dim is not None:
            out["involved_dim"] = list(self.involved_dim)
        if self.priority is not None:
            out["priority"] = self.priority
        return out


@dataclass(slots=True)
class RankClass:
    """Ranks that share one trace shape: how many there were, the token of each node in issue order and the
    message number of each send/receive in order."""

    ranks: int
    sequence: list[int]
    messages: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Profile:
    layout: Layout
    tokens: list[Token]
    classes: list[RankClass]
    bins: list[Bin]
    num_messages: int
    privacy: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        lay = self.layout
        families = [{"default": True} if f.default else {"groups": [list(g) for g in f.groups]} if f.groups
                    else {"dims": list(f.dims), **({"coords": [None if c is None else list(c) for c in f.coords]}
                                                   if f.coords else {}), **lay.shape(f)} for f in lay.families]
        return {
            "format": FORMAT, "version": VERSION, "notes": NOTES, "privacy": self.privacy,
            "layout": {"dims": list(lay.dims), "class_dims": list(lay.class_dims), "class_of": list(lay.class_of),
                       "explicit": lay.explicit, "families": families},
            "messages": self.num_messages,
            "classes": [{"ranks": c.ranks, "sequence": c.sequence, "messages": c.messages} for c in self.classes],
            "tokens": [t.to_json() for t in self.tokens],
            "bins": [b.to_json() for b in self.bins],
            "summary": self.summary,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, separators=(",", ":"))
            f.write("\n")


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and check a profile written by ``Profile.save``; any problem is an InputError naming file and key."""
    where = os.fspath(path)
    doc = parse_json(read_text(where, "profile"), f"profile {shown_path(where)}")
    return profile_from_json(doc, f"profile {shown_path(where)}")


def profile_from_json(doc: Any, where: str = "profile") -> Profile:
    r = _Reader(where)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"{where}: not a synthesis profile (no \"format\": \"{FORMAT}\"); write one with "
                         "'astrasim-py trace synthesize TRACES --save-profile FILE.json'")
    if doc.get("version") != VERSION:
        raise InputError(f"{where}: profile version {doc.get('version')!r} is not supported (this version reads "
                         f"{VERSION})")
    lay = r.obj(doc, "layout")
    dims = tuple(r.nums(lay, "dims", "layout.dims", low=1))
    families = []
    for k, fam in enumerate(r.seq(lay, "families", "layout")):
        key = f"layout.families[{k}]"
        if not isinstance(fam, dict):
            raise InputError(f"{where}: {key} must be an object")
        if fam.get("default") is True:
            families.append(Family(default=True))
        elif "groups" in fam:
            groups = [tuple(r.num_list(g, f"{key}.groups", low=0)) for g in r.seq(fam, "groups", key)]
            families.append(Family(groups=tuple(groups)))
        else:
            fdims = tuple(r.nums(fam, "dims", key, low=0))
            if any(d >= len(dims) for d in fdims):
                raise InputError(f"{where}: {key}.dims names a dimension beyond the {len(dims)} of layout.dims")
            coords = fam.get("coords") or []
            if coords and (not isinstance(coords, list) or len(coords) != len(fdims) or any(
                    c is not None and not (r.num_list(c, f"{key}.coords", low=0) and max(c) < dims[d])
                    for c, d in zip(coords, fdims, strict=False))):
                raise InputError(f"{where}: {key}.coords must give, per dimension of {key}.dims, null or the "
                                 "coordinates its groups take")
            families.append(Family(dims=fdims, coords=tuple(None if c is None else tuple(c) for c in coords)))
    class_dims = tuple(r.nums(lay, "class_dims", "layout", low=0))
    if any(d >= len(dims) for d in class_dims):
        raise InputError(f"{where}: layout.class_dims names a dimension beyond the {len(dims)} of layout.dims")
    class_of = tuple(r.nums(lay, "class_of", "layout", low=0))
    expected = 1
    for d in class_dims:
        expected *= dims[d]
    if len(class_of) != expected:
        raise InputError(f"{where}: layout.class_of has {len(class_of)} entries; the class dimensions need {expected}")
    layout = Layout(dims, class_dims, class_of, tuple(families), bool(lay.get("explicit", False)))

    bins = []
    for k, b in enumerate(r.seq(doc, "bins")):
        key = f"bins[{k}]"
        kind = b.get("kind") if isinstance(b, dict) else None
        if kind not in set(BIN_KINDS.values()):
            raise InputError(f"{where}: {key}.kind must be one of {sorted(set(BIN_KINDS.values()))}")
        values = [r.num_list(v, f"{key}.values", low=-1) for v in r.seq(b, "values", key)]
        if not values or any(len(v) < 2 or v[-1] < 1 for v in values):
            raise InputError(f"{where}: {key}.values must be non-empty [value..., count >= 1] lists")
        bins.append(Bin(kind, [tuple(v[:-1]) for v in values], [v[-1] for v in values]))

    tokens = []
    for k, t in enumerate(r.seq(doc, "tokens")):
        key = f"tokens[{k}]"
        if not isinstance(t, dict) or t.get("kind") not in KINDS:
            raise InputError(f"{where}: {key}.kind must be one of {', '.join(KINDS)}")
        kind = t["kind"]
        bin_index = r.num(t, "bin", key, low=0)
        if bin_index >= len(bins) or BIN_KINDS[kind] != bins[bin_index].kind or \
                len(bins[bin_index].values[0]) != value_fields(kind):
            raise InputError(f"{where}: {key}.bin {bin_index} is not a {BIN_KINDS[kind]} bin of this profile")
        comm = tuple(r.num_list(t.get("comm", []), f"{key}.comm", low=None))
        _check_comm(where, key, kind, comm, layout)
        involved = t.get("involved_dim")
        if involved is not None and not (isinstance(involved, list) and all(isinstance(v, bool) for v in involved)):
            raise InputError(f"{where}: {key}.involved_dim must be a list of true/false")
        tokens.append(Token(kind, bin_index, tuple(r.num_list(t.get("deps", []), f"{key}.deps", low=None)),
                            tuple(r.num_list(t.get("ctrl", []), f"{key}.ctrl", low=None)), comm,
                            None if involved is None else tuple(involved),
                            None if t.get("priority") is None else r.num(t, "priority", key, low=0)))

    num_messages = r.num(doc, "messages", "profile", low=0)
    classes = []
    for k, c in enumerate(r.seq(doc, "classes")):
        key = f"classes[{k}]"
        seq = r.nums(c, "sequence", key, low=0)
        if any(s >= len(tokens) for s in seq):
            raise InputError(f"{where}: {key}.sequence names a token beyond the {len(tokens)} of this profile")
        for pos, s in enumerate(seq):
            tok = tokens[s]
            if any(not 0 <= pos + off < len(seq) or off == 0 for off in (*tok.deps, *tok.ctrl)):
                raise InputError(f"{where}: {key}: node {pos} depends on a position outside the class's "
                                 f"{len(seq)} nodes")
        messages = r.nums(c, "messages", key, low=0)
        p2p = sum(1 for s in seq if tokens[s].kind in ("send", "recv"))
        if len(messages) != p2p or any(m >= num_messages for m in messages):
            raise InputError(f"{where}: {key}.messages must number each of its {p2p} sends/receives below "
                             f"'messages' ({num_messages})")
        classes.append(RankClass(r.num(c, "ranks", key, low=0), seq, messages))
    if max(layout.class_of, default=0) >= len(classes):
        raise InputError(f"{where}: layout.class_of names a class beyond the {len(classes)} of 'classes'")
    return Profile(layout, tokens, classes, bins, num_messages, dict(doc.get("privacy") or {}),
                   dict(doc.get("summary") or {}))


def _check_comm(where: str, key: str, kind: str, comm: tuple[int, ...], layout: Layout) -> None:
    if kind == "coll":
        ok = len(comm) == 2 and comm[0] >= 0 and 0 <= comm[1] < len(layout.families)
        what = "[comm_type, family]"
    elif kind in ("send", "recv"):
        ok = len(comm) == 2 and 0 <= comm[0] < len(layout.dims)
        what = "[dimension, shift]"
    elif kind == "host_coll":
        ok = len(comm) == 1
        what = "[comm_type]"
    else:
        ok, what = not comm, "absent"
    if not ok:
        raise InputError(f"{where}: {key}.comm must be {what} for a {kind} node")


class _Reader:
    """Typed field access that reports the profile file and key of a bad value."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _fail(self, key: str, what: str) -> InputError:
        return InputError(f"{self.where}: {key} must be {what}")

    def obj(self, doc: Any, name: str) -> dict[str, Any]:
        value = doc.get(name) if isinstance(doc, dict) else None
        if not isinstance(value, dict):
            raise self._fail(name, "an object")
        return value

    def seq(self, doc: Any, name: str, parent: str = "") -> list[Any]:
        value = doc.get(name) if isinstance(doc, dict) else None
        if not isinstance(value, list):
            raise self._fail(f"{parent}.{name}" if parent else name, "a list")
        return value

    def num(self, doc: Any, name: str, parent: str, low: int | None = 0) -> int:
        value = doc.get(name) if isinstance(doc, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
            raise self._fail(f"{parent}.{name}", f"a whole number >= {low}" if low is not None else "a whole number")
        return value

    def nums(self, doc: Any, name: str, parent: str, low: int | None = 0) -> list[int]:
        return self.num_list(self.seq(doc, name, parent), f"{parent}.{name}", low)

    def num_list(self, value: Any, key: str, low: int | None = 0) -> list[int]:
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or
                                              (low is not None and v < low) for v in value):
            raise self._fail(key, f"a list of whole numbers{f' >= {low}' if low is not None else ''}")
        return value
