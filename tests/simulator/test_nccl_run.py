"""--collective-model nccl: collectives and sends/receives timed by the NCCL-like model inside the event-driven
run (rendezvous, latency then a shared transfer, the library's choice recorded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simulator.collectives.hardware import PROFILES_DIR, load_profile
from simulator.collectives.nccl import SEND_RECV, CollectiveModel, Communicator
from simulator.engine import Engine
from simulator.nccl_run import NcclRun
from simulator.sweep.spec import load_sweep
from simulator.sweep.worker import run_point
from tests.conftest import REPO, finish_times, run_cli, simulate, simulation
from tests.sweep.test_spec import write_sweep
from workload.errors import InputError
from workload.schema import NodeType
from workload.writer import make_node

PROFILE = "hgx-h200"
MODEL = CollectiveModel(load_profile(PROFILE))
NCCL = {"collective_model": "nccl", "hw_profile": PROFILE}
AR, AG, RS, A2A = 0, 2, 7, 6
MiB = 1 << 20


def coll(node_id: int, comm_type: int, size: int, deps: list[int] | None = None, **attrs: object) -> object:
    return make_node(node_id, f"c{node_id}", NodeType.COMM_COLL_NODE, data_deps=deps or [],
                     attrs={"comm_type": comm_type, "comm_size": size, **attrs})


def comp(node_id: int, micros: int, deps: list[int] | None = None) -> object:
    return make_node(node_id, f"p{node_id}", NodeType.COMP_NODE, data_deps=deps or [], duration_micros=micros)


def send(node_id: int, dst: int, size: int, tag: int = 5) -> object:
    return make_node(node_id, f"s{node_id}", NodeType.COMM_SEND_NODE,
                     attrs={"comm_dst": dst, "comm_size": size, "comm_tag": tag})


def recv(node_id: int, src: int, size: int, tag: int = 5) -> object:
    return make_node(node_id, f"r{node_id}", NodeType.COMM_RECV_NODE,
                     attrs={"comm_src": src, "comm_size": size, "comm_tag": tag})


def switch(n: int) -> dict[str, Any]:
    return {"topology": ["Switch"], "npus_count": [n], "bandwidth": [400.0], "latency": [936.25]}


def plan_ns(kind: str, size: int, members: Any) -> int:
    return MODEL.plan(kind, size, Communicator.of(tuple(members), 8)).time_ns


def split(kind: str, size: int, members: Any) -> tuple[int, int]:
    """(latency ns, transfer ns) as the run charges them."""
    plan = MODEL.plan(kind, size, Communicator.of(tuple(members), 8))
    latency = round(plan.chosen.latency_us * 1e3)
    return latency, plan.time_ns - latency


@pytest.mark.parametrize("n", [2, 8])
def test_a_lone_all_reduce_takes_the_plans_time(tmp_path: Path, n: int) -> None:
    result = simulate(tmp_path, [[coll(1, AR, 64 * MiB)]] * n, switch(n), **NCCL)
    assert set(finish_times(result)) == {plan_ns("all_reduce", 64 * MiB, range(n))}
    (summary,) = result.collectives
    chosen = MODEL.plan("all_reduce", 64 * MiB, Communicator.of(tuple(range(n)), 8)).chosen
    assert summary.choices == ({"algorithm": chosen.algorithm, "protocol": chosen.protocol,
                                "channels": chosen.channels, "count_per_rank": 1.0},)
    assert result.backend == "nccl" and result.config["options"]["collective_model"] == "nccl"
    assert result.config["hardware"]["name"] == PROFILE


def test_sizes_follow_nccl_tests(tmp_path: Path) -> None:
    """A trace's all-gather carries what each rank contributes; the model takes the gathered output."""
    traces = [[coll(1, AG, MiB), coll(2, RS, 8 * MiB, [1]), coll(3, A2A, 8 * MiB, [2])]] * 8
    result = simulate(tmp_path, traces, switch(8), **NCCL)
    expected = sum(plan_ns(k, 8 * MiB, range(8)) for k in ("all_gather", "reduce_scatter", "all_to_all"))
    assert set(finish_times(result)) == {expected}


