"""Fabric files: real network topologies, given as a generator and its parameters, or as a list of links.

    fabric: fat-tree        # 2 levels (leaves, spines) or 3 (k-ary: edge, aggregation, core)
    levels: 2               # default 3 with k; 2 with npus / npus_per_leaf / spines
    k: 8                    # switch radix: 3 levels k^3/4 NPUs, 2 levels k^2/2 NPUs
    oversubscription: 2     # with k: leaf downlinks per uplink (fewer uplinks, spines or aggregation switches)
    npus: 64                # 2 levels without k: NPUs, NPUs per leaf and spines (every leaf links every spine)
    npus_per_leaf: 8
    spines: 4
    bandwidth: 100          # GB/s per link, GB = 2^30 B as in ASTRA-sim's network file (uplink_bandwidth: a
                            # different one between switches)
    latency: 500            # ns per link

    fabric: torus           # NPUs on a 2-D or 3-D torus (they relay traffic); dims: [4, 8]
    fabric: dragonfly       # groups of routers, all-to-all inside a group, one global link per pair of groups:
                            # routers_per_group, npus_per_router, global_links_per_router, groups
                            # (default routers_per_group x global_links_per_router + 1); bandwidth and latency
                            # may be {terminal: .., local: .., global: ..}
    fabric: rail-optimized  # nodes of gpus_per_node GPUs on an NVSwitch (nvlink_bandwidth, nvlink_latency);
                            # GPU g of every node on rail leaf g (nic_bandwidth, nic_latency); spines join
                            # the leaves (default one per rail)
    fabric: links           # npus, switches (a count, or names), links: [[a, b, bandwidth, latency], ...]
                            # (a, b: NPU numbers or switch names; both directions unless directed: true)

Every fabric file may also give ``logical_dims`` (the NPUs per dimension the collectives see; the product
must be the NPU count; default: the fabric's natural hierarchy, else one dimension) and a ``packet:``
section (network/packet.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from network.topology import Fabric
from network.values import MAX_LATENCY_NS, MAX_BANDWIDTH_GiBps, check_size, choice, flag, key_names, number, whole
from workload.errors import ConfigError, shown

COMMON_KEYS = ("fabric", "logical_dims", "packet", "description")


def _int(data: dict[str, Any], key: str, where: str, default: int | None = None, minimum: int = 1) -> int:
    value = data.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: missing key '{key}'")
    return whole(value, key, where, low=minimum)


def _number(value: Any, key: str, where: str, latency: bool = False) -> float:
    """A link's bandwidth (GB/s with GB = 2^30 B, positive) or, with ``latency``, its latency (ns, not negative)."""
    if value is None:
        raise ConfigError(f"{where}: missing key '{key}'")
    if latency:
        return number(value, key, where, high=MAX_LATENCY_NS)
    return number(value, key, where, high=MAX_BANDWIDTH_GiBps, positive=True)


def _per_kind(data: dict[str, Any], key: str, kinds: tuple[str, ...], where: str, default: Any = None
              ) -> dict[str, float]:
    """A value for each kind of link: one number for all, or a mapping {kind: number}."""
    value = data.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: missing key '{key}'")
    latency = key == "latency"
    if isinstance(value, dict):
        unknown = sorted(set(map(str, value)) - set(kinds))
        missing = [k for k in kinds if k not in value]
        if unknown or missing:
            raise ConfigError(f"{where}: '{key}' needs exactly the link kinds {', '.join(kinds)}")
        return {k: _number(value[k], f"{key}.{k}", where, latency) for k in kinds}
    number_ = _number(value, key, where, latency)
    return dict.fromkeys(kinds, number_)


