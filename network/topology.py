"""Physical topologies: NPUs, switches and directed links with a bandwidth and a latency, and routes.

A Fabric is a networkx DiGraph: nodes ``0 .. npus-1`` are NPUs, switches follow; each edge is a directed link
with ``bandwidth_GiBps`` (GB/s, 1 GB = 2**30 bytes, as in ASTRA-sim) and ``latency_ns``. Fabrics come from
ASTRA-sim's network YAML (Ring, FullyConnected, Switch per dimension, composed across dimensions) or from a
fabric file (``fabric: fat-tree | torus | dragonfly | rail-optimized | links``; see network/fabrics.py).

Routes: on fabrics, every message takes one of the equal-cost shortest paths, chosen per message by hashing
(per-flow ECMP, decided hop by hop as switches do); NPUs relay traffic only in direct networks (tori, ASTRA-sim
dimensions). On ASTRA-sim dimensions, messages use dimension-order routes: dimension 0 first, the shorter way
round a ring (clockwise on ties), as the analytical-aware backend has always done.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from workload.errors import ConfigError

_MASK = (1 << 64) - 1


class Fabric:
    """NPUs, switches and directed links; ``logical_dims`` is how the system layer sees the NPUs."""

    def __init__(self, kind: str, npus: int, logical_dims: tuple[int, ...], npus_forward: bool,
                 where: str = "<fabric>") -> None:
        self.kind = kind
        self.num_npus = npus
        self.logical_dims = logical_dims
        self.npus_forward = npus_forward  # may an NPU relay other NPUs' traffic (direct networks)?
        self.where = where
        import networkx as nx  # only fabrics need a graph: ASTRA-sim's dimensions run without it

        self.graph = nx.DiGraph()
        self.names: list[str] = []
        for i in range(npus):
            self.graph.add_node(i, kind="npu")
            self.names.append(f"npu{i}")

    @property
    def num_switches(self) -> int:
        return self.graph.number_of_nodes() - self.num_npus

    @property
    def num_links(self) -> int:
        return self.graph.number_of_edges()

    def add_switch(self, name: str) -> int:
        node = len(self.names)
        self.graph.add_node(node, kind="switch")
        self.names.append(name)
        return node

    def connect(self, a: int, b: int, bandwidth_GiBps: float, latency_ns: float, both_ways: bool = True) -> None:
        if a == b:
            raise ConfigError(f"{self.where}: a link from {self.names[a]} to itself")
        if not bandwidth_GiBps > 0 or bandwidth_GiBps == float("inf"):
            raise ConfigError(f"{self.where}: link {self.names[a]}-{self.names[b]}: bandwidth must be a positive "
                              f"number of GB/s with GB = 2^30 B (got {bandwidth_GiBps})")
        if not latency_ns >= 0 or latency_ns == float("inf"):
            raise ConfigError(f"{self.where}: link {self.names[a]}-{self.names[b]}: latency must be a non-negative "
                              f"number of ns (got {latency_ns})")
        self.graph.add_edge(a, b, bandwidth_GiBps=float(bandwidth_GiBps), latency_ns=float(latency_ns))
        if both_ways:
            self.graph.add_edge(b, a, bandwidth_GiBps=float(bandwidth_GiBps), latency_ns=float(latency_ns))

    def link(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth in GB/s with GB = 2^30 B, latency in ns) of the link a -> b."""
        data = self.graph.edges[a, b]
        return data["bandwidth_GiBps"], data["latency_ns"]

    def link_name(self, a: int, b: int) -> str:
        return f"{self.names[a]}->{self.names[b]}"

    def describe(self) -> str:
        dims = " x ".join(map(str, self.logical_dims))
        return (f"{self.kind}: {self.num_npus} NPUs, {self.num_switches} switches, {self.num_links} links "
                f"(logical {dims})")

    def check(self) -> None:
        """Every NPU must reach every other NPU (through switches, or NPUs where they relay)."""
        router = EcmpRouter(self)
        far = router.unreachable_from(0)
        if far is not None:
            raise ConfigError(f"{self.where}: {self.names[far]} cannot be reached from npu0: the fabric is not "
                              "connected" + ("" if self.npus_forward else " through its switches (NPUs do not relay)"))
        back = router.unreachable_to(0)
        if back is not None:
            raise ConfigError(f"{self.where}: npu0 cannot be reached from {self.names[back]}: the fabric is not "
                              "connected")