def test_two_concurrent_all_reduces_on_the_same_gpus_share_them() -> None:
    """Two communicators over the same 8 GPUs: each transfer takes twice as long; the work is conserved."""
    engine = Engine()
    run = NcclRun(engine, load_profile(PROFILE), 8, range(8))
    size = 256 * MiB
    latency, transfer = split("all_reduce", size, range(8))
    done: dict[int, list[int]] = {1: [], 2: []}
    delay = transfer // 4

    def issue(comm: int) -> None:
        for r in range(8):
            run.issue(r, comm, tuple(range(8)), "all_reduce", size,
                      lambda c, chosen: done[c].append(engine.now), comm, lambda: "here")

    issue(1)
    engine.call_later(delay, lambda _: issue(2))
    engine.run()
    assert done[1] == [done[1][0]] * 8 and done[2] == [done[2][0]] * 8
    first, second = done[1][0], done[2][0]
    # the first runs alone for `delay`, then both at half rate; the second then finishes alone
    assert abs(first - (latency + 2 * transfer - delay)) <= 2
    assert abs(second - (delay + latency + 2 * transfer - delay)) <= 2
    assert abs((second - latency) - 2 * transfer) <= 2  # the GPUs were busy all along: work conserved
    assert run.scheduler.started_work == run.scheduler.completed_work == 2 * transfer
    assert second - delay > 1.7 * (latency + transfer)  # about twice the lone time

    # started together, both take latency + 2 x transfer
    engine = Engine()
    run = NcclRun(engine, load_profile(PROFILE), 8, range(8))
    done = {1: [], 2: []}
    issue(1)
    issue(2)
    engine.run()
    assert {abs(t - (latency + 2 * transfer)) <= 1 for t in done[1] + done[2]} == {True}


def two_nic_profile(tmp_path: Path) -> str:
    """hgx-h200 with 2 NICs per node: GPUs 0-3 share NIC 0, GPUs 4-7 NIC 1."""
    text = (PROFILES_DIR / f"{PROFILE}.yml").read_text()
    assert "nics_per_node: 8" in text
    path = tmp_path / "two-nic.yml"
    path.write_text(text.replace("nics_per_node: 8", "nics_per_node: 2").replace("name: hgx-h200", "name: two-nic"))
    return str(path)


def test_groups_sharing_a_nic_slow_each_other_and_disjoint_groups_do_not(tmp_path: Path) -> None:
    profile = two_nic_profile(tmp_path)
    size = 64 * MiB
    idle = [comp(1, 0)]
    groups = {1: (0, 8), 2: (1, 9), 3: (4, 12)}

    def traces(active: tuple[int, ...]) -> list[list[object]]:
        out: list[list[object]] = [idle] * 16
        for g in active:
            for r in groups[g]:
                out[r] = [coll(1, AR, size, pg_name=str(g))]
        return out

    model = CollectiveModel(load_profile(profile))
    plan = model.plan("all_reduce", size, Communicator.of((0, 8), 8))
    latency = round(plan.chosen.latency_us * 1e3)
    transfer = plan.time_ns - latency
    alone = simulate(tmp_path, traces((1,)), switch(16), groups=groups, collective_model="nccl", hw_profile=profile)
    assert alone.ranks[0].finish_ns == plan.time_ns
    # groups 1 and 2 cross the same NIC on both nodes (GPUs 0 and 1 share NIC 0): each takes twice the transfer
    shared = simulate(tmp_path, traces((1, 2)), switch(16), groups=groups, collective_model="nccl",
                      hw_profile=profile)
    for r in (0, 8, 1, 9):
        assert abs(shared.ranks[r].finish_ns - (latency + 2 * transfer)) <= 1
    # group 3 (GPUs 4 and 12) uses NIC 1: no slower beside group 1
    apart = simulate(tmp_path, traces((1, 3)), switch(16), groups=groups, collective_model="nccl",
                     hw_profile=profile)
    assert [apart.ranks[r].finish_ns for r in (0, 8, 4, 12)] == [plan.time_ns] * 4


def test_disjoint_groups_on_one_node_are_independent(tmp_path: Path) -> None:
    groups = {1: (0, 1, 2, 3), 2: (4, 5, 6, 7)}
    size = 128 * MiB
    traces = [[coll(1, AR, size, pg_name="1" if r < 4 else "2")] for r in range(8)]
    result = simulate(tmp_path, traces, switch(8), groups=groups, **NCCL)
    assert set(finish_times(result)) == {plan_ns("all_reduce", size, range(4))}


