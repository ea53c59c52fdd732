"""The packet-level backend: agreement where nothing is congested, the effects of congestion where it is,
flow control, statistics, and the guards against hangs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from network.config import load_network, network_from_dict
from simulator.api import simulate
from simulator.config import MemoryConfig, system_from_dict
from simulator.simulation import DeadlockError, RunOptions, Simulation
from simulator.sweep.spec import default_system_dict
from tests.conftest import REPO, run_cli, write_trace_file
from workload.schema import CollectiveType, NodeType
from workload.tools.generate import collective, sendrecv_ring, write_rank_traces
from workload.traceset import resolve_workload
from workload.writer import make_node

GiB = 1 << 30


def ring(n: int, bandwidth: float = 50.0, latency: float = 500.0, kind: str = "Ring", **packet: Any) -> Any:
    data: dict[str, Any] = {"topology": [kind], "npus_count": [n], "bandwidth": [bandwidth], "latency": [latency]}
    if packet:
        data["packet"] = packet
    return network_from_dict(data)


def run(tmp_path: Path, traces: list[list[Any]], network: Any, backend: str, system: dict[str, Any] | None = None
        ) -> Any:
    prefix = tmp_path / f"w{len(list(tmp_path.iterdir()))}" / "trace"
    write_rank_traces(str(prefix), traces)
    sys_cfg = system_from_dict({**default_system_dict(network.num_dims), **(system or {})})
    return simulate(str(prefix), network, sys_cfg, backend=backend)


def incast(n: int, size: int) -> list[list[Any]]:
    """Ranks 1..n-1 each send ``size`` bytes to rank 0 at once."""
    def attrs(src: int) -> list[tuple[str, Any]]:
        return [("is_cpu_op", False), ("comm_src", src), ("comm_dst", 0), ("comm_size", size), ("comm_tag", 5)]
    traces = [[make_node(i, f"recv{i}", NodeType.COMM_RECV_NODE, attrs=attrs(i + 1)) for i in range(n - 1)]]
    traces += [[make_node(0, "send", NodeType.COMM_SEND_NODE, attrs=attrs(r))] for r in range(1, n)]
    return traces


@pytest.mark.parametrize(("npus", "size"), [(8, 1 << 20), (16, 64 << 20), (5, 3 << 20)])
def test_ring_all_reduce_on_a_ring_agrees_with_analytical_aware(tmp_path: Path, npus: int, size: int) -> None:
    traces = collective(npus, CollectiveType.ALL_REDUCE, size)
    aware = run(tmp_path, traces, ring(npus), "analytical-aware")
    packet = run(tmp_path, traces, ring(npus), "packet")
    # every message goes one hop, so cutting it into packets changes nothing but rounding
    assert abs(packet.finish_ns - aware.finish_ns) <= 0.02 * aware.finish_ns
    assert packet.finish_ns == aware.finish_ns
    assert packet.network["messages"] == aware.messages


def test_neighbour_send_recv_agrees_with_analytical_aware(tmp_path: Path) -> None:
    traces = sendrecv_ring(8, 8 << 20, iterations=3)
    aware = run(tmp_path, traces, ring(8), "analytical-aware")
    packet = run(tmp_path, traces, ring(8), "packet")
    assert abs(packet.finish_ns - aware.finish_ns) <= 0.02 * aware.finish_ns
    # headers are the one thing packets add: 64 bytes per 4 KiB packet is 1.6 % more on the wire
    headers = run(tmp_path, traces, ring(8, header_bytes=64), "packet")
    assert aware.finish_ns < headers.finish_ns <= 1.02 * aware.finish_ns


@settings(max_examples=30, deadline=None)
@given(size=st.integers(1, 3 << 20), mtu=st.sampled_from([1024, 4096, 9000]), leaves=st.integers(1, 3),
       latency=st.sampled_from([0, 100, 700]), bandwidth=st.sampled_from([12.5, 50, 400]))
def test_one_message_is_pipelined_packet_by_packet(tmp_path_factory: Any, size: int, mtu: int, leaves: int,
                                                   latency: int, bandwidth: float) -> None:
    """Alone in the fabric, a message takes hops x latency + (bytes + (hops - 1) x one packet) / bandwidth."""
    net = network_from_dict({"fabric": "fat-tree", "npus": 4 * leaves, "npus_per_leaf": 4, "spines": 2,
                             "bandwidth": bandwidth, "latency": latency, "packet": {"mtu_bytes": mtu}})
    dst = 4 * leaves - 1
    traces = [[] for _ in range(4 * leaves)]
    attrs = [("is_cpu_op", False), ("comm_src", 0), ("comm_dst", dst), ("comm_size", size), ("comm_tag", 1)]
    traces[0] = [make_node(0, "send", NodeType.COMM_SEND_NODE, attrs=attrs)]
    traces[dst] = [make_node(0, "recv", NodeType.COMM_RECV_NODE, attrs=attrs)]
    result = run(tmp_path_factory.mktemp("m"), traces, net, "packet")
    hops = 2 if leaves == 1 else 4
    per_byte_ns = 1e9 / (bandwidth * GiB)
    first = min(mtu, size)
    expected = hops * latency + (size + (hops - 1) * first) * per_byte_ns
    assert abs(result.finish_ns - expected) <= 1 + size / mtu * 0.001  # per-packet rounding to the picosecond
    assert result.network["packet_hops"] == hops * -(-size // mtu)


def test_all_to_all_through_one_switch_is_congested(tmp_path: Path) -> None:
    traces = collective(8, CollectiveType.ALL_TO_ALL, 8 << 20)
    system = {"all-to-all-implementation": ["direct"]}
    net = ring(8, kind="Switch")
    unaware = run(tmp_path, traces, net, "analytical-unaware", system)
    packet = run(tmp_path, traces, net, "packet", system)
    # each NPU's one link carries 7 messages at once; unaware lets them all run at full bandwidth
    assert packet.finish_ns > 4 * unaware.finish_ns
    top = packet.links[0]
    assert top["utilization"] > 0.9


def test_incast_shows_the_bottleneck_link_and_backpressure(tmp_path: Path) -> None:
    net = ring(8, kind="Switch")
    unaware = run(tmp_path, incast(8, 4 << 20), net, "analytical-unaware")
    packet = run(tmp_path, incast(8, 4 << 20), net, "packet")
    assert packet.finish_ns > 6 * unaware.finish_ns  # seven senders share the receiver's one link
    top = packet.links[0]
    assert top["link"] == "switch0.0->npu0" and top["utilization"] > 0.95
    assert top["messages"] == 7 and top["bytes"] == 7 * (4 << 20)  # every message crossed it
    assert top["max_queue_bytes"] <= 1 << 20  # never more than the buffer: lossless, nothing dropped
    uplinks = [row for row in packet.links if row["link"].endswith("->switch0.0") and row["bytes"]]
    assert len(uplinks) == 7 and all(row["pause_ns"] > 0 for row in uplinks)  # the full queue stalled them
    unlimited = run(tmp_path, incast(8, 4 << 20), ring(8, kind="Switch", flow_control="none"), "packet")
    assert all(row["pause_ns"] == 0 for row in unlimited.links)
    assert unlimited.links[0]["max_queue_bytes"] > 1 << 20
    assert abs(unlimited.finish_ns - packet.finish_ns) <= 0.01 * packet.finish_ns  # the link is the limit either way


def test_oversubscribed_fat_tree_all_reduce(tmp_path: Path) -> None:
    net = load_network(REPO / "configs" / "network" / "fat_tree_64_oversubscribed.yml")
    traces = collective(64, CollectiveType.ALL_REDUCE, 4 << 20)
    unaware = run(tmp_path, traces, net, "analytical-unaware")
    packet = run(tmp_path, traces, net, "packet")
    assert packet.finish_ns > 1.1 * unaware.finish_ns
    most_queued = sorted(packet.links, key=lambda row: -row["max_queue_bytes"])[:8]
    assert all("->spine" in row["link"] for row in most_queued)  # 8 NPUs' traffic into 2 uplinks per leaf
    full = load_network(REPO / "configs" / "network" / "fat_tree_64.yml")
    assert all(row["max_queue"] <= 1 for row in run(tmp_path, collective(64, CollectiveType.ALL_REDUCE, 4 << 20),
                                                       full, "packet").links)


def test_cyclic_buffer_deadlock_without_virtual_channels_is_reported(tmp_path: Path) -> None:
    traces = collective(6, CollectiveType.ALL_TO_ALL, 1 << 20)
    system = {"all-to-all-implementation": ["direct"]}
    with pytest.raises(DeadlockError, match=r"deadlock in the packet network: .* set the packet section's "
                                            r"virtual_channels: hops .* or set flow_control: none"):
        run(tmp_path, traces, ring(6, buffer_bytes=4096, virtual_channels="none"), "packet", system)
    assert run(tmp_path, traces, ring(6, flow_control="none"), "packet", system).finish_ns > 0
    # a channel per hop: the same tiny buffers on the same cyclic routes cannot deadlock
    assert run(tmp_path, traces, ring(6, buffer_bytes=4096), "packet", system).finish_ns > 0


def test_packet_runs_are_deterministic(tmp_path: Path) -> None:
    net = load_network(REPO / "configs" / "network" / "dragonfly_72.yml")
    traces = collective(72, CollectiveType.ALL_REDUCE, 1 << 20)
    a = run(tmp_path, traces, net, "packet").to_json()
    b = run(tmp_path, traces, net, "packet").to_json()
    for d in (a, b):
        d.pop("run")
        d["config"].pop("workload")  # the two runs' trace folders
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_every_fabric_runs_with_every_backend(tmp_path: Path) -> None:
    for name in ("fat_tree_k8", "torus_4x4x4", "rail_optimized_4x8", "links_example"):
        net = load_network(REPO / "configs" / "network" / f"{name}.yml")
        traces = collective(net.num_npus, CollectiveType.ALL_REDUCE, 1 << 20)
        times = {b: run(tmp_path, traces, net, b).finish_ns for b in ("analytical-unaware", "analytical-aware",
                                                                      "packet")}
        # nothing beats ignoring congestion; store-and-forward of whole messages is slowest
        assert times["analytical-unaware"] <= times["packet"] <= times["analytical-aware"], (name, times)


def test_cli_statistics_timeline_and_wall_time_guard(tmp_path: Path) -> None:
    prefix = tmp_path / "inc" / "trace"
    prefix.parent.mkdir()
    for rank, nodes in enumerate(incast(4, 1 << 20)):
        write_trace_file(prefix.parent / f"trace.{rank}.et", nodes)
    network = str(REPO / "configs" / "network" / "ring_8.yml")
    switch = tmp_path / "switch4.yml"
    switch.write_text("topology: [Switch]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [500]\n")
    done = run_cli("--workload", str(prefix), "--network", str(switch), "--backend", "packet", "--packet-config",
                   str(REPO / "configs" / "packet" / "default.yml"), "--csv", str(tmp_path / "out"), "--json",
                   str(tmp_path / "r.json"), "--timeline", str(tmp_path / "t.json"))
    assert done.returncode == 0, done.stderr
    assert "switch0.0->npu0" in done.stdout and "paused" in done.stdout and "packet-hops" in done.stdout
    messages = (tmp_path / "out.messages.csv").read_text().splitlines()
    assert messages[0] == "src,dst,bytes,start_ns,end_ns,latency_ns" and len(messages) == 4
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["network"]["messages"] == 3 and result["complete"] is True
    assert result["config"]["network"]["packet"]["mtu_bytes"] == 4096
    timeline = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("ph") == "C" and "switch0.0->npu0" in e.get("name", "") for e in timeline["traceEvents"])

    big = tmp_path / "big" / "trace"
    write_rank_traces(str(big), collective(8, CollectiveType.ALL_REDUCE, 1 << 30))
    stopped = run_cli("--workload", str(big), "--network", network, "--backend", "packet", "--max-wall-time", "0.5",
                      "--json", str(tmp_path / "partial.json"))
    assert stopped.returncode == 3
    assert "stopped by --max-wall-time 0.5 s at " in stopped.stderr
    assert "stopped part-way:" in stopped.stdout and "busiest links" in stopped.stdout
    partial = json.loads((tmp_path / "partial.json").read_text())
    assert partial["complete"] is False and partial["network"]["packet_hops"] > 0


def test_symmetric_engine_refuses_the_packet_backend(tmp_path: Path) -> None:
    from workload.errors import InputError

    prefix = tmp_path / "ar" / "trace"
    write_rank_traces(str(prefix), collective(8, CollectiveType.ALL_REDUCE, 1 << 20))
    with pytest.raises(InputError, match="the packet backend simulates every message"):
        simulate(str(prefix), ring(8), backend="packet", engine="symmetric")


def test_analytical_aware_routes_fabrics_like_the_packet_backend(tmp_path: Path) -> None:
    net = load_network(REPO / "configs" / "network" / "fat_tree_64_oversubscribed.yml")
    traces = collective(64, CollectiveType.ALL_TO_ALL, 1 << 20)
    system = {"all-to-all-implementation": ["direct", "direct"]}
    aware = {row["link"]: row["bytes"] for row in run(tmp_path, traces, net, "analytical-aware", system).links}
    packet = {row["link"]: row["bytes"] for row in run(tmp_path, traces, net, "packet", system).links if row["bytes"]}
    assert aware == packet  # every message took the same path (per-flow ECMP), so every link carried the same bytes


def test_progress_line_estimates_the_work_left() -> None:
    from types import SimpleNamespace

    from simulator.simulation import RunMonitor, RunOptions

    ranks = [SimpleNamespace(feeder=SimpleNamespace(num_nodes=10, finished=f), finish_ns=None) for f in (2, 3)]
    backend = SimpleNamespace(tick=None, packet_hops=5_000_000)
    monitor = RunMonitor(ranks, 0.0, RunOptions(max_wall_time_s=1e9), SimpleNamespace(now=2_500_000), backend)
    assert backend.tick == monitor.check_backend
    line = monitor.line(10.0)
    assert line == ("simulated 2.500 ms, 25.0% of trace nodes done, 0/2 ranks finished, 500,000 packet-hops/s, "
                    "about 30 s left")
    # no progress since: no estimate (a number that does not move with the run is worse than none)
    assert monitor.line(20.0).endswith("no trace node finished in the last 10 s, so no estimate of the time left")
    ranks[0].feeder.finished = 14  # fast lately: the recent pace and the whole run's disagree, so a range
    assert monitor.line(30.0).endswith("between 3 and 5 s left (the pace varies)")
    assert not monitor.check(1)
    monitor.deadline = 0.0
    assert monitor.check(2) and monitor.expired
    assert monitor.stop_message().startswith("stopped by --max-wall-time 1e+09 s at 2500000 ns of simulated time, "
                                             "17 of 20 trace nodes done")


def test_progress_pace_counts_from_the_first_event_and_times_read_in_their_unit() -> None:
    """Building a large workload before the first event took seconds and made the first estimate 20x too long
    (11,248 s left for a 500 s run): the pace counts from the first event; simulated time reads 12.210 s, not
    12209.631 ms."""
    from types import SimpleNamespace

    from simulator.simulation import RunMonitor, RunOptions

    ranks = [SimpleNamespace(feeder=SimpleNamespace(num_nodes=10, finished=f), finish_ns=None) for f in (2, 3)]
    env = SimpleNamespace(now=12_209_631_000)
    monitor = RunMonitor(ranks, 0.0, RunOptions(), env, SimpleNamespace(), 8.0)
    assert monitor.line(10.0) == "simulated 12.210 s, 25.0% of trace nodes done, 0/2 ranks finished, about 6 s left"


def test_progress_counts_the_phases_of_collectives_under_way(tmp_path: Path) -> None:
    """A run of one big collective per rank still shows its progress: the chunks' phases done so far."""
    from simulator.simulation import RunMonitor

    write_rank_traces(str(tmp_path / "t"), collective(8, CollectiveType.ALL_REDUCE, 16 << 20))
    net = ring(8, mtu_bytes=64, buffer_bytes=1 << 20)  # many packets: the packet loop checks in every 65,536
    sim = Simulation(resolve_workload(str(tmp_path / "t")), net, system_from_dict(default_system_dict(1)),
                     MemoryConfig(), {}, RunOptions(backend="packet", progress=True, max_wall_time_s=1e9))
    shares = []
    real_check = RunMonitor.check

    def spy(monitor: RunMonitor, events: int) -> bool:
        shares.append(sum(w.feeder.finished for w in monitor.ranks) + monitor._collectives_under_way())
        return real_check(monitor, events)

    RunMonitor.check = spy  # type: ignore[method-assign]
    try:
        sim.run()
    finally:
        RunMonitor.check = real_check  # type: ignore[method-assign]
    assert shares == sorted(shares)  # the work done only grows
    assert any(0 < share < 8 for share in shares)  # seen part way through the 8 ranks' one node each


