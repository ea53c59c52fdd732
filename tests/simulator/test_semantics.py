"""Workload and system semantics against numbers derived by hand from the ASTRA-sim 2.x contract."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.simulation import DeadlockError
from tests.conftest import finish_times, simulate
from workload.errors import InputError
from workload.schema import NodeType
from workload.writer import make_node

BPNS = 50.0 * (1 << 30) / 1e9  # 50 GB/s in bytes per ns
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def coll(node_id: int, comm_type: int, size: int, deps: list[int] | None = None, **attrs: object) -> object:
    return make_node(node_id, f"c{node_id}", NodeType.COMM_COLL_NODE, data_deps=deps or [],
                     attrs={"comm_type": comm_type, "comm_size": size, **attrs})


def comp(node_id: int, micros: int, deps: list[int] | None = None, **attrs: object) -> object:
    return make_node(node_id, f"p{node_id}", NodeType.COMP_NODE, data_deps=deps or [], duration_micros=micros,
                     attrs=attrs)


def ring_formula(kind: str, n: int, size: int, endpoint: int, latency: float, mem_bw_GBps: float) -> int:
    """The spec's uncontended one-chunk ring times."""
    msg = size if kind == "ag" else size // n
    link = int(latency + msg / BPNS)
    reduction = 3 * int(msg / (mem_bw_GBps * 1e9) * 1e9)
    if kind == "ar":
        return 2 * (n - 1) * link + (2 * n - 1) * endpoint + (n - 1) * reduction
    if kind == "rs":
        return (n - 1) * link + n * endpoint + (n - 1) * reduction
    if kind == "ag":
        return (n - 1) * link + n * endpoint
    steps = n * (n - 1) // 2
    return steps * link + (steps + 1) * endpoint


@SLOW
@given(kind=st.sampled_from(["ar", "rs", "ag", "a2a"]), n=st.integers(2, 12), pieces=st.integers(1, 5000),
       endpoint=st.integers(0, 40), latency=st.sampled_from([0.0, 1.0, 500.0, 17.5]))
def test_one_chunk_ring_matches_the_closed_form(tmp_path: Path, kind: str, n: int, pieces: int, endpoint: int,
                                                 latency: float) -> None:
    size = n * pieces
    code = {"ar": 0, "rs": 7, "ag": 2, "a2a": 6}[kind]
    result = simulate(tmp_path, [[coll(1, code, size)]] * n,
                      {"topology": ["Ring"], "npus_count": [n], "bandwidth": [50.0], "latency": [latency]},
                      {"preferred-dataset-splits": 1, "endpoint-delay": endpoint, "local-mem-bw": 1600})
    assert set(finish_times(result)) == {ring_formula(kind, n, size, endpoint, latency, 1600)}


@SLOW
@given(n=st.sampled_from([4, 8]), size=st.integers(1 << 6, 1 << 20).map(lambda k: 32 * k), factor=st.integers(2, 8),
       backend=st.sampled_from(["analytical-unaware", "analytical-aware"]),
       topology=st.sampled_from(["Ring", "Switch", "FullyConnected"]), algorithm=st.sampled_from(["ring", "direct"]))
def test_time_grows_with_size_and_shrinks_with_bandwidth(tmp_path: Path, n: int, size: int, factor: int,
                                                         backend: str, topology: str, algorithm: str) -> None:
    def run(bytes_: int, bandwidth: float) -> int:
        net = {"topology": [topology], "npus_count": [n], "bandwidth": [bandwidth], "latency": [500.0]}
        system = {"all-reduce-implementation": [algorithm]}
        return simulate(tmp_path, [[coll(1, 0, bytes_)]] * n, net, system, backend=backend).finish_ns

    # (sizes are whole multiples of splits x NPUs: otherwise ASTRA-sim's extra full-size chunk stream can make a
    # slightly larger collective faster, see test_chunks_carry_a_full_chunk...)
    base = run(size, 50.0)
    assert run(size * factor, 50.0) >= base
    assert run(size, 50.0 * factor) <= base