def test_a_collective_waits_for_its_dependencies_and_every_member_and_overlaps_compute(tmp_path: Path) -> None:
    size = 64 * MiB
    t = plan_ns("all_reduce", size, range(8))
    # rank 0 computes 100 us before the all-reduce; every rank also computes 2 ms beside it
    first = [comp(1, 100), coll(2, AR, size, [1]), comp(3, 2000)]
    other = [coll(2, AR, size), comp(3, 2000)]
    sim, result = simulation(tmp_path, [first] + [other] * 7, switch(8), **NCCL)
    assert 100_000 + t < 2_000_000
    assert finish_times(result) == [2_100_000] + [2_000_000] * 7  # rank 0's two computes share its compute lane
    ends = {w.rank: (w.collective_log[0].start_ns, w.collective_log[0].end_ns) for w in sim.workloads}
    assert ends[0] == (100_000, 100_000 + t)  # issued after its parent
    assert {ends[r] for r in range(1, 8)} == {(0, 100_000 + t)}  # issued at once, started when rank 0 joined
    assert result.ranks[1].overlap_ns == 100_000 + t  # the collective ran under the 2 ms of compute


def test_a_send_is_timed_as_a_send_recv_plan(tmp_path: Path) -> None:
    size = 16 * MiB
    result = simulate(tmp_path, [[send(1, 1, size)], [recv(1, 0, size)]], switch(2), **NCCL)
    assert set(finish_times(result)) == {MODEL.plan(SEND_RECV, size, Communicator.of((0, 1), 8)).time_ns}


def test_a_send_shares_the_gpus_with_a_collective(tmp_path: Path) -> None:
    """Rank 1 receives from rank 2 while it all-reduces with rank 0: the send and the collective share rank 1."""
    size = 256 * MiB
    ar_latency, ar_transfer = split("all_reduce", size, (0, 1))
    p2p_latency, p2p_transfer = split(SEND_RECV, size, (1, 2))
    groups = {1: (0, 1)}
    traces = [[coll(1, AR, size, pg_name="1")], [coll(1, AR, size, pg_name="1"), recv(2, 2, size)],
              [send(1, 1, size)]]
    result = simulate(tmp_path, traces, switch(3), groups=groups, **NCCL)
    alone = max(ar_latency + ar_transfer, p2p_latency + p2p_transfer)
    assert result.ranks[1].finish_ns > alone + min(ar_transfer, p2p_transfer) // 2


def test_members_disagreeing_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        simulate(tmp_path, [[coll(1, AR, MiB)], [coll(7, AG, MiB)]], switch(2), **NCCL)
    text = str(e.value)
    assert "\n" not in text
    assert "rank 1" in text and "node 7" in text and "rank 0" in text and "node 1" in text
    assert "all_gather of 2097152 B (gathered output) is rank 1's collective #0" in text
    assert "all_reduce" in text and "all_gather" in text
    with pytest.raises(InputError, match="of 2097152 B"):
        simulate(tmp_path, [[coll(1, AR, MiB)], [coll(1, AR, 2 * MiB)]], switch(2), **NCCL)


def test_a_missing_member_is_a_deadlock_naming_the_collective(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="all_reduce #0 on communicator 0, which rank"):
        simulate(tmp_path, [[coll(1, AR, MiB)], [comp(1, 1)]], switch(2), **NCCL)


def test_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"needs a hardware profile .*shipped: .*hgx-h200"):
        simulate(tmp_path, [[coll(1, AR, MiB)]] * 2, switch(2), collective_model="nccl")
    with pytest.raises(InputError, match="unknown collective model 'fast'; valid: astra-sim, nccl"):
        simulate(tmp_path, [[coll(1, AR, MiB)]] * 2, switch(2), collective_model="fast")
    with pytest.raises(InputError, match="unknown hardware profile"):
        simulate(tmp_path, [[coll(1, AR, MiB)]] * 2, switch(2), collective_model="nccl", hw_profile="nope")
    warnings: list[str] = []
    simulate(tmp_path, [[coll(1, AR, MiB)]] * 2, switch(2), hw_profile=PROFILE, warn=warnings.append)
    assert any("no effect" in w for w in warnings)