def fat_tree(data: dict[str, Any], where: str) -> Fabric:
    levels = _int(data, "levels", where, 3 if "k" in data else 2, 2)
    if levels not in (2, 3):
        raise ConfigError(f"{where}: 'levels' must be 2 or 3 (got {levels})")
    bw = _number(data.get("bandwidth"), "bandwidth", where)
    up_bw = _number(data.get("uplink_bandwidth", bw), "uplink_bandwidth", where)
    lat = _number(data.get("latency", 0), "latency", where, latency=True)
    if "k" in data:
        k = _int(data, "k", where, minimum=2)
        r = _int(data, "oversubscription", where, 1)
        if k % 2 or (k // 2) % r:
            raise ConfigError(f"{where}: 'k' must be even and k/2 divisible by 'oversubscription' (k={k}, "
                              f"oversubscription={r})")
        down, up = k // 2, k // 2 // r
        npus = k * down if levels == 2 else k * down * down
        check_size(npus, 6 * npus, where, f"a fat-tree with k={k}")
        if levels == 2:
            return _leaf_spine(k * down, down, up, bw, up_bw, lat, where, f"fat-tree k={k}")
        return _three_level(k, down, up, bw, up_bw, lat, where)
    if levels == 3:
        raise ConfigError(f"{where}: a 3-level fat-tree is given by 'k' (and 'oversubscription')")
    npus = _int(data, "npus", where, minimum=2)
    per_leaf = _int(data, "npus_per_leaf", where)
    spines = _int(data, "spines", where)
    if npus % per_leaf:
        raise ConfigError(f"{where}: 'npus' ({npus}) must be a multiple of 'npus_per_leaf' ({per_leaf})")
    check_size(npus, 2 * (npus + npus // per_leaf * spines), where, "this fat-tree")
    return _leaf_spine(npus, per_leaf, spines, bw, up_bw, lat, where, "fat-tree")


def _leaf_spine(npus: int, per_leaf: int, spines: int, bw: float, up_bw: float, lat: float, where: str,
                kind: str) -> Fabric:
    leaves = npus // per_leaf
    fabric = Fabric(kind, npus, (per_leaf, leaves) if leaves > 1 else (npus,), npus_forward=False, where=where)
    leaf_ids = [fabric.add_switch(f"leaf{i}") for i in range(leaves)]
    spine_ids = [fabric.add_switch(f"spine{i}") for i in range(spines)] if leaves > 1 else []
    for npu in range(npus):
        fabric.connect(npu, leaf_ids[npu // per_leaf], bw, lat)
    for leaf in leaf_ids:
        for spine in spine_ids:
            fabric.connect(leaf, spine, up_bw, lat)
    return fabric


def _three_level(k: int, down: int, up: int, bw: float, up_bw: float, lat: float, where: str) -> Fabric:
    pods, per_pod = k, down * down
    npus = pods * per_pod
    fabric = Fabric(f"fat-tree k={k}", npus, (down, down, pods), npus_forward=False, where=where)
    cores = [fabric.add_switch(f"core{i}") for i in range(up * down)]
    for p in range(pods):
        edges = [fabric.add_switch(f"edge{p}.{e}") for e in range(down)]
        aggs = [fabric.add_switch(f"agg{p}.{a}") for a in range(up)]
        for e, edge in enumerate(edges):
            for h in range(down):
                fabric.connect(p * per_pod + e * down + h, edge, bw, lat)
            for agg in aggs:
                fabric.connect(edge, agg, up_bw, lat)
        for a, agg in enumerate(aggs):
            for c in range(down):
                fabric.connect(agg, cores[a * down + c], up_bw, lat)
    return fabric


def torus(data: dict[str, Any], where: str) -> Fabric:
    dims = data.get("dims")
    if not isinstance(dims, list) or not 1 <= len(dims) <= 3:
        raise ConfigError(f"{where}: 'dims' must list 1 to 3 sizes >= 2, e.g. [4, 8] (got {shown(dims)})")
    dims = [whole(n, "dims", where, low=2) for n in dims]
    npus = math.prod(dims)
    check_size(npus, 2 * len(dims) * npus, where, f"a {'x'.join(map(str, dims))} torus")
    bws = _per_dimension(data, "bandwidth", len(dims), where)
    lats = _per_dimension(data, "latency", len(dims), where, 0)
    fabric = Fabric(f"torus {'x'.join(map(str, dims))}", npus, tuple(dims), npus_forward=True, where=where)
    stride = 1
    for d, n in enumerate(dims):
        for npu in range(npus):
            pos = (npu // stride) % n
            nxt = npu + ((pos + 1) % n - pos) * stride
            fabric.connect(npu, nxt, bws[d], lats[d])
        stride *= n
    return fabric


def _per_dimension(data: dict[str, Any], key: str, dims: int, where: str, default: Any = None) -> list[float]:
    value = data.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: missing key '{key}'")
    latency = key == "latency"
    if isinstance(value, list):
        if len(value) != dims:
            raise ConfigError(f"{where}: '{key}' has {len(value)} entries for {dims} dimensions")
        return [_number(v, key, where, latency) for v in value]
    return [_number(value, key, where, latency)] * dims


def dragonfly(data: dict[str, Any], where: str) -> Fabric:
    a = _int(data, "routers_per_group", where)
    p = _int(data, "npus_per_router", where)
    h = _int(data, "global_links_per_router", where)
    g = _int(data, "groups", where, a * h + 1, 2)
    if g > a * h + 1:
        raise ConfigError(f"{where}: at most routers_per_group x global_links_per_router + 1 = {a * h + 1} groups "
                          f"can be joined pairwise (got {g})")
    npus = g * a * p
    check_size(npus, 2 * (npus + g * a * a + g * g), where, "this dragonfly")
    kinds = ("terminal", "local", "global")
    bw = _per_kind(data, "bandwidth", kinds, where)
    lat = _per_kind(data, "latency", kinds, where, 0)
    fabric = Fabric(f"dragonfly {g}x{a}x{p}", npus, (p, a, g) if p > 1 else (a, g), npus_forward=False,
                    where=where)
    routers = [[fabric.add_switch(f"router{i}.{r}") for r in range(a)] for i in range(g)]
    for i in range(g):
        for r in range(a):
            for t in range(p):
                fabric.connect((i * a + r) * p + t, routers[i][r], bw["terminal"], lat["terminal"])
            for r2 in range(r + 1, a):
                fabric.connect(routers[i][r], routers[i][r2], bw["local"], lat["local"])
        for port in range(g - 1):  # group i's port `port` leads to group i + port + 1
            j = (i + port + 1) % g
            if i < j:
                back = (i - j - 1) % g
                fabric.connect(routers[i][port // h], routers[j][back // h], bw["global"], lat["global"])
    return fabric


def rail_optimized(data: dict[str, Any], where: str) -> Fabric:
    nodes = _int(data, "nodes", where)
    gpus = _int(data, "gpus_per_node", where)
    spines = _int(data, "spines", where, gpus, 0)
    npus = nodes * gpus
    check_size(npus, 2 * (2 * npus + spines * gpus), where, "this rail-optimized cluster")
    nv_bw = _number(data.get("nvlink_bandwidth"), "nvlink_bandwidth", where)
    nv_lat = _number(data.get("nvlink_latency", 0), "nvlink_latency", where, latency=True)
    nic_bw = _number(data.get("nic_bandwidth"), "nic_bandwidth", where)
    nic_lat = _number(data.get("nic_latency", 0), "nic_latency", where, latency=True)
    spine_bw = _number(data.get("spine_bandwidth", nic_bw), "spine_bandwidth", where)
    fabric = Fabric(f"rail-optimized {nodes}x{gpus}", npus, (gpus, nodes) if nodes > 1 else (gpus,),
                    npus_forward=False, where=where)
    for n in range(nodes):
        nvswitch = fabric.add_switch(f"nvswitch{n}")
        for gpu in range(gpus):
            fabric.connect(n * gpus + gpu, nvswitch, nv_bw, nv_lat)
    if nodes > 1:
        leaves = [fabric.add_switch(f"rail{r}") for r in range(gpus)]
        for n in range(nodes):
            for gpu in range(gpus):
                fabric.connect(n * gpus + gpu, leaves[gpu], nic_bw, nic_lat)
        for s in range(spines):
            spine = fabric.add_switch(f"spine{s}")
            for leaf in leaves:
                fabric.connect(leaf, spine, spine_bw, nic_lat)
    return fabric


def links(data: dict[str, Any], where: str) -> Fabric:
    npus = _int(data, "npus", where, minimum=2)
    switches = data.get("switches", 0)
    listed = data.get("links")
    if not isinstance(listed, list) or not listed:
        raise ConfigError(f"{where}: 'links' must be a non-empty list of [a, b, bandwidth, latency]")
    if isinstance(switches, list) and all(isinstance(s, str) for s in switches):
        names = list(switches)
    else:
        names = [f"s{i}" for i in range(whole(switches, "switches", where, low=0))]
    check_size(npus + len(names), 2 * len(listed), where, "this list of links")
    forward = flag(data.get("npus_forward", False), "npus_forward", where)
    fabric = Fabric("links", npus, (npus,), npus_forward=forward, where=where)
    ids = {name: fabric.add_switch(name) for name in names}
    if len(ids) != len(names):
        raise ConfigError(f"{where}: switch names must be distinct")
    ids.update({f"npu{i}": i for i in range(npus)})

    def node(value: Any, i: int) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value < npus:
                raise ConfigError(f"{where}: links[{i}]: NPU {value} is outside 0..{npus - 1}")
            return value
        if not isinstance(value, str) or value not in ids:
            raise ConfigError(f"{where}: links[{i}]: unknown endpoint {shown(value)} (NPU numbers or switch names)")
        return ids[value]

    for i, entry in enumerate(listed):
        if isinstance(entry, list) and len(entry) == 4:
            a, b, bw, lat = entry
            directed = False
        elif isinstance(entry, dict) and {"a", "b", "bandwidth"} <= set(entry):
            a, b, bw, lat = entry["a"], entry["b"], entry["bandwidth"], entry.get("latency", 0)
            directed = flag(entry.get("directed", False), f"links[{i}].directed", where)
        else:
            raise ConfigError(f"{where}: links[{i}] must be [a, b, bandwidth, latency] or {{a, b, bandwidth, latency, "
                              "directed}}")
        fabric.connect(node(a, i), node(b, i), _number(bw, f"links[{i}] bandwidth", where),
                       _number(lat, f"links[{i}] latency", where, latency=True), both_ways=not directed)
    return fabric


GENERATORS: dict[str, tuple[Callable[[dict[str, Any], str], Fabric], tuple[str, ...]]] = {
    "fat-tree": (fat_tree, ("levels", "k", "oversubscription", "npus", "npus_per_leaf", "spines", "bandwidth",
                            "uplink_bandwidth", "latency")),
    "torus": (torus, ("dims", "bandwidth", "latency")),
    "dragonfly": (dragonfly, ("routers_per_group", "npus_per_router", "global_links_per_router", "groups",
                              "bandwidth", "latency")),
    "rail-optimized": (rail_optimized, ("nodes", "gpus_per_node", "spines", "nvlink_bandwidth", "nvlink_latency",
                                        "nic_bandwidth", "nic_latency", "spine_bandwidth")),
    "links": (links, ("npus", "switches", "links", "npus_forward")),
}


FABRIC_KEYS = ("fabric", "logical_dims", *dict.fromkeys(k for _, keys in GENERATORS.values() for k in keys))


def fabric_from_dict(data: dict[str, Any], where: str) -> Fabric:
    """Build and check the fabric a fabric file describes; mistakes are ConfigErrors naming file and key."""
    kind = choice(data.get("fabric"), "fabric", where, tuple(GENERATORS))
    build, keys = GENERATORS[kind]
    unknown = key_names(set(data) - set(keys) - set(COMMON_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} for a {kind} fabric; valid: "
                          f"{', '.join(keys + COMMON_KEYS)}")
    fabric = build(data, where)
    dims = data.get("logical_dims")
    if dims is not None:
        if not isinstance(dims, list) or not dims:
            raise ConfigError(f"{where}: 'logical_dims' must be a list of NPU counts, each at least 2")
        dims = [whole(n, "logical_dims", where, low=2) for n in dims]
        if math.prod(dims) != fabric.num_npus:
            raise ConfigError(f"{where}: 'logical_dims' {dims} multiply to {math.prod(dims)}, but the fabric has "
                              f"{fabric.num_npus} NPUs")
        fabric.logical_dims = tuple(dims)
    fabric.check()
    return fabric