def test_chunks_carry_a_full_chunk_even_when_the_size_does_not_divide(tmp_path: Path) -> None:
    # 1,000,003 B in 4 splits is 5 streams of 250,000 B, one after another; 1,000,000 B is 4 of them
    odd = simulate(tmp_path, [[coll(1, 0, 1_000_003)]] * 4)
    even = simulate(tmp_path, [[coll(1, 0, 1_000_000)]] * 4)
    assert odd.finish_ns * 4 == even.finish_ns * 5


def test_compute_overlaps_communication_but_not_other_compute(tmp_path: Path) -> None:
    alone = simulate(tmp_path, [[coll(1, 0, 1 << 20)]] * 4).finish_ns
    both = simulate(tmp_path, [[comp(1, 10), coll(2, 0, 1 << 20)]] * 4)
    r = both.ranks[0]
    assert r.finish_ns == max(alone, 10_000) and r.compute_ns == 10_000
    assert r.overlap_ns == min(alone, 10_000) and r.exposed_comm_ns == r.finish_ns - 10_000
    serial = simulate(tmp_path, [[comp(1, 10), comp(2, 10)]] * 4)
    assert finish_times(serial) == [20_000] * 4


def test_collectives_on_one_rank_run_one_at_a_time(tmp_path: Path) -> None:
    one = simulate(tmp_path, [[coll(1, 0, 1 << 20)]] * 4).finish_ns
    two = simulate(tmp_path, [[coll(1, 0, 1 << 20), coll(2, 0, 1 << 20)]] * 4).finish_ns
    assert two == 2 * one


def test_zero_duration_compute_takes_one_ns(tmp_path: Path) -> None:
    assert finish_times(simulate(tmp_path, [[comp(1, 0), comp(2, 0, [1])]] * 2)) == [2, 2]


def send(node_id: int, dst: int, size: int, tag: int, deps: list[int] | None = None) -> object:
    return make_node(node_id, "s", NodeType.COMM_SEND_NODE, data_deps=deps or [],
                     attrs={"comm_dst": dst, "comm_size": size, "comm_tag": tag})


def recv(node_id: int, src: int, size: int, tag: int, deps: list[int] | None = None) -> object:
    return make_node(node_id, "r", NodeType.COMM_RECV_NODE, data_deps=deps or [],
                     attrs={"comm_src": src, "comm_size": size, "comm_tag": tag})


def test_send_and_receive_complete_when_the_data_arrives(tmp_path: Path) -> None:
    size = 1 << 20
    link = int(500 + size / BPNS)
    late_recv = [[send(1, 1, size, 5)], [comp(1, 100), recv(2, 0, size, 5, [1])]]
    result = simulate(tmp_path, late_recv, {"topology": ["Ring"], "npus_count": [2], "bandwidth": [50.0],
                                            "latency": [500.0]})
    assert finish_times(result) == [link, 100_000]  # the receive posted after arrival completes at once


def test_tags_match_sends_to_receives(tmp_path: Path) -> None:
    size = 4096
    traces = [[send(1, 1, size, 7), send(2, 1, size * 100, 8)],
              [recv(1, 0, size * 100, 8), recv(2, 0, size, 7, [1])]]
    result = simulate(tmp_path, traces, {"topology": ["Ring"], "npus_count": [2], "bandwidth": [50.0],
                                         "latency": [500.0]})
    big = int(500 + size * 100 / BPNS)
    assert result.ranks[1].finish_ns == int(500 + size / BPNS) + big  # sends run one at a time


def test_rendezvous_adds_a_reverse_handshake(tmp_path: Path) -> None:
    traces = [[send(1, 1, 1 << 20, 1)], [recv(1, 0, 1 << 20, 1)]]
    net = {"topology": ["Ring"], "npus_count": [2], "bandwidth": [50.0], "latency": [500.0]}
    plain = simulate(tmp_path, traces, net).finish_ns
    handshake = simulate(tmp_path, traces, net, rendezvous=True).finish_ns
    assert handshake - plain == int(500 + 8192 / BPNS)


