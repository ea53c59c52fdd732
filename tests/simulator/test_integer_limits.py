"""Tags, durations and sizes at the limits of their protobuf types: exact times or clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.node_table import MAX_DURATION_MICROS
from tests.conftest import finish_times, run_cli, simulate, write_trace_file
from workload.errors import InputError
from workload.schema import NodeType
from workload.writer import make_node

INT64_MAX = 2**63 - 1
RING4 = {"topology": ["Ring"], "npus_count": [4], "bandwidth": [50.0], "latency": [500.0]}
BPNS = 50.0 * (1 << 30) / 1e9


def send(node_id: int, dst: int, size: int, tag: int, deps: list[int] | None = None) -> object:
    return make_node(node_id, f"s{node_id}", NodeType.COMM_SEND_NODE, data_deps=deps or [],
                     attrs=[("comm_dst", dst), ("comm_size", size), ("comm_tag", "int64_val", tag)])


def recv(node_id: int, src: int, size: int, tag: int, deps: list[int] | None = None) -> object:
    return make_node(node_id, f"r{node_id}", NodeType.COMM_RECV_NODE, data_deps=deps or [],
                     attrs=[("comm_src", src), ("comm_size", size), ("comm_tag", "int64_val", tag)])


def comp(node_id: int, micros: int, deps: list[int] | None = None) -> object:
    return make_node(node_id, f"p{node_id}", NodeType.COMP_NODE, data_deps=deps or [], duration_micros=micros)


@pytest.mark.parametrize("late_tag", [500_000_005, 1_000_000_005, 2**32 + 5, INT64_MAX - 2])
def test_a_receive_never_matches_a_send_of_another_tag(tmp_path: Path, late_tag: int) -> None:
    # rank 0 sends tag 5 at once and `late_tag` after 3 ms; rank 1 first waits for `late_tag`
    size = 1 << 20
    traces = [[send(0, 1, size, 5), comp(1, 3000), send(2, 1, size, late_tag, [1])],
              [recv(0, 0, size, late_tag), recv(1, 0, size, 5, [0])]]
    result = simulate(tmp_path, traces, {**RING4, "npus_count": [2]})
    message_ns = int(500 + size / BPNS)
    assert finish_times(result)[1] == 3_000_000 + message_ns  # not before the late send exists


def test_the_longest_representable_durations_add_up_exactly(tmp_path: Path) -> None:
    chain = [comp(0, MAX_DURATION_MICROS)] + [comp(i, MAX_DURATION_MICROS, [i - 1]) for i in range(1, 8)]
    result = simulate(tmp_path, [chain, [comp(0, 1)]], {**RING4, "npus_count": [2]})
    assert finish_times(result)[0] == 8 * MAX_DURATION_MICROS * 1000  # beyond 2**64: Python integers stay exact
    assert result.ranks[0].compute_ns == 8 * MAX_DURATION_MICROS * 1000


@pytest.mark.parametrize("micros", [MAX_DURATION_MICROS + 1, 2**62, 2**63, 2**64 - 1])
def test_a_duration_beyond_the_representable_is_an_error_naming_the_node(tmp_path: Path, micros: int) -> None:
    with pytest.raises(InputError, match=r"rank 0.*node 7.*duration_micros"):
        simulate(tmp_path, [[comp(7, micros)], [comp(0, 1)]], {**RING4, "npus_count": [2]})


def test_the_largest_collective_ends_with_the_streams_astra_sim_waits_for(tmp_path: Path) -> None:
    # 2**63-1 bytes in 4 splits: chunks of (2**63-1)//4 and a 3-byte remainder. ASTRA-sim's loop makes a fifth
    # stream but its DataSet waits for ceil((double) size / chunk) = 4 of them, so the time is that of 4 chunks.
    def all_reduce(size: int) -> object:
        return make_node(0, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0, "comm_size": size})

    system = {"preferred-dataset-splits": 4}
    huge = simulate(tmp_path, [[all_reduce(INT64_MAX)]] * 4, RING4, system)
    exact = simulate(tmp_path, [[all_reduce(4 * (INT64_MAX // 4))]] * 4, RING4, system)
    assert finish_times(huge) == finish_times(exact)
    assert huge.finish_ns > 0


@pytest.mark.parametrize("attr", ["comm_size", "comm_tag"])
def test_values_beyond_int64_are_refused(tmp_path: Path, attr: str) -> None:
    attrs: list[tuple[object, ...]] = [("comm_dst", 1), ("comm_size", 1024), ("comm_tag", 1)]
    attrs = [(name, "uint64_val", 2**64 - 1) if name == attr else (name, value) for name, value in attrs]
    node = make_node(0, "s", NodeType.COMM_SEND_NODE, attrs=attrs)
    with pytest.raises(InputError, match=attr):
        simulate(tmp_path, [[node], [recv(0, 0, 1024, 1)]], {**RING4, "npus_count": [2]})


def test_huge_times_reach_the_json_output_exactly(tmp_path: Path) -> None:
    trace = tmp_path / "t"
    trace.mkdir()
    for rank in range(2):
        write_trace_file(trace / f"trace.{rank}.et", [comp(0, MAX_DURATION_MICROS), comp(1, MAX_DURATION_MICROS, [0])])
    network = tmp_path / "net.yml"
    network.write_text(json.dumps({**RING4, "npus_count": [2]}))
    out = tmp_path / "out.json"
    run = run_cli("--workload", str(trace / "trace"), "--network", str(network), "--json", str(out), "--quiet")
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["finish_ns"] == 2 * MAX_DURATION_MICROS * 1000
