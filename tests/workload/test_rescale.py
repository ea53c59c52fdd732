"""``trace rescale``: N-rank data-parallel traces as M-rank ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from network.config import network_from_dict
from simulator.api import simulate
from tests.conftest import run_cli
from workload.convert.text import convert
from workload.errors import InputError
from workload.groups import process_groups_node
from workload.reader import read_trace
from workload.rescale import rescale
from workload.rescale_plan import Tiling, classify, signed_offset
from workload.schema import CollectiveType, NodeType
from workload.tools import generate as gen
from workload.writer import make_node

TEXT = Path(__file__).parent / "fixtures" / "text"
AR, AG = CollectiveType.ALL_REDUCE, CollectiveType.ALL_GATHER


def ring(npus: int) -> Any:
    return network_from_dict({"topology": ["Ring"], "npus_count": [npus], "bandwidth": [50.0], "latency": [500.0]})


def finish(prefix: Path, npus: int, **kwargs: Any) -> int:
    return simulate(prefix, ring(npus), **kwargs).finish_ns


def attributes(prefix: Path, rank: int) -> list[dict[str, Any]]:
    g = read_trace(f"{prefix}.{rank}.et")
    return [{"name": g.name(i), "us": int(g.duration_micros[i]), **{n: v for n, _, v in g.attributes(i)}}
            for i in range(g.num_nodes)]


@pytest.mark.parametrize("npus", [16, 4])
def test_all_reduce_trace_rescaled_runs_like_one_generated_at_that_size(tmp_path: Path, npus: int) -> None:
    gen.write_rank_traces(str(tmp_path / "in" / "t"), gen.collective(8, AR, 1 << 20, repeat=2))
    gen.write_rank_traces(str(tmp_path / "direct" / "t"), gen.collective(npus, AR, 1 << 20, repeat=2))
    said: list[str] = []
    assert rescale(str(tmp_path / "in" / "t"), str(tmp_path / "out" / "t"), npus, warn=said.append) == \
        [str(tmp_path / "out" / "t")]
    assert finish(tmp_path / "out" / "t", npus) == finish(tmp_path / "direct" / "t", npus)
    assert attributes(tmp_path / "out" / "t", npus - 1) == attributes(tmp_path / "direct" / "t", npus - 1)
    assert said == [f"{tmp_path / 'in' / 't'}: rescaled 8 -> {npus} ranks (weak scaling: per-rank compute kept); "
                    "2 collective(s), 0 resized"]


@pytest.mark.parametrize(("npus", "size"), [(16, 1 << 19), (4, 1 << 21)])
def test_all_gather_input_scales_so_the_gathered_result_keeps_its_size(tmp_path: Path, npus: int, size: int) -> None:
    gen.write_rank_traces(str(tmp_path / "in" / "t"), gen.collective(8, AG, 1 << 20))
    gen.write_rank_traces(str(tmp_path / "direct" / "t"), gen.collective(npus, AG, size))
    rescale(str(tmp_path / "in" / "t"), str(tmp_path / "out" / "t"), npus)
    assert attributes(tmp_path / "out" / "t", 0)[0]["comm_size"] == size
    assert finish(tmp_path / "out" / "t", npus) == finish(tmp_path / "direct" / "t", npus)


def test_uneven_all_gather_sizes_are_rounded_and_said(tmp_path: Path) -> None:
    gen.write_rank_traces(str(tmp_path / "in" / "t"), gen.collective(8, AG, 1000))
    said: list[str] = []
    rescale(str(tmp_path / "in" / "t"), str(tmp_path / "out" / "t"), 3, warn=said.append)
    assert attributes(tmp_path / "out" / "t", 2)[0]["comm_size"] == 2667
    assert "1 rounded to whole bytes" in said[0]


def test_model_and_data_groups_are_retiled_like_a_direct_conversion(tmp_path: Path) -> None:
    convert(str(TEXT / "transformer.txt"), str(tmp_path / "in" / "t"), 8, 2)  # model-parallel blocks of 4
    convert(str(TEXT / "transformer.txt"), str(tmp_path / "direct" / "t"), 16, 2)
    said: list[str] = []
    rescale(str(tmp_path / "in" / "t"), str(tmp_path / "out" / "t"), 16, warn=said.append)
    assert "groups re-tiled: pg 1: blocks of 4; pg 2: stride 4" in said[0] and len(said) == 1
    out = attributes(tmp_path / "out" / "t", 13)
    groups = {g["pg_name"]: g["ranks"] for g in json.loads(
        read_trace(tmp_path / "out" / "t.13.et").io_info(0, "inputs")["values"][2:-2])}
    by_name = {n["name"]: n for n in out}
    assert groups[by_name["p0.attention.fwd_comm"]["pg_name"]] == [12, 13, 14, 15]
    assert groups[by_name["p0.attention.wg_comm"]["pg_name"]] == [1, 5, 9, 13]
    assert finish(tmp_path / "out" / "t", 16) == finish(tmp_path / "direct" / "t", 16)


def test_strong_scaling_divides_per_rank_work(tmp_path: Path) -> None:
    traces = gen.compute(8, 3, duration_micros=10, num_ops=1000, tensor_size=4096)
    for nodes in traces:
        nodes.append(make_node(3, "grads", NodeType.COMM_COLL_NODE, data_deps=[2],
                               attrs={"comm_type": int(AR), "comm_size": 1 << 20}))
    gen.write_rank_traces(str(tmp_path / "in" / "t"), traces)
    rescale(str(tmp_path / "in" / "t"), str(tmp_path / "out" / "t"), 16, strong=True)
    out = attributes(tmp_path / "out" / "t", 9)
    assert [(n["us"], n.get("num_ops"), n.get("tensor_size")) for n in out[:3]] == [(5, 500, 2048)] * 3
    assert out[3]["comm_size"] == 1 << 20  # the gradient all-reduce keeps the model's size
    assert simulate(tmp_path / "out" / "t", ring(16)).ranks[9].compute_ns == 15_000


@pytest.mark.parametrize("npus", [16, 4])
def test_send_recv_ring_is_remapped(tmp_path: Path, npus: int) -> None:
    gen.write_rank_traces(str(tmp_path / "in" / "t"), gen.sendrecv_ring(8, 1 << 20, iterations=2))
    gen.write_rank_traces(str(tmp_path / "direct" / "t"), gen.sendrecv_ring(npus, 1 << 20, iterations=2))
    said: list[str] = []
    rescale(str(tmp_path / "in" / "t"), str(tmp_path / "out" / "t"), npus, warn=said.append)
    assert "send/recv peer offsets -1, +1 remapped" in said[0]
    send, recv = attributes(tmp_path / "out" / "t", npus - 1)[:2]
    assert (send["comm_src"], send["comm_dst"], recv["comm_src"], recv["comm_dst"]) == (npus - 1, 0, npus - 2, npus - 1)
    assert finish(tmp_path / "out" / "t", npus) == finish(tmp_path / "direct" / "t", npus)


def _irregular(tmp_path: Path) -> Path:
    """4 ranks: a collective on group [0, 1, 3] and a send 0 -> 2 that only rank 0 has."""
    traces = []
    for rank in range(4):
        nodes = [process_groups_node(0, {1: [0, 1, 3]})]
        if rank != 2:
            nodes.append(make_node(1, "odd_group", NodeType.COMM_COLL_NODE,
                                   attrs={"comm_type": int(AR), "comm_size": 4096, "pg_name": "1"}))
        if rank in (0, 2):
            node_type, peer = (NodeType.COMM_SEND_NODE, "comm_dst") if rank == 0 else (NodeType.COMM_RECV_NODE,
                                                                                        "comm_src")
            nodes.append(make_node(2, "lonely", node_type, attrs={peer: 2 - rank, "comm_size": 64, "comm_tag": 7}))
        traces.append(nodes)
    gen.write_rank_traces(str(tmp_path / "odd" / "t"), traces)
    return tmp_path / "odd" / "t"


def test_what_cannot_be_rescaled_is_reported_with_node_ids(tmp_path: Path) -> None:
    said: list[str] = []
    rescale(str(_irregular(tmp_path)), str(tmp_path / "out" / "t"), 8, warn=said.append)
    assert len(said) == 3
    assert "not rescaled, node(s) 1: pg_name 1 = [0, 1, 3]: it is neither all ranks" in said[1]
    assert "not rescaled, node(s) 2: only 2 of the 4 ranks have this send/recv" in said[2]
    with pytest.raises(InputError, match=r"node\(s\) 1: pg_name 1 .* \(and 1 more problem\(s\)\)"):
        rescale(str(_irregular(tmp_path)), str(tmp_path / "strict" / "t"), 8, strict=True)


def test_blocks_that_do_not_fit_the_new_size_are_reported(tmp_path: Path) -> None:
    convert(str(TEXT / "transformer.txt"), str(tmp_path / "in" / "t"), 8)
    said: list[str] = []
    rescale(str(tmp_path / "in" / "t"), str(tmp_path / "out" / "t"), 6, warn=said.append)
    assert any("pg_name 1 (blocks of 4): 6 ranks are not a multiple of the group's block size 4" in s for s in said)


def test_groups_from_a_comm_group_file_are_rescaled_into_one(tmp_path: Path) -> None:
    def traces(npus: int) -> list[list[Any]]:
        return [[make_node(1, "half", NodeType.COMM_COLL_NODE, attrs={
            "comm_type": int(AR), "comm_size": 1 << 20, "pg_name": str(1 + r // 4)})] for r in range(npus)]
    gen.write_rank_traces(str(tmp_path / "in" / "t"), traces(8))
    (tmp_path / "in.json").write_text(json.dumps({"1": [0, 1, 2, 3], "2": [4, 5, 6, 7]}))
    written = rescale(str(tmp_path / "in" / "t"), str(tmp_path / "out" / "t"), 16,
                      comm_groups=str(tmp_path / "in.json"))
    groups = json.loads(Path(written[1]).read_text())
    assert sorted(groups.values()) == [list(range(k, k + 4)) for k in range(0, 16, 4)]
    gen.write_rank_traces(str(tmp_path / "direct" / "t"), traces(16))
    (tmp_path / "direct.json").write_text(json.dumps({str(1 + k): list(range(4 * k, 4 * k + 4)) for k in range(4)}))
    assert finish(tmp_path / "out" / "t", 16, comm_groups=written[1]) == \
        finish(tmp_path / "direct" / "t", 16, comm_groups=tmp_path / "direct.json")


@given(st.sampled_from(["block", "stride"]), st.integers(2, 6), st.integers(2, 6), st.integers(1, 4), st.data())
def test_retiled_groups_keep_their_pattern(kind: str, step: int, count: int, factor: int, data: Any) -> None:
    old, new = step * count, step * count * factor
    rank = data.draw(st.integers(0, new - 1))
    members = Tiling(kind, step).members(rank, new)
    assert rank in members
    expected = classify(Tiling(kind, step).members(rank % old, old), old)
    assert classify(members, new) == expected
    assert signed_offset((rank + 1) % new, rank, new) == 1 and signed_offset((rank - 1) % new, rank, new) == -1


def test_cli_rescales_and_fails_strictly_in_one_line(tmp_path: Path) -> None:
    gen.write_rank_traces(str(tmp_path / "in" / "t"), gen.collective(8, AR, 1 << 20))
    out = run_cli("trace", "rescale", str(tmp_path / "in"), "--npus", "16", "-o", str(tmp_path / "out" / "t"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(tmp_path / "out" / "t")] and (tmp_path / "out" / "t.15.et").exists()
    assert "rescaled 8 -> 16 ranks" in out.stderr
    bad = run_cli("trace", "rescale", str(_irregular(tmp_path)), "--npus", "8", "-o", str(tmp_path / "x" / "t"),
                  "--strict")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert "not rescaled, node(s) 1" in bad.stderr


def test_a_group_strided_inside_a_block_is_named_as_such() -> None:
    """[0, 4, 8, 12] of 32 ranks (a pipeline stage's data-parallel group) is strided: the reason it is not
    re-tiled must not say it is not an equal stride."""
    assert classify((0, 4, 8, 12), 32) == (
        "it is neither all ranks, nor an equal block of consecutive ranks, nor every k-th rank of all 32 (a group "
        "strided inside a block, as a pipeline stage's data-parallel group, is not re-tiled)")
    assert classify((0, 8, 16, 24), 32) == Tiling("stride", 8)


def test_traces_written_with_a_groups_file_name_it_when_it_is_not_given(tmp_path: Path) -> None:
    """Generated or converted with --groups-file, then simulated or rescaled without --comm-groups: the error and
    the rescale report name the file beside the traces (they said only '--comm-groups')."""
    done = run_cli("trace", "convert", "text", str(TEXT / "transformer.txt"), "-o", str(tmp_path / "t"),
                   "--num-npus", "8", "--model-parallel-npus", "4", "--groups-file")
    assert done.returncode == 0, done.stderr
    groups = tmp_path / "t.comm_groups.json"
    network = tmp_path / "ring8.yml"
    network.write_text("topology: [Ring]\nnpus_count: [8]\nbandwidth: [50]\nlatency: [500]\n")
    run = run_cli("--workload", str(tmp_path / "t"), "--network", str(network), "--quiet")
    assert run.returncode == 1
    assert f"is not defined (give it with --comm-groups {groups}, the file of groups beside these traces)" in run.stderr
    run = run_cli("trace", "rescale", str(tmp_path / "t"), "--npus", "16", "-o", str(tmp_path / "r" / "t"))
    assert f"{groups} beside them does: pass it with --comm-groups" in run.stderr
    groups.unlink()
    run = run_cli("--workload", str(tmp_path / "t"), "--network", str(network), "--quiet")
    assert "(give it with --comm-groups, or in a METADATA node of the trace)" in run.stderr