@pytest.mark.parametrize("memory,expected", [
    ({"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-latency": 100, "remote-mem-bw": 10},
     [100 + 1000] * 4),
    ({"memory-type": "MEMORY_POOL", "remote-mem-latency": 100, "remote-mem-bw": 10}, [1100, 2200, 3300, 4400]),
    ({"memory-type": "PER_NODE_MEMORY_EXPANSION", "num-nodes": 2, "num-npus-per-node": 2, "remote-mem-latency": 100,
      "remote-mem-bw": 10}, [1100, 2200, 1100, 2200]),
])
def test_remote_memory_channels(tmp_path: Path, memory: dict, expected: list[int]) -> None:
    load = [make_node(1, "ld", NodeType.MEM_LOAD_NODE, attrs={"tensor_size": 10_000})]
    assert finish_times(simulate(tmp_path, [load] * 4, memory=memory)) == expected


def test_memory_nodes_need_an_expansion(tmp_path: Path) -> None:
    load = [make_node(1, "ld", NodeType.MEM_STORE_NODE, attrs={"tensor_size": 10})]
    with pytest.raises(InputError, match="NO_MEMORY_EXPANSION"):
        simulate(tmp_path, [load] * 2)


def test_roofline_time_and_device_presets(tmp_path: Path) -> None:
    k = comp(1, 0, num_ops=10**9, tensor_size=10**6)  # intensity 1000: compute bound
    m = comp(2, 0, [1], num_ops=10**8, tensor_size=10**8)  # intensity 1: memory bound
    system = {"roofline-enabled": 1, "peak-perf": 900, "local-mem-bw": 1600}
    assert finish_times(simulate(tmp_path, [[k, m]] * 2, system=system)) == [1111 + 62500] * 2
    h100 = simulate(tmp_path, [[k, m]] * 2, system=system, device="H100")
    assert h100.finish_ns == int(1e9 / 989.4e12 * 1e9) + int(1e8 / 3350e9 * 1e9)


def test_roofline_needs_its_attributes(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="num_ops"):
        simulate(tmp_path, [[comp(1, 5)]] * 2, system={"roofline-enabled": 1, "peak-perf": 900})


def test_replay_only_times_every_node_by_its_duration(tmp_path: Path) -> None:
    ar = make_node(1, "ar", NodeType.COMM_COLL_NODE, duration_micros=7, attrs={"comm_type": 0, "comm_size": 1 << 30})
    result = simulate(tmp_path, [[ar, comp(2, 3, [1])]] * 4, system={"replay-only": 1})
    assert finish_times(result) == [10_000] * 4


def test_broadcast_is_replayed(tmp_path: Path) -> None:
    bc = make_node(1, "bc", NodeType.COMM_COLL_NODE, duration_micros=5, attrs={"comm_type": 5, "comm_size": 64})
    assert finish_times(simulate(tmp_path, [[bc]] * 2)) == [5000, 5000]


def test_children_of_invalid_nodes_wait_for_the_next_event_like_astra_sim(tmp_path: Path) -> None:
    # 0: comp 5 µs -> 1: INVALID -> 2: comp 1 µs, while 3: comp 20 µs... no: 3 is a long collective-free chain
    nodes = [comp(0, 5), make_node(1, "inv", NodeType.INVALID_NODE, data_deps=[0]), comp(2, 1, [1]),
             make_node(3, "cpu", NodeType.COMP_NODE, duration_micros=20, attrs={"is_cpu_op": True})]
    reference = simulate(tmp_path, [nodes] * 2)
    corrected = simulate(tmp_path, [nodes] * 2, semantics="corrected")
    assert finish_times(reference) == [21_000] * 2  # node 2 starts when the CPU node ends, at 20 µs
    assert finish_times(corrected) == [20_000] * 2  # node 2 starts at once, at 5 µs


def test_a_trace_whose_only_root_is_invalid_still_finishes_with_a_warning(tmp_path: Path) -> None:
    warnings: list[str] = []
    nodes = [make_node(1, "inv", NodeType.INVALID_NODE), comp(2, 3, [1])]
    result = simulate(tmp_path, [nodes] * 2, warn=warnings.append)
    assert finish_times(result) == [3000, 3000]
    assert any("would stall in ASTRA-sim" in w for w in warnings)