def _mix(x: int) -> int:
    """A 64-bit integer hash (splitmix64's finaliser): stable across runs, unlike hash()."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class EcmpRouter:
    """Per-flow ECMP over shortest paths (in hops): at every hop the flow's hash picks a next hop among those
    that stay on a shortest path, so all packets of a message take one path and different messages spread."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        n = fabric.graph.number_of_nodes()
        self.out = [tuple(sorted(fabric.graph.successors(u))) for u in range(n)]
        self.into = [tuple(sorted(fabric.graph.predecessors(u))) for u in range(n)]
        self.relays = [fabric.npus_forward or u >= fabric.num_npus for u in range(n)]
        self._tables: dict[int, list[int]] = {}
        self._choices: dict[tuple[int, int], tuple[int, ...]] = {}

    def _distances(self, target: int) -> list[int]:
        """Hops from every node to ``target`` on paths that relay only through relaying nodes (-1: none)."""
        table = self._tables.get(target)
        if table is None:
            table = [-1] * len(self.out)
            table[target] = 0
            queue = deque([target])
            while queue:
                v = queue.popleft()
                if v != target and not self.relays[v]:
                    continue  # v may start a path, not carry one
                for u in self.into[v]:
                    if table[u] < 0:
                        table[u] = table[v] + 1
                        queue.append(u)
            self._tables[target] = table
        return table

    def _anchor(self, dst: int) -> tuple[int, int]:
        """(node whose distance table serves dst, hops from it to dst): a non-relaying NPU with one way in is
        reached through that one neighbour, so NPUs on the same switch share one table."""
        ins = self.into[dst]
        if len(ins) == 1 and not self.relays[dst]:
            return ins[0], 1
        return dst, 0

    def next_hops(self, u: int, dst: int) -> tuple[int, ...]:
        key = (u, dst)
        found = self._choices.get(key)
        if found is None:
            if dst in self.out[u]:
                found = (dst,)
            else:
                anchor, _ = self._anchor(dst)
                table = self._distances(anchor)
                want = table[u] - 1
                found = tuple(v for v in self.out[u] if table[v] == want and (self.relays[v] or v == anchor)) \
                    if table[u] > 0 else ()
            self._choices[key] = found
        return found

    def path(self, src: int, dst: int, flow: int) -> list[int]:
        """The devices a message of ``flow`` visits, src first, dst last."""
        nodes = [src]
        u = src
        seed = _mix(flow)
        while u != dst:
            choices = self.next_hops(u, dst)
            if not choices:
                raise ConfigError(f"{self.fabric.where}: no route from {self.fabric.names[src]} to "
                                  f"{self.fabric.names[dst]}")
            u = choices[0] if len(choices) == 1 else choices[_mix(seed ^ (u * 0x9E3779B97F4A7C15)) % len(choices)]
            nodes.append(u)
        return nodes

    def unreachable_from(self, src: int) -> int | None:
        for dst in range(self.fabric.num_npus):
            if dst != src:
                anchor, _ = self._anchor(dst)
                if self._distances(anchor)[src] < 0 and src != anchor:
                    return dst
        return None

    def unreachable_to(self, dst: int) -> int | None:
        anchor, _ = self._anchor(dst)
        table = self._distances(anchor)
        return next((u for u in range(self.fabric.num_npus) if u != dst and u != anchor and table[u] < 0), None)


