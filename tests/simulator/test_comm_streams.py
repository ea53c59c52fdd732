"""--comm-streams: ASTRA-sim's one communication node in flight per rank (the default) or one per communicator
(a collective's group, a send's peer), as NCCL runs each communicator on its own CUDA stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.collectives.nccl import SEND_RECV, Communicator
from simulator.node_table import COMM_LANE, NUM_LANES, communicator_lanes, node_table
from simulator.simulation import RunOptions
from tests.conftest import run_cli, simulate, simulation, write_trace_file
from tests.simulator.test_nccl_run import AR, MODEL, MiB, coll, comp, plan_ns, recv, send, switch
from workload.errors import InputError
from workload.reader import read_trace

NCCL = {"collective_model": "nccl", "hw_profile": "hgx-h200"}
GROUPS = {1: (0, 1), 2: (0, 2)}


def late_partner() -> list[list[object]]:
    """Rank 0 all-reduces with rank 1 (which joins after 1 ms of compute), then with rank 2 (ready at once)."""
    size = MiB
    return [[coll(1, AR, size, pg_name="1"), coll(2, AR, size, pg_name="2")],
            [comp(1, 1000), coll(2, AR, size, [1], pg_name="1")],
            [coll(1, AR, size, pg_name="2")]]


def test_default_is_one_stream_as_astra_sim() -> None:
    assert RunOptions().comm_streams == "single"


def test_one_stream_holds_a_ready_collective_behind_a_waiting_one(tmp_path: Path) -> None:
    t = plan_ns("all_reduce", MiB, (0, 1))
    result = simulate(tmp_path, late_partner(), switch(3), groups=GROUPS, **NCCL)
    # rank 0's second all-reduce waits for the first, which waits 1 ms for rank 1
    assert result.ranks[2].finish_ns == 1_000_000 + 2 * t


def test_communicator_streams_run_collectives_of_other_groups_beside_each_other(tmp_path: Path) -> None:
    t = plan_ns("all_reduce", MiB, (0, 1))
    assert t < 1_000_000
    result = simulate(tmp_path, late_partner(), switch(3), groups=GROUPS, comm_streams="communicator", **NCCL)
    assert result.ranks[2].finish_ns == t  # group 2 ran at once, while group 1 waited for rank 1
    assert result.ranks[0].finish_ns == result.ranks[1].finish_ns == 1_000_000 + t


def test_collectives_of_one_communicator_stay_in_order(tmp_path: Path) -> None:
    size = 64 * MiB
    t = plan_ns("all_reduce", size, range(2))
    traces = [[coll(1, AR, size, pg_name="1"), coll(2, AR, size, pg_name="1")]] * 2
    sim, result = simulation(tmp_path, traces, switch(2), groups={1: (0, 1)}, comm_streams="communicator", **NCCL)
    assert set(r.finish_ns for r in result.ranks) == {2 * t}
    log = sim.workloads[0].collective_log
    assert [(c.start_ns, c.end_ns) for c in log] == [(0, t), (t, 2 * t)]


def test_a_send_runs_beside_a_collective_of_another_communicator(tmp_path: Path) -> None:
    """Rank 0 sends to rank 2 while it all-reduces with rank 1 (late): the send need not wait."""
    size = MiB
    p2p = MODEL.plan(SEND_RECV, size, Communicator.of((0, 2), 8)).time_ns
    traces = [[coll(1, AR, size, pg_name="1"), send(2, 2, size)],
              [comp(1, 1000), coll(2, AR, size, [1], pg_name="1")],
              [recv(1, 0, size)]]
    one = simulate(tmp_path, traces, switch(3), groups={1: (0, 1)}, **NCCL)
    many = simulate(tmp_path, traces, switch(3), groups={1: (0, 1)}, comm_streams="communicator", **NCCL)
    assert one.ranks[2].finish_ns > 1_000_000
    assert many.ranks[2].finish_ns == p2p


def test_lanes_by_communicator(tmp_path: Path) -> None:
    nodes = [coll(1, AR, MiB, pg_name="3"), send(2, 1, MiB), coll(3, AR, MiB, pg_name="4"), send(4, 1, MiB),
             coll(5, AR, MiB, pg_name="3"), coll(6, AR, MiB), recv(7, 1, MiB), comp(8, 5)]
    graph = read_trace(str(write_trace_file(tmp_path / "t.0.et", nodes)))
    lanes, count = communicator_lanes(node_table(graph))
    first = NUM_LANES
    assert lanes[:6] == [first, first + 1, first + 2, first + 1, first, COMM_LANE]
    assert count == NUM_LANES + 3
    assert lanes[6:] == node_table(graph).lanes[6:]  # receives and compute keep ASTRA-sim's lanes


def test_an_unknown_value_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown communication streams 'many'; valid: single, communicator"):
        simulate(tmp_path, [[comp(1, 1)]] * 2, switch(2), comm_streams="many")


def test_cli_flag(tmp_path: Path) -> None:
    folder = tmp_path / "w"
    folder.mkdir()
    for rank, nodes in enumerate(late_partner()):
        write_trace_file(folder / f"trace.{rank}.et", nodes)
    (tmp_path / "n.json").write_text(json.dumps(switch(3)))
    (tmp_path / "g.json").write_text(json.dumps({str(k): list(v) for k, v in GROUPS.items()}))
    finish = {}
    for streams in ("single", "communicator"):
        out = tmp_path / f"{streams}.json"
        done = run_cli("--workload", str(folder / "trace"), "--network", str(tmp_path / "n.json"),
                       "--comm-groups", str(tmp_path / "g.json"), "--collective-model", "nccl", "--hw-profile",
                       "hgx-h200", "--comm-streams", streams, "--json", str(out), "--quiet")
        assert done.returncode == 0, done.stderr
        finish[streams] = [r["finish_ns"] for r in json.loads(out.read_text())["ranks"]]
    assert finish["communicator"][2] < finish["single"][2]
    bad = run_cli("--workload", str(folder / "trace"), "--network", str(tmp_path / "n.json"), "--comm-streams", "x")
    assert bad.returncode != 0 and "--comm-streams" in bad.stderr and "Traceback" not in bad.stderr