def test_packet_parameters_sweep(tmp_path: Path) -> None:
    from simulator.sweep.spec import load_sweep
    from simulator.sweep.worker import run_point

    sweep = load_sweep(str(REPO / "configs" / "sweeps" / "fat_tree_packets.yaml"))
    assert len(sweep.points) == 36
    slow, fast = sweep.points[0], sweep.points[-1]  # 1 spine, 1 KiB packets, 64 KiB buffers; 8 spines, 9000, 1 MiB
    assert slow.run is not None and slow.run["network"]["packet"] == {"mtu_bytes": 1024, "buffer_bytes": "64KiB"}
    times = [run_point(p.run, p.root, p.sources)["metrics"]["finish_ns"] for p in (slow, fast)]
    assert times[0] > 2 * times[1]


@pytest.mark.parametrize(("groups", "routers", "npus_per_router", "global_links"), [(3, 2, 1, 1), (5, 2, 2, 2)])
def test_dragonfly_credits_need_a_virtual_channel_per_hop(tmp_path: Path, groups: int, routers: int,
                                                         npus_per_router: int, global_links: int) -> None:
    """Minimal dragonfly routes (local, global, local) make cyclic buffer waits: with one FIFO per port tiny
    buffers deadlock, as a switch without virtual channels does; a channel per hop never does."""
    def dragonfly(channels: str) -> Any:
        return network_from_dict({"fabric": "dragonfly", "routers_per_group": routers,
                                  "npus_per_router": npus_per_router, "global_links_per_router": global_links,
                                  "groups": groups,
                                  "bandwidth": {"terminal": 100, "local": 100, "global": 50},
                                  "latency": {"terminal": 100, "local": 200, "global": 1000},
                                  "packet": {"buffer_bytes": 8192, "virtual_channels": channels}})
    n = dragonfly("none").num_npus
    traces = collective(n, CollectiveType.ALL_TO_ALL, 1 << 20)
    system = {"all-to-all-implementation": ["direct"] * dragonfly("none").num_dims}
    with pytest.raises(DeadlockError, match="virtual_channels: hops"):
        run(tmp_path, traces, dragonfly("none"), "packet", system)
    assert run(tmp_path, traces, dragonfly("hops"), "packet", system).finish_ns > 0
