"""Property: on random fabrics, with random chunking and algorithms, every rank that issues the same
collectives finishes them: no false deadlock on any backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from network.config import network_from_dict
from simulator.api import simulate
from simulator.config import DEFAULT_SYSTEM, system_from_dict
from workload.schema import CollectiveType
from workload.tools.generate import collective, write_rank_traces

BANDWIDTHS = st.sampled_from([25, 50, 100, 400])
LATENCIES = st.sampled_from([0, 100, 500, 1000, 1700])


@st.composite
def fabrics(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["fat-tree", "torus", "dragonfly", "rail-optimized"]))
    if kind == "fat-tree":
        per_leaf, leaves = draw(st.integers(2, 6)), draw(st.integers(2, 4))
        return {"fabric": kind, "npus": per_leaf * leaves, "npus_per_leaf": per_leaf, "spines": draw(st.integers(1, 3)),
                "bandwidth": draw(BANDWIDTHS), "uplink_bandwidth": draw(BANDWIDTHS), "latency": draw(LATENCIES)}
    if kind == "torus":
        dims = draw(st.lists(st.integers(2, 4), min_size=2, max_size=3))
        return {"fabric": kind, "dims": dims, "bandwidth": draw(BANDWIDTHS), "latency": draw(LATENCIES)}
    if kind == "dragonfly":
        routers, links = draw(st.integers(2, 3)), draw(st.integers(1, 2))
        return {"fabric": kind, "routers_per_group": routers, "npus_per_router": draw(st.integers(1, 2)),
                "global_links_per_router": links, "groups": draw(st.integers(2, routers * links + 1)),
                "bandwidth": {"terminal": draw(BANDWIDTHS), "local": draw(BANDWIDTHS), "global": draw(BANDWIDTHS)},
                "latency": {"terminal": draw(LATENCIES), "local": draw(LATENCIES), "global": draw(LATENCIES)}}
    return {"fabric": kind, "nodes": draw(st.integers(2, 3)), "gpus_per_node": draw(st.sampled_from([2, 4])),
            "nvlink_bandwidth": draw(BANDWIDTHS), "nvlink_latency": draw(LATENCIES), "nic_bandwidth": draw(BANDWIDTHS),
            "nic_latency": draw(LATENCIES)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fabric=fabrics(), kind=st.sampled_from(["ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL"]),
       size=st.sampled_from([1 << 16, 1 << 20, 24 << 20]), repeat=st.integers(1, 3),
       splits=st.sampled_from([1, 2, 4, 8]), active=st.sampled_from([1, 1, 2]), algorithm=st.sampled_from(
           ["ring", "direct"]), policy=st.sampled_from(["LIFO", "FIFO"]),
       backend=st.sampled_from(["analytical-unaware", "analytical-aware", "analytical-aware", "packet"]),
       buffer_bytes=st.sampled_from([8192, 65536, 1 << 20]))
def test_every_rank_finishes_on_random_fabrics(tmp_path: Path, fabric: dict[str, Any], kind: str, size: int,
                                               repeat: int, splits: int, active: int, algorithm: str, policy: str,
                                               backend: str, buffer_bytes: int) -> None:
    if backend == "packet":  # tiny buffers too: a virtual channel per hop must keep every route deadlock-free
        fabric = {**fabric, "packet": {"buffer_bytes": buffer_bytes}}
        size = min(size, 1 << 20)  # packets at 4 KiB: keep the run short
    network = network_from_dict(fabric)
    prefix = tmp_path / f"t{len(list(tmp_path.iterdir()))}" / "trace"
    write_rank_traces(str(prefix), collective(1, CollectiveType[kind], size, repeat=repeat))
    system = system_from_dict({**DEFAULT_SYSTEM, "preferred-dataset-splits": splits,
                               "active-chunks-per-dimension": active, "scheduling-policy": policy,
                               **{key: [algorithm] * network.num_dims for key in DEFAULT_SYSTEM
                                  if key.endswith("-implementation")}})
    result = simulate(f"{prefix}.0.et", network, system, backend=backend)
    assert result.complete and all(r.finish_ns > 0 for r in result.ranks)
    assert sum(c.count_per_rank for c in result.collectives) == repeat