def test_the_representative_rank_gives_the_same_results(tmp_path: Path) -> None:
    traces = [[coll(1, AR, 64 * MiB), coll(2, AR, 32 * MiB), comp(3, 10, [1])]] * 8
    symmetric = simulate(tmp_path, traces, switch(8), engine="symmetric", **NCCL)
    message = simulate(tmp_path, traces, switch(8), engine="message", **NCCL)
    assert symmetric.engine == "symmetric" and message.engine == "message"
    assert finish_times(symmetric) == finish_times(message)
    assert symmetric.collectives == message.collectives


def test_the_default_model_adds_nothing_to_the_results(tmp_path: Path) -> None:
    result = simulate(tmp_path, [[coll(1, AR, MiB)]] * 4)
    data = result.to_json()
    assert all("choices" not in c for c in data["collectives"])
    assert "hardware" not in data["config"]
    assert data["config"]["options"]["collective_model"] == "astra-sim"


def test_sweeps_take_the_model(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, {"options.collective_model": ["astra-sim", "nccl"],
                                              "options.hw_profile": [None, PROFILE]},
                                   zip_=[["options.collective_model", "options.hw_profile"]]))
    outcomes = [run_point(p.run, p.root, p.sources) for p in sweep.points]
    assert [o["status"] for o in outcomes] == ["ok", "ok"]
    assert outcomes[0]["metrics"]["finish_ns"] != outcomes[1]["metrics"]["finish_ns"]