def test_process_groups_from_a_metadata_node(tmp_path: Path) -> None:
    import json
    groups = json.dumps([{"pg_name": "3", "ranks": [0, 1]}, {"pg_name": "4", "ranks": [2, 3]}])
    meta = make_node(0, "pg", NodeType.METADATA_NODE, inputs={"values": str([groups]), "shapes": "", "types": ""})
    traces = [[meta, coll(1, 0, 1 << 20, [0], pg_name=str(3 + r // 2))] for r in range(4)]
    from_metadata = simulate(tmp_path, traces)
    plain = [[comp(0, 0), coll(1, 0, 1 << 20, [0], pg_name=str(3 + r // 2))] for r in range(4)]
    from_json = simulate(tmp_path, plain, groups={3: (0, 1), 4: (2, 3)}, semantics="corrected")
    assert finish_times(from_metadata) == [t - 1 for t in finish_times(from_json)]  # the stand-in node took 1 ns


def test_comm_group_collective_uses_only_its_members(tmp_path: Path) -> None:
    traces = [[coll(1, 0, 1 << 20, pg_name="1")], [coll(1, 0, 1 << 20, pg_name="1")], [comp(1, 1)], [comp(1, 1)]]
    result = simulate(tmp_path, traces, groups={1: (0, 1)})
    assert finish_times(result)[2:] == [1000, 1000] and result.ranks[0].finish_ns > 1000


def test_a_group_that_runs_as_a_ring_instead_of_the_configured_algorithms_says_so(tmp_path: Path) -> None:
    """On several dimensions a group of fewer than all NPUs runs one ring, as ASTRA-sim: the system's [direct,
    direct] then changes nothing (compare --workload showed ring and direct equal to the ns), and now says so."""
    net = {"topology": ["Switch", "Switch"], "npus_count": [2, 2], "bandwidth": [100.0, 25.0],
           "latency": [500.0, 500.0]}
    traces = [[coll(1, 0, 1 << 20, pg_name="1" if r < 2 else "2")] for r in range(4)]
    finishes, said = [], []
    for impl in ("ring", "direct"):
        warnings: list[str] = []
        result = simulate(tmp_path, traces, net, {"all-reduce-implementation": [impl, impl]},
                          groups={1: (0, 1), 2: (2, 3)}, warn=warnings.append)
        finishes.append(finish_times(result))
        said.append([w for w in warnings if "ran as one ring over the group's members" in w])
    assert finishes[0] == finishes[1]  # ASTRA-sim's numbers, unchanged
    assert not said[0] and len(said[1]) == 1 and "'all-reduce-implementation' ['direct', 'direct']" in said[1][0]
    warnings = []
    simulate(tmp_path, [[coll(1, 0, 1 << 20)]] * 4, net, {"all-reduce-implementation": ["direct", "direct"]},
             warn=warnings.append)
    assert not any("one ring" in w for w in warnings)  # a collective over all NPUs runs the configured algorithms


@pytest.mark.parametrize("problem,traces,pattern", [
    ("missing collective", [[coll(1, 0, 4096)]] * 3 + [[comp(1, 1)]], "rank 0 .* waits"),
    ("receive without send", [[comp(1, 1)], [recv(1, 0, 64, 3)]], "rank 1 .* waits for a send from rank 0 with tag 3"),
    ("size mismatch", [[send(1, 1, 64, 3)], [recv(1, 0, 65, 3)]], "waits for a send from rank 0"),
])
def test_deadlocks_are_reported_per_rank(tmp_path: Path, problem: str, traces: list, pattern: str) -> None:
    with pytest.raises(DeadlockError, match=pattern) as info:
        simulate(tmp_path, traces, engine="message")
    assert "deadlock" in str(info.value)


def test_a_deadlock_of_rendezvous_sends_says_what_the_sends_wait_for(tmp_path: Path) -> None:
    """Two ranks that each send before receiving finish with eager sends and wait for ever with
    --rendezvous-protocol; the report named the sends but not what they wait for, and advised checking tags and
    sizes, which match (interleaved 1F1B traces with tensor parallelism end this way)."""
    traces = [[send(1, 1 - r, 1 << 20, 5), recv(2, 1 - r, 1 << 20, 5, [1])] for r in range(2)]
    assert min(finish_times(simulate(tmp_path, traces, engine="message"))) > 0
    with pytest.raises(DeadlockError) as info:
        simulate(tmp_path, traces, engine="message", rendezvous=True)
    text = str(info.value)
    assert "node 1 ('s', COMM_SEND_NODE) waits for rank 1 to post its receive (tag 5)" in text
    assert "ranks that each send to the other before receiving wait for ever" in text


@pytest.mark.parametrize("traces,system,groups,pattern", [
    ([[coll(1, 0, 64, pg_name="9")]] * 2, {}, {}, "communicator group 9 is not defined"),
    ([[coll(1, 0, 64, pg_name="1")]] * 2, {}, {1: (1,)}, "does not include it"),
    ([[coll(1, 1, 64)]] * 2, {}, {}, "REDUCE is not supported"),
    ([[make_node(1, "s", NodeType.COMM_SEND_NODE, attrs={"comm_src": 1, "comm_dst": 0, "comm_size": 8,
                                                         "comm_tag": 1})]] * 2, {}, {}, "may only send its own"),
    ([[coll(1, 6, 64)]] * 2, {"all-to-all-implementation": ["halvingDoubling"]}, {}, "does not implement all-to-all"),
    ([[coll(1, 2, 64)]] * 2, {"all-gather-implementation": ["doubleBinaryTree"]}, {}, "does not implement all-gather"),
])
def test_bad_workloads_are_named_errors(tmp_path: Path, traces: list, system: dict, groups: dict,
                                        pattern: str) -> None:
    with pytest.raises(InputError, match=pattern):
        simulate(tmp_path, traces, system=system, groups=groups)


def test_rescued_ranks_do_not_hide_a_deadlock_elsewhere(tmp_path: Path) -> None:
    stalls = [make_node(1, "inv", NodeType.INVALID_NODE), comp(2, 3, [1])]
    with pytest.raises(DeadlockError, match=r"rank 1 .* waits for a send from rank 0"):
        simulate(tmp_path, [stalls, [recv(1, 0, 64, 3)]], engine="message")


def test_a_short_involved_dim_leaves_the_missing_dimensions_out(tmp_path: Path) -> None:
    """ASTRA-sim reads past a short involved_dim list: the dimensions it does not name are not involved (its
    2.0-era example, [true] on Ring x FullyConnected x Switch, prints 2,780 ns, as [true, false, false] does)."""
    network = {"topology": ["Ring", "FullyConnected", "Switch"], "npus_count": [2, 2, 2],
               "bandwidth": [50.0, 50.0, 50.0], "latency": [500.0, 500.0, 500.0]}

    def run(involved: list[bool]) -> tuple[list[int], list[str]]:
        warnings: list[str] = []
        node = make_node(1, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0, "comm_size": 1 << 20,
                                                                 "involved_dim": involved})
        result = simulate(tmp_path, [[node]] * 8, network, {"all-reduce-implementation": ["ring"] * 3},
                          warn=warnings.append)
        return finish_times(result), warnings

    short, warned = run([True])
    explicit, quiet = run([True, False, False])
    assert short == explicit and short != run([True, True, True])[0]
    assert any("names fewer dimensions than the network's 3" in w for w in warned)
    assert not any("fewer dimensions" in w for w in quiet)


def test_astra_sims_one_collective_example_on_ring_fullyconnected_switch(tmp_path: Path) -> None:
    """ASTRA-sim's 2.0-era example (inputs/workload/ASTRA-sim-2.0/onecomm_allreduce: 64 ranks, one 64 KiB
    all-reduce with involved_dim [true], on its Ring x FullyConnected x Switch network and system files):
    ASTRA-sim 2.x prints 2,780 ns."""
    node = make_node(512, "ALL_REDUCE", NodeType.COMM_COLL_NODE,
                     attrs={"is_cpu_op": False, "comm_type": 0, "comm_size": 65536, "involved_dim": [True]})
    network = {"topology": ["Ring", "FullyConnected", "Switch"], "npus_count": [2, 8, 4],
               "bandwidth": [200.0, 100.0, 50.0], "latency": [50.0, 500.0, 2000.0]}
    system = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
              "preferred-dataset-splits": 4, "all-reduce-implementation": ["ring", "direct", "halvingDoubling"],
              "collective-optimization": "localBWAware", "local-mem-bw": 50}
    assert set(finish_times(simulate(tmp_path, [[node]] * 64, network, system, warn=lambda _: None))) == {2780}