class Flows:
    """Routes messages as flows: the n-th message from src to dst is flow n of that pair, so every backend
    that routes through the same router sends the same message down the same path."""

    def __init__(self, router: EcmpRouter | DimensionOrderRouter) -> None:
        self.router = router
        self._count: dict[tuple[int, int], int] = {}

    def path(self, src: int, dst: int) -> tuple[int, ...]:
        key = (src, dst)
        n = self._count.get(key, 0)
        self._count[key] = n + 1
        return tuple(self.router.path(src, dst, (src * 1_000_003 + dst) * 1_000_033 + n))


def dimension_order_hops(npus_count: tuple[int, ...], topology: tuple[str, ...], src: int, dst: int,
                         switch_of: Callable[[int, int], int]) -> Iterator[tuple[int, int, int]]:
    """The hops (a, b, dimension) of the dimension-order route from src to dst on ASTRA-sim dimensions.

    ``switch_of(dim, npu)`` names the switch of npu's line in a Switch dimension.
    """
    cur, stride = src, 1
    for dim, (kind, n) in enumerate(zip(topology, npus_count, strict=True)):
        a, b = (cur // stride) % n, (dst // stride) % n
        if a != b:
            if kind == "Ring":
                cw = (b - a) % n
                step = -1 if n - cw < cw else 1
                pos = a
                while pos != b:
                    nxt = (pos + step) % n
                    yield cur + (pos - a) * stride, cur + (nxt - a) * stride, dim
                    pos = nxt
            elif kind == "FullyConnected":
                yield cur, cur + (b - a) * stride, dim
            else:
                sw = switch_of(dim, cur)
                yield cur, sw, dim
                yield sw, cur + (b - a) * stride, dim
            cur += (b - a) * stride
        stride *= n


class DimensionOrderRouter:
    """Dimension-order routes on a fabric built from ASTRA-sim dimensions (the same as analytical-aware's)."""

    def __init__(self, fabric: Fabric, topology: tuple[str, ...], npus_count: tuple[int, ...],
                 switches: dict[tuple[int, int], int]) -> None:
        self.fabric = fabric
        self.topology = topology
        self.npus_count = npus_count
        self._switches = switches  # (dimension, first NPU of the line) -> switch node
        self._strides = [1]
        for n in npus_count[:-1]:
            self._strides.append(self._strides[-1] * n)

    def _switch(self, dim: int, npu: int) -> int:
        stride, n = self._strides[dim], self.npus_count[dim]
        return self._switches[(dim, npu - (npu // stride) % n * stride)]

    def path(self, src: int, dst: int, flow: int) -> list[int]:
        nodes = [src]
        for _, b, _ in dimension_order_hops(self.npus_count, self.topology, src, dst, self._switch):
            nodes.append(b)
        return nodes


def from_dimensions(topology: tuple[str, ...], npus_count: tuple[int, ...], bandwidth_GiBps: tuple[float, ...],
                    latency_ns: tuple[float, ...], where: str) -> tuple[Fabric, DimensionOrderRouter]:
    """The fabric of ASTRA-sim's dimensions: rings, full meshes and one switch per line, per dimension."""
    total = 1
    for n in npus_count:
        total *= n
    fabric = Fabric("astra-sim", total, tuple(npus_count), npus_forward=True, where=where)
    switches: dict[tuple[int, int], int] = {}
    stride = 1
    for dim, (kind, n) in enumerate(zip(topology, npus_count, strict=True)):
        bw, lat = bandwidth_GiBps[dim], latency_ns[dim]
        for base in range(total):
            if (base // stride) % n:
                continue  # lines are listed by their first NPU
            members = [base + i * stride for i in range(n)]
            if kind == "Ring":
                pairs: list[tuple[int, int]] = [(members[i], members[(i + 1) % n]) for i in range(n)]
            elif kind == "FullyConnected":
                pairs = [(a, b) for a in members for b in members if a < b]
            else:
                sw = switches[(dim, base)] = fabric.add_switch(f"switch{dim}.{base}")
                pairs = [(m, sw) for m in members]
            for a, b in pairs:
                fabric.connect(a, b, bw, lat)
        stride *= n
    return fabric, DimensionOrderRouter(fabric, topology, npus_count, switches)

