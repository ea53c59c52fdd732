"""Sweep files: a base run and axes of values, expanded into points, each a fully resolved run.

    base:
      workload: ../workloads/all_reduce/8npus_1MiB/all_reduce   # a trace prefix, a generator YAML file, or a
                                                                # generator mapping (workload/generated.py):
                                                                # {generate: collective, type: all_reduce, size: 64MiB}
                                                                # {generate: llm, preset: gpt3-175b, tp: 8, pp: 8, ...}
      network: ../network/torus_4x8.yml                         # a file, or the YAML mapping inline
      system: ../system/torus_2d.json                           # optional (built-in default), file or mapping
      memory: ../memory/per_npu.json                            # optional
      comm_groups: ../comm_groups/two_groups.json               # optional
      backend: analytical-unaware
      options: {queues_per_dim: 1, injection_scale: 1.0, rendezvous: false, semantics: astra-sim, engine: auto}
                                           # also collective_model: nccl, hw_profile: hgx-h200 (or .yml), nccl_algorithm
    axes:                                  # each a list of values; the cartesian product of all of them
      network.bandwidth: [50, 100, 200]    # a scalar fills every dimension of a per-dimension list
      network.latency[1]: [500, 2000]      # [i]: one dimension only
      system.all-reduce-implementation: [ring, halvingDoubling, [ring, direct]]
      workload.size: [1MiB, 64MiB]         # a key of a generated workload (workload.tp: [1, 2, 4, 8], ...)
      backend: [analytical-unaware, analytical-aware]
    zip:                                   # axes that move together (equal lengths) count as one axis
      - [network.npus_count, network.topology]

Relative paths are relative to the sweep file. A point's key is a hash of its resolved run, so re-running a
sweep recognises the points it already has, whatever their order. A generated workload takes one value per
key (``size: 1MiB``); a list of values is an axis (``workload.size: [1MiB, 64MiB]``).

Points are built on demand: a sweep's size is known (the product of its axis lengths) before any point is.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from network.config import NETWORK_KEYS, network_from_dict
from network.fabrics import FABRIC_KEYS
from network.packet_config import PACKET_KEYS
from simulator.config import DEFAULT_SYSTEM, IMPLEMENTATION_KEYS, MEMORY_KEYS, SYSTEM_KEYS
from workload.errors import ConfigError, InputError, LimitError, printable, shown
from workload.files import parse_yaml, read_json, read_text, read_yaml, shown_path
from workload.generated import llm_aliases, llm_keys, read_generator
from workload.tools.generate import GENERATOR_KEYS
from workload.traceset import resolve_workload

SECTIONS = ("workload", "network", "packet", "system", "memory", "comm_groups", "backend", "options")
# RunOptions fields a sweep may set, with the types they accept
OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "backend": (str,), "queues_per_dim": (int,), "injection_scale": (int, float), "rendezvous": (bool,),
    "semantics": (str,), "engine": (str,), "device": (str, type(None)), "drop_dangling": (bool,),
    "max_wall_time_s": (int, float), "collective_model": (str,), "hw_profile": (str, type(None)),
    "nccl_algorithm": (str, type(None)), "compute_model": (str,),
}
DEFAULT_OPTIONS: dict[str, Any] = {"backend": "analytical-unaware"}
_SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "network": (*NETWORK_KEYS, *FABRIC_KEYS), "packet": PACKET_KEYS, "system": SYSTEM_KEYS, "memory": MEMORY_KEYS,
    "workload": ("generate", *sorted({k for keys in GENERATOR_KEYS.values() for k in keys} | set(llm_keys())
                                     | set(llm_aliases()))),
    "options": tuple(k for k in OPTION_TYPES if k != "backend"),
}
_SETTING = re.compile(r"(?P<section>[a-z_]+)(?:\.(?P<key>[A-Za-z0-9_-]+))?(?:\[(?P<index>\d+)\])?")
_TOP_KEYS = ("name", "description", "base", "axes", "zip")
_PER_DIMENSION = ("topology", "npus_count", "bandwidth", "latency", *IMPLEMENTATION_KEYS)
DEFAULT_MAX_POINTS = 100_000  # a sweep larger than this is a typo more often than a plan (--max-points)
_FILE_SECTIONS = {"network": "network configuration", "system": "system configuration",
                  "memory": "remote-memory configuration", "comm_groups": "communicator group"}


@dataclass(frozen=True, slots=True)
class Setting:
    """Where an axis writes: a whole section, one key of it, or one entry of a per-dimension list."""

    name: str  # as written in the sweep file, e.g. "network.bandwidth[1]"
    section: str
    key: str | None
    index: int | None


@dataclass(frozen=True, slots=True)
class Point:
    """One simulation of a sweep: the swept values, and the resolved run (None if it could not be resolved)."""

    index: int
    key: str
    settings: dict[str, Any]
    run: dict[str, Any] | None
    root: str  # the sweep file's folder, for the workload's relative path
    sources: dict[str, str] = field(default_factory=dict)  # section -> the file it came from
    error: str | None = None  # why the run could not be resolved


@dataclass(frozen=True)
class Sweep:
    """A sweep file, read and checked; its points are built on demand (``point(i)``, ``iter_points()``)."""

    path: str
    text: str
    name: str
    settings: tuple[Setting, ...]
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    groups: tuple[tuple[str, ...], ...]  # axes of the product, slowest first; a zip group moves as one
    root: str

    @property
    def count(self) -> int:
        """How many points the sweep has: the product of its (zipped) axis lengths, without building any."""
        return math.prod(len(self.axes[g[0]]) for g in self.groups)

    def shape(self) -> str:
        """The count as its factors, e.g. "5 x 4 x 4 x 3"."""
        return " x ".join(str(len(self.axes[g[0]])) for g in self.groups) or "1"

    def check_size(self, max_points: int) -> None:
        if self.count > max_points:
            raise LimitError(f"{shown_path(self.path)}: {self.count:,} points ({self.shape()}) is more than the "
                             f"limit of {max_points:,}; shorten the axes, or raise the limit with --max-points "
                             f"{self.count}")

    def point(self, index: int) -> Point:
        """Point ``index`` of the product in file order, the last axis fastest (as itertools.product)."""
        if not 0 <= index < self.count:
            raise IndexError(index)
        values: dict[str, Any] = {}
        rest = index
        for group in reversed(self.groups):
            rest, i = divmod(rest, len(self.axes[group[0]]))
            values.update((name, self.axes[name][i]) for name in group)
        chosen = {name: values[name] for name in self.axes}  # in file order
        by_name = {s.name: s for s in self.settings}
        return _point(index, self.base, [(by_name[n], v) for n, v in chosen.items()], chosen, self.root)

    def iter_points(self, start: int = 0) -> Iterator[Point]:
        for index in range(start, self.count):
            yield self.point(index)

    @functools.cached_property
    def points(self) -> tuple[Point, ...]:
        """Every point (check_size first: this builds them all)."""
        return tuple(self.iter_points())


def parse_setting(name: Any, where: str) -> Setting:
    """An axis name, checked against the sections and their keys (a typo is an error, not 200 failed points)."""
    m = _SETTING.fullmatch(name) if isinstance(name, str) else None
    if m is None or m["section"] not in SECTIONS:
        raise ConfigError(f"{where}: axis {shown(name)}: must be SECTION, SECTION.KEY or SECTION.KEY[i] with SECTION "
                          f"one of {', '.join(SECTIONS)}")
    section, key, index = m["section"], m["key"], m["index"]
    if index is not None and key is None:
        raise ConfigError(f"{where}: axis {name!r}: [i] needs a key, e.g. network.bandwidth[0]")
    if key is not None:
        valid = _SECTION_KEYS.get(section)
        if valid is None:
            raise ConfigError(f"{where}: axis {name!r}: '{section}' is set as a whole (no keys)")
        if key not in valid:
            raise ConfigError(f"{where}: axis {name!r}: {key!r} is not a {section} key; valid: {', '.join(valid)}")
    return Setting(name, section, key, int(index) if index is not None else None)


def load_sweep(path: str) -> Sweep:
    """Read and check a sweep file; structural mistakes raise ConfigError naming the file."""
    text = read_text(path, "sweep")
    where = shown_path(path)
    data = parse_yaml(text, where)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with keys {', '.join(_TOP_KEYS)}")
    unknown = sorted(_key(k) for k in set(data) - set(_TOP_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(_TOP_KEYS)}")
    base = data.get("base")
    if not isinstance(base, dict):
        raise ConfigError(f"{where}: 'base' must be a mapping with the run's workload, network, ...")
    bad = sorted(_key(k) for k in set(base) - set(SECTIONS))
    if bad:
        raise ConfigError(f"{where}: base: unknown key(s) {', '.join(bad)}; valid: {', '.join(SECTIONS)}")
    axes = data.get("axes") or {}
    if not isinstance(axes, dict):
        raise ConfigError(f"{where}: 'axes' must map settings to lists of values")
    settings = tuple(parse_setting(name, where) for name in axes)
    axes = {s.name: axes[s.name] for s in settings}
    for s in settings:
        values = axes[s.name]
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: axis {s.name!r} must be a non-empty list of values (got {shown(values)})")
    groups = _groups(where, data.get("zip") or [], [s.name for s in settings], axes)
    for section in ("workload", "network"):
        if section not in base and not any(s.section == section and s.key is None for s in settings):
            raise ConfigError(f"{where}: base needs a '{section}' (or an axis that sets it)")
    root = os.path.dirname(os.path.abspath(path))

    def whole(section: str) -> list[Any]:  # the base's value and every axis value that replaces the section
        return [base.get(section)] + [v for s in settings if s.section == section and s.key is None
                                      for v in axes[s.name]]

    # Read every named config file now: a missing or broken file is the sweep's error, not every point's.
    for section in _FILE_SECTIONS:
        for value in whole(section):
            if isinstance(value, str):
                try:
                    _read_config(os.path.normpath(os.path.join(root, value)), section)
                except ConfigError as e:
                    raise ConfigError(f"{where}: {section}: {e}") from None
    for value in whole("workload"):
        try:
            if isinstance(value, str):
                path = os.path.normpath(os.path.join(root, value))
                if read_generator(path) is None:
                    resolve_workload(path)
            elif isinstance(value, dict):
                check_generator(value)
        except InputError as e:
            raise ConfigError(f"{where}: workload: {e}") from None
    name = data.get("name") or os.path.splitext(os.path.basename(path))[0]
    return Sweep(path, text, printable(str(name))[:200], settings, base, axes, tuple(map(tuple, groups)), root)


def _key(key: Any) -> str:
    """A mapping key for a message: as written when it is a short name, bounded and escaped otherwise."""
    return key if isinstance(key, str) and len(key) <= 60 and key.isprintable() else shown(key, 60)


def check_generator(spec: dict[str, Any]) -> None:
    """A generated workload takes one value per key: a list is an axis, not a value (one line, not a crash)."""
    for key, value in spec.items():
        if not isinstance(key, str):
            raise InputError(f"generated workload: key {shown(key)} must be a name, e.g. size")
        if not (value is None or isinstance(value, (str, int, float))):
            hint = (f"; to sweep over values, make it an axis: workload.{key}: {shown(value)}"
                    if isinstance(value, list) and key != "generate" else "")
            raise InputError(f"generated workload: '{key}' takes one value, not {shown(value)}{hint}")


def _groups(where: str, zips: Any, names: list[str], axes: dict[str, list[Any]]) -> list[list[str]]:
    """Axes grouped for the product: each zip group is one axis; the rest stand alone, in file order."""
    if not isinstance(zips, list) or not all(isinstance(g, list) and g for g in zips):
        raise ConfigError(f"{where}: 'zip' must be a list of lists of axis names")
    owner: dict[str, int] = {}
    for gi, group in enumerate(zips):
        for name in group:
            if name not in axes:
                raise ConfigError(f"{where}: zip names {shown(name)}, which is not an axis")
            if name in owner:
                raise ConfigError(f"{where}: axis {name!r} is in more than one zip group")
            owner[name] = gi
        lengths = {name: len(axes[name]) for name in group}
        if len(set(lengths.values())) > 1:
            raise ConfigError(f"{where}: zipped axes must have equal lengths: "
                              + ", ".join(f"{n} has {k}" for n, k in lengths.items()))
    groups: list[list[str]] = []
    seen: set[int] = set()
    for name in names:
        if name not in owner:
            groups.append([name])
        elif owner[name] not in seen:
            seen.add(owner[name])
            groups.append(list(zips[owner[name]]))
    return groups


def _point(index: int, base: dict[str, Any], chosen: list[tuple[Setting, Any]], settings: dict[str, Any],
           root: str) -> Point:
    sources: dict[str, str] = {}
    try:
        run = resolve_run(base, chosen, root, sources)
    except InputError as e:
        digest = _digest({"unresolved": settings, "base": base})
        return Point(index, digest, settings, None, root, sources, str(e))
    return Point(index, _digest(run), settings, run, root, sources)


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def resolve_run(base: dict[str, Any], chosen: list[tuple[Setting, Any]], root: str,
                sources: dict[str, str] | None = None) -> dict[str, Any]:
    """The run a point describes: every section as plain data (files read), every swept value applied.

    Whole sections are replaced first, then keys (the network's first: they fix its dimensions), then
    scalars for per-dimension lists (filling every dimension), then single list entries.
    """
    sources = {} if sources is None else sources
    sections = {k: copy.deepcopy(base.get(k)) for k in SECTIONS}
    for s, value in chosen:
        if s.key is None:
            sections[s.section] = copy.deepcopy(value)
    for name in _FILE_SECTIONS:
        value = sections[name]
        if isinstance(value, str):
            path = os.path.join(root, value)
            sources[name] = value
            sections[name] = copy.deepcopy(_read_config(os.path.normpath(path), name))
        elif value is not None and not isinstance(value, dict):
            raise InputError(f"{name} must be a file name or a mapping (got {shown(value)})")
    workload = sections["workload"]
    if not isinstance(workload, (str, dict)):
        raise InputError(f"workload must be a trace path or a generator mapping (got {shown(workload)})")
    network = sections["network"]
    if not isinstance(network, dict):
        raise InputError("network must be a file name or a mapping")
    packet = sections["packet"]
    if packet is not None or any(s.section == "packet" for s, _ in chosen):
        if packet is not None and not isinstance(packet, dict):
            raise InputError("packet must be a mapping of the packet backend's parameters")
        sections["packet"] = network["packet"] = {**(network.get("packet") or {}), **(packet or {})}
    options = sections["options"] or {}
    if not isinstance(options, dict):
        raise InputError("options must be a mapping")
    options = {**DEFAULT_OPTIONS, **options}
    if sections["backend"] is not None:
        options["backend"] = sections["backend"]
    sections["options"] = options
    keyed = sorted(((s, v) for s, v in chosen if s.key is not None),
                   key=lambda sv: (_pass(*sv), sv[0].section != "network"))
    for s, value in keyed:
        if sections["system"] is None and s.section != "network":  # the network's shape is known now
            sections["system"] = default_system_dict(_dimensions(network))
            sources["system"] = "<built-in default system>"
        target = sections[s.section]
        if not isinstance(target, dict):
            what = "a trace path" if s.section == "workload" else shown(target)
            raise InputError(f"axis {s.name}: {s.section} is {what}, which has no keys to set")
        if _pass(s, value) == 1 and "fabric" not in network:  # one value for every dimension
            value = [value] * _dimensions(network)
        _assign(target, s, copy.deepcopy(value))
    if isinstance(workload, dict):
        check_generator(workload)
    if sections["system"] is None:
        sections["system"] = default_system_dict(_dimensions(network))
        sources["system"] = "<built-in default system>"
    for key, value in options.items():
        allowed = OPTION_TYPES.get(key)
        if allowed is None:
            raise InputError(f"options: unknown key {shown(key)}; valid: {', '.join(OPTION_TYPES)}")
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise InputError(f"options: {key} = {shown(value)} is not a {' or '.join(t.__name__ for t in allowed)}")
    return {"workload": workload, "network": network, "system": sections["system"], "memory": sections["memory"],
            "comm_groups": sections["comm_groups"], "options": options}


def default_system_dict(dims: int) -> dict[str, Any]:
    """The built-in system (as a JSON mapping) with one algorithm per dimension."""
    return {k: v * dims if k.endswith("-implementation") else copy.deepcopy(v) for k, v in DEFAULT_SYSTEM.items()}


def _dimensions(network: dict[str, Any]) -> int:
    """How many dimensions the collectives see (a fabric's logical dimensions)."""
    if "fabric" in network:
        return _fabric_dimensions(json.dumps(network, sort_keys=True, default=str))
    for key in ("topology", "npus_count"):
        if isinstance(network.get(key), list):
            return len(network[key])
    return 1


@functools.lru_cache(maxsize=256)
def _fabric_dimensions(text: str) -> int:
    try:
        return network_from_dict(json.loads(text), "<sweep network>").num_dims
    except InputError:
        return 1  # the point will fail with the fabric's own message when it runs


def _pass(s: Setting, value: Any) -> int:
    """Order of application: 0 whole keys, 1 scalars filling per-dimension lists, 2 single entries."""
    if s.index is not None:
        return 2
    return 1 if s.key in _PER_DIMENSION and s.section in ("network", "system") and not isinstance(value, list) else 0


def _assign(target: dict[str, Any], s: Setting, value: Any) -> None:
    current = target.get(s.key)
    if s.index is not None:
        if not isinstance(current, list):
            current = [current] if current is not None else []
        if s.index >= len(current):
            raise InputError(f"axis {s.name}: {s.key} has {len(current)} entr{'y' if len(current) == 1 else 'ies'}, "
                             f"so there is no [{s.index}]")
        current = list(current)
        current[s.index] = value
        target[s.key] = current
    else:
        target[s.key] = value


@functools.cache
def _read_config(path: str, section: str) -> Any:
    what = _FILE_SECTIONS[section]
    data = read_yaml(path, what) if section == "network" else read_json(path, what)
    if not isinstance(data, dict):
        raise ConfigError(f"{shown_path(path)}: expected a mapping")
    return data