def test_the_cli_end_to_end(tmp_path: Path) -> None:
    from workload.schema import CollectiveType
    from workload.tools.generate import collective, write_rank_traces

    prefix = tmp_path / "ar" / "trace"
    write_rank_traces(str(prefix), collective(8, CollectiveType.ALL_REDUCE, 64 * MiB))
    out = tmp_path / "r.json"
    p = run_cli("--workload", str(prefix), "--network", str(REPO / "configs/network/hgx_h100_8.yml"),
                "--collective-model", "nccl", "--hw-profile", PROFILE, "--json", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    chosen = MODEL.plan("all_reduce", 64 * MiB, Communicator.of(tuple(range(8)), 8)).chosen
    assert f"chosen: {chosen.algorithm}/{chosen.protocol} x{chosen.channels} ch" in p.stdout
    assert "NCCL-like collective model" in p.stdout
    data = json.loads(out.read_text())
    assert data["finish_ns"] == plan_ns("all_reduce", 64 * MiB, range(8))
    assert data["collectives"][0]["choices"][0]["algorithm"] == chosen.algorithm
    p = run_cli("--workload", str(prefix), "--network", str(REPO / "configs/network/hgx_h100_8.yml"),
                "--collective-model", "nccl")
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "hgx-h200" in p.stderr


def test_a_forced_algorithm_runs_wherever_it_can(tmp_path: Path) -> None:
    """--nccl-algo, as NCCL_ALGO: the forced algorithm times every collective it can run; the library's choice
    times the rest, with a warning naming the collective."""
    traces = [[coll(1, AR, 64 * MiB), coll(2, A2A, 8 * MiB, [1])]] * 8
    warnings: list[str] = []
    result = simulate(tmp_path, traces, switch(8), nccl_algorithm="Ring", warn=warnings.append, **NCCL)
    assert {c.kind: c.choices[0]["algorithm"] for c in result.collectives} == {"all_reduce": "ring",
                                                                               "all_to_all": "direct"}
    assert [w for w in warnings if "cannot run" in w] == [
        "NCCL algorithm Ring cannot run all_to_all on 8 GPU(s) over 1 node(s) with profile hgx-h200 (at 8388608 "
        "bytes); the library's choice ran"]
    ring = MODEL.plan("all_reduce", 64 * MiB, Communicator.of(tuple(range(8)), 8), "ring").time_ns
    assert set(finish_times(result)) == {ring + plan_ns("all_to_all", 8 * MiB, range(8))}
    assert ring != plan_ns("all_reduce", 64 * MiB, range(8))  # the library alone would run NVLS
    with pytest.raises(InputError, match="unknown NCCL algorithm 'fastest'; valid: ring, tree"):
        simulate(tmp_path, traces, switch(8), nccl_algorithm="fastest", **NCCL)


def test_results_say_what_a_gigabyte_is(tmp_path: Path) -> None:
    from simulator.results import format_text

    for options in ({}, NCCL):
        result = simulate(tmp_path, [[coll(1, AR, MiB)]] * 8, switch(8), **options)
        units = result.to_json()["units"]
        assert "10^9" in units["collectives[].busbw_GBps"] and "2^30" in units["config.network.bandwidth_GiBps"]
        text = format_text(result)
        assert "algbw, busbw: GB/s with GB = 10^9 B" in text
        assert ("2^30" in text) == (not options)


def test_compare_under_the_nccl_model_reports_nccl_tests_bandwidths() -> None:
    """compare --collective-model nccl: the library's choice and a forced algorithm per size; algbw = size / time
    with the all-gather's size the gathered buffer, busbw = algbw x (n-1)/n, as nccl-tests."""
    import re

    done = run_cli("compare", "--network", "configs/network/hgx_h100_8.yml", "--collective", "all_gather",
                   "--sizes", "8MiB,1GiB", "--collective-model", "nccl", "--hw-profile", PROFILE,
                   "--algorithms", "auto,nvls", cwd=REPO)
    assert done.returncode == 0, done.stderr
    row = re.compile(r"(auto|nvls) +\S+ \S+ +([\d.]+) +([\d.]+) +[\d.]+x +(\w+)/(\w+) x(\d+)$")
    rows = [m.groups() for line in done.stdout.splitlines() if (m := row.search(line))]
    assert len(rows) == 4, done.stdout
    comm = Communicator.of(tuple(range(8)), 8)
    for size, (asked, algbw, busbw, algorithm, protocol, channels) in zip(
            (8 * MiB, 8 * MiB, 1 << 30, 1 << 30), rows, strict=True):
        chosen = MODEL.plan("all_gather", size, comm, None if asked == "auto" else asked).chosen
        assert (algorithm, protocol, int(channels)) == (chosen.algorithm, chosen.protocol, chosen.channels)
        assert float(busbw) == pytest.approx(chosen.busbw_GBps, abs=0.006)
        assert float(algbw) == pytest.approx(size / chosen.time_us / 1e3, abs=0.006)
    assert rows[1][3] == "nvls" and rows[0][3] == "ring"
    bad = run_cli("compare", "--network", "configs/network/hgx_h100_8.yml", "--collective", "all_gather",
                  "--collective-model", "nccl", "--hw-profile", PROFILE, "--algorithms", "halvingDoubling", cwd=REPO)
    assert bad.returncode == 1 and "valid: auto, ring" in bad.stderr and bad.stderr.count("\n") == 1


def test_transfers_ending_together_complete_first_in_rank_order() -> None:
    """Jobs due at the same time complete before other events of that time, their callbacks ordered by (rank,
    issue counter) whatever order the jobs started in: every rank that does the same sees the same order."""
    from simulator.nccl_flows import FlowScheduler

    engine = Engine()
    flows = FlowScheduler(engine)
    seen: list[object] = []
    engine.call_later(100, seen.append, "other event at 100")
    flows.start(100, (0,), [(5, 0, seen.append, ("rank 5",), None)])
    flows.start(100, (1,), [(3, 1, seen.append, ("rank 3, second",), None), (3, 0, seen.append, ("rank 3",), None)])
    flows.start(0, (), [(1, 0, seen.append, ("rank 1, nothing to transfer",), None)])
    engine.run()
    assert seen == ["rank 1, nothing to transfer", "rank 3", "rank 3, second", "rank 5", "other event at 100"]
    assert engine.now == 100


def test_a_transfer_of_no_work_holds_no_resource() -> None:
    """A zero-length transfer over a resource finishing with a real one on it releases nothing (it crashed the
    completion with a KeyError, as a 0-byte collective did in generated training steps)."""
    from simulator.nccl_flows import FlowScheduler

    engine = Engine()
    flows = FlowScheduler(engine)
    done: list[tuple[str, int]] = []
    flows.start(0, (0, 1), [(0, 0, lambda: done.append(("empty", engine.now)), (), None)])
    flows.start(100, (0,), [(0, 1, lambda: done.append(("real", engine.now)), (), None)])
    flows.start(100, (0,), [(1, 0, lambda: done.append(("shared", engine.now)), (), None)])
    engine.run()
    assert done == [("empty", 0), ("real", 200), ("shared", 200)]
    assert not flows.users and not flows.load and flows.completed_work == flows.started_work == 200
