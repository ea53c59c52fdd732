"""``trace convert text``: ASTRA-sim 1.0 text workloads into per-rank ET files that simulate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from network.config import network_from_dict
from simulator.api import simulate
from tests.conftest import run_cli
from workload.convert.text import convert
from workload.convert.text_build import Clock, one_f_one_b
from workload.errors import InputError
from workload.reader import read_trace
from workload.schema import CollectiveType, NodeType
from workload.tools import generate as gen
from workload.validate import validate

FIXTURES = Path(__file__).parent / "fixtures" / "text"
AR, AG, RS, A2A = (int(CollectiveType.ALL_REDUCE), int(CollectiveType.ALL_GATHER),
                   int(CollectiveType.REDUCE_SCATTER), int(CollectiveType.ALL_TO_ALL))
# fixture: (NPUs, converter options, GPU compute µs per pass that the training loop performs)
CASES: dict[str, tuple[int, dict[str, Any], int]] = {
    "micro": (8, {}, 0),
    "data": (8, {}, 5 + 2 + 4 + 6 + 1),  # no input gradient for the first layer
    "model": (8, {}, 7 + 7 + 5),
    "hybrid_data_model": (8, {}, 6 * 3),
    "hybrid_model_data": (8, {"model_parallel_npus": 2}, 5 * 3),
    "dlrm": (8, {}, 10 + 9 + 7),
    "dlrm_enhanced": (8, {}, 10 + 9 + 7),
    "transformer": (8, {}, 9 * 3),
    "transformer_fwd_in_bckwd": (8, {}, 12 * 3 + (2 + 3) + (1 + 2)),  # + recomputed layers 3-4 and 0-1
    "transformer_pipeline": (16, {}, 2 * 7 * 3),  # ga: 2 micro-batches
    "distributed_inference": (4, {}, 6),
}
PASSES = 2


def ring(npus: int) -> Any:
    return network_from_dict({"topology": ["Ring"], "npus_count": [npus], "bandwidth": [50.0], "latency": [500.0]})


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("text")
    for name, (npus, options, _) in CASES.items():
        convert(str(FIXTURES / f"{name}.txt"), str(out / name / "t"), npus, PASSES, **options)
    return {name: out / name / "t" for name in CASES}


def nodes(prefix: Path, rank: int) -> list[dict[str, Any]]:
    g = read_trace(f"{prefix}.{rank}.et")
    validate(g)
    return [{"id": g.node_id(i), "name": g.name(i), "type": int(g.types[i]), "deps": g.data_deps_of(i),
             "us": int(g.duration_micros[i]), **{n: v for n, _, v in g.attributes(i)},
             "groups": g.io_info(i, "inputs")["values"] if int(g.types[i]) == NodeType.METADATA_NODE else None}
            for i in range(g.num_nodes)]


def by_name(prefix: Path, rank: int) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in nodes(prefix, rank)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_keyword_converts_and_simulates(converted: dict[str, Path], name: str) -> None:
    npus, _, compute_us = CASES[name]
    result = simulate(converted[name], ring(npus))
    assert len(result.ranks) == npus and result.finish_ns > 0
    assert all(r.finish_ns > 0 for r in result.ranks)
    assert {r.compute_ns for r in result.ranks} == {PASSES * compute_us * 1000}


def test_data_known_answer_is_compute_plus_the_lone_all_reduce(converted: dict[str, Path], tmp_path: Path) -> None:
    gen.write_rank_traces(str(tmp_path / "ar"), gen.collective(8, CollectiveType.ALL_REDUCE, 1 << 20))
    all_reduce_ns = simulate(tmp_path / "ar", ring(8)).finish_ns
    # each pass: 18 µs of compute, then conv1's all-reduce, which the next pass's conv1 forward waits for
    assert simulate(converted["data"], ring(8)).finish_ns == PASSES * (18_000 + all_reduce_ns)


def test_data_structure_and_pass_order(converted: dict[str, Path]) -> None:
    n = by_name(converted["data"], 0)
    assert [k for k in n if k.startswith("p0.")] == ["p0.conv1.fwd", "p0.fc1.fwd", "p0.fc1.wg", "p0.fc1.ig",
                                                     "p0.conv1.wg", "p0.conv1.wg_comm"]
    assert n["p0.fc1.wg"]["deps"] == [n["p0.fc1.fwd"]["id"]] and n["p0.fc1.wg"]["us"] == 6
    comm = n["p0.conv1.wg_comm"]
    assert (comm["type"], comm["comm_type"], comm["comm_size"]) == (NodeType.COMM_COLL_NODE, AR, 1 << 20)
    assert "pg_name" not in comm and comm["deps"] == [n["p0.conv1.wg"]["id"]]
    assert sorted(n["p1.conv1.fwd"]["deps"]) == sorted([n["p0.conv1.wg"]["id"], comm["id"]])


def test_model_parallel_collectives_block_the_forward(converted: dict[str, Path]) -> None:
    n = by_name(converted["model"], 3)
    assert n["p0.mlp.fwd"]["deps"] == [n["p0.embed.fwd_comm"]["id"]]
    assert n["p0.embed.fwd_comm"]["comm_type"] == AG and n["p0.embed.fwd_comm"]["comm_size"] == 8192
    assert "p0.embed.ig_comm" not in n and "p0.head.wg_comm" not in n  # none at layer 0, no wg in MODEL
    assert n["p0.mlp.ig"]["deps"] == [n["p0.head.wg"]["id"], n["p0.head.ig_comm"]["id"]]


@pytest.mark.parametrize(("name", "rank", "fwd", "wg", "model", "data"), [
    ("hybrid_data_model", 3, "l1", "l0", [2, 3], [1, 3, 5, 7]),
    ("hybrid_model_data", 5, "l1", "l0", [1, 5], [4, 5, 6, 7]),
    ("transformer", 6, "attention", "mlp", [4, 5, 6, 7], [2, 6]),
])
def test_hybrid_groups(converted: dict[str, Path], name: str, rank: int, fwd: str, wg: str, model: list[int],
                       data: list[int]) -> None:
    ns = nodes(converted[name], rank)
    declared, n = ns[0], {x["name"]: x for x in ns}
    assert declared["id"] == 0 and declared["type"] == NodeType.METADATA_NODE and declared["deps"] == []
    groups = declared_groups(declared)
    assert sorted(groups.values()) == sorted([model, data])
    assert groups[n[f"p0.{fwd}.fwd_comm"]["pg_name"]] == model
    assert groups[n[f"p0.{wg}.wg_comm"]["pg_name"]] == data and n[f"p0.{wg}.wg_comm"]["comm_size"] == 262144


def declared_groups(metadata: dict[str, Any]) -> dict[str, list[int]]:
    return {g["pg_name"]: g["ranks"] for g in json.loads(metadata["groups"][2:-2])}


def test_transformer_waits_for_input_gradient_collectives(converted: dict[str, Path]) -> None:
    n = by_name(converted["transformer"], 0)
    assert n["p0.mlp.wg"]["deps"] == [n["p0.mlp.ig_comm"]["id"]]
    assert n["p0.projection.ig_comm"]["comm_type"] == RS and n["p0.projection.fwd_comm"]["comm_type"] == AG
    assert "p0.projection.wg_comm" not in n and "p0.embedding.ig_comm" not in n  # NONE


def test_forward_recomputation_in_the_backward_pass(converted: dict[str, Path]) -> None:
    names = [k for k in by_name(converted["transformer_fwd_in_bckwd"], 0) if k.startswith("p0.")]
    backward = [k.removeprefix("p0.") for k in names[names.index("p0.projection.fwd_comm") + 1:]
                if k.endswith((".fwd_recompute", ".ig"))]
    assert backward == ["attention2.fwd_recompute", "mlp2.fwd_recompute", "projection.ig", "mlp2.ig",
                        "attention2.ig", "embedding.fwd_recompute", "attention1.fwd_recompute", "mlp1.ig",
                        "attention1.ig", "embedding.ig"]


def test_dlrm_embedding_all_to_alls(converted: dict[str, Path]) -> None:
    for name, ends_on_a2a in (("dlrm", True), ("dlrm_enhanced", False)):
        n = by_name(converted[name], 2)
        a2a, grad = n["p0.embedding.fwd_comm"], n["p0.embedding.ig_comm"]
        assert a2a["comm_type"] == grad["comm_type"] == A2A and "pg_name" not in a2a
        assert a2a["id"] in n["p0.top_mlp1.fwd"]["deps"] and a2a["id"] not in n["p0.bottom_mlp.fwd"]["deps"]
        assert grad["deps"] == [n["p0.top_mlp1.ig"]["id"]]
        assert (grad["id"] in n["p1.embedding.fwd"]["deps"]) == ends_on_a2a


def test_pipeline_stages_exchange_activations_in_1f1b_order(converted: dict[str, Path]) -> None:
    first, last = by_name(converted["transformer_pipeline"], 1), by_name(converted["transformer_pipeline"], 9)
    send, recv = first["p0.mb1.send_activation"], last["p0.mb1.recv_activation"]
    assert (send["comm_src"], send["comm_dst"], send["comm_tag"], send["comm_size"]) == (1, 9, 2, 65536)
    assert (recv["comm_src"], recv["comm_dst"], recv["comm_tag"]) == (1, 9, 2)
    assert recv["id"] in last["p0.mb1.attention.fwd"]["deps"]
    assert last["p0.mb0.send_gradient"]["comm_dst"] == 1

    def steps(n: dict[str, Any]) -> list[str]:
        return [k.split(".")[1] + k.split(".")[3][0] for k in n if k.startswith("p0.mb") and
                k.endswith((".attention.fwd", ".attention.wg"))]
    assert steps(first) == ["mb0f", "mb1f", "mb0w", "mb1w"] and steps(last) == ["mb0f", "mb0w", "mb1f", "mb1w"]
    assert "p0.mb0.attention.wg_comm" not in first and "p0.mb1.attention.wg_comm" in first
    assert first["p0.mb0.moe_dispatch.fwd_comm"]["comm_type"] == A2A


def test_expert_groups_of_the_pipeline_fixture(converted: dict[str, Path]) -> None:
    ns = nodes(converted["transformer_pipeline"], 10)  # tp 2 x dp 4 per stage, stage 1: ranks 8..15
    groups = declared_groups(ns[0])
    n = {x["name"]: x for x in ns}
    assert groups[n["p0.mb0.attention.fwd_comm"]["pg_name"]] == [10, 11]
    assert groups[n["p0.mb0.moe_dispatch.fwd_comm"]["pg_name"]] == [8, 10]  # EP: dp blocks of 2
    assert groups[n["p0.mb1.moe_experts.wg_comm"]["pg_name"]] == [10, 14]  # DP_EP
    assert groups[n["p0.mb1.attention.wg_comm"]["pg_name"]] == [8, 10, 12, 14]


def test_micro_and_inference(converted: dict[str, Path]) -> None:
    micro = nodes(converted["micro"], 0)
    assert [(x["comm_type"], x["comm_size"]) for x in micro] == [(AR, 1 << 20), (AG, 65536)] * PASSES
    assert all(x["deps"] == ([x["id"] - 1] if x["id"] > 1 else []) for x in micro)
    inference = by_name(converted["distributed_inference"], 0)
    assert list(inference)[:4] == ["p0.attention.fwd", "p0.attention.fwd_comm", "p0.mlp.fwd", "p0.mlp.fwd_comm"]
    assert [inference[k]["us"] for k in ("p0.attention.fwd", "p0.mlp.fwd")] == [2, 4]  # 2.5 + 3.5 µs, total 6


def test_passes_repeat_the_iteration(tmp_path: Path) -> None:
    counts = []
    for passes in (1, 3):
        convert(str(FIXTURES / "transformer.txt"), str(tmp_path / f"p{passes}"), 8, passes)
        counts.append(len(nodes(tmp_path / f"p{passes}", 0)) - 1)  # without the METADATA node
    assert counts[1] == 3 * counts[0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=5e6, allow_nan=False), min_size=1, max_size=40))
def test_rounding_keeps_every_running_total_within_half_a_microsecond(times_ns: list[float]) -> None:
    clock, exact, emitted = Clock(), 0.0, 0
    for t in times_ns:
        emitted += clock.duration_us(t)
        exact += t
        assert abs(emitted * 1000 - exact) <= 500 + 1e-6


@given(st.integers(1, 8), st.integers(1, 8), st.data())
def test_1f1b_runs_every_micro_batch_once_forward_before_backward(stages: int, count: int, data: Any) -> None:
    stage = data.draw(st.integers(0, stages - 1))
    order = one_f_one_b(stage, stages, count)
    assert sorted(order) == sorted([("F", m) for m in range(count)] + [("B", m) for m in range(count)])
    assert all(order.index(("F", m)) < order.index(("B", m)) for m in range(count))


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "w.txt"
    path.write_text(text)
    return str(path)


LINE = "l{}\t-1\t1000\tNONE\t0\t1000\tNONE\t0\t1000\tALLREDUCE\t1024\t0"


@pytest.mark.parametrize(("text", "npus", "message"), [
    ("DATA\n1\n" + LINE.format(0).replace("ALLREDUCE", "ALLREDUCEX"), 8, r"w.txt:3: unknown weight-gradient "
                                                                             r"collective 'ALLREDUCEX'"),
    ("DATA\n1\nl0 -1 1000 NONE 0 1000 NONE 0\n", 8, r"w.txt:3: a layer line has 8 columns"),
    ("DATA\n1\n" + LINE.format(0).replace("1000", "fast", 1), 8, r"w.txt:3: the forward compute time"),
    ("DATA\n2\n" + LINE.format(0), 8, r"w.txt:2: announces 2 layers but the file has 1"),
    ("DATA\n1\n" + LINE.format(0) + "\n" + LINE.format(1), 8, r"w.txt:4: more layer lines"),
    ("HYBRID_TRANSFORMER model_parallel_NPU_group: 3\n1\n" + LINE.format(0), 8, r"w.txt:1: 8 NPUs cannot be split"),
    ("HYBRID_DATA_MODEL\n1\n" + LINE.format(0), 8, r"w.txt:1: .*model_parallel_NPU_group"),
    ("HYBRID_TRANSFORMER model_parallel_NPU_group: 2 pp: 2\n1\n" + LINE.format(0), 8, r"pp_comm"),
    ("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 checkpoints: 1 2 checkpoint_initiates: 1 1\n3\n"
     + "\n".join(LINE.format(k) for k in range(3)), 8, r"layer 1 has no checkpoint at or below it"),
    ("HYBRID_DLRM\n2\n" + LINE.format(0) + "\n" + LINE.format(1), 8, r"last bottom-MLP layer"),
    ("DATA\n1\n" + LINE.format(0).replace("ALLREDUCE", "ALLREDUCE_EP"), 8, r"exist only in HYBRID_TRANSFORMER"),
    ("PIPELINE\n1\n" + LINE.format(0), 8, r"w.txt:1: unknown parallelism 'PIPELINE'"),
])
def test_bad_input_is_one_error_naming_file_and_line(tmp_path: Path, text: str, npus: int, message: str) -> None:
    with pytest.raises(InputError, match=message):
        convert(_write(tmp_path, text), str(tmp_path / "out" / "t"), npus)


def test_cli_converts_and_reports_errors_in_one_line(tmp_path: Path) -> None:
    out = run_cli("trace", "convert", "text", str(FIXTURES / "transformer.txt"), "-o", str(tmp_path / "t"),
                  "--num-npus", "8", "--num-passes", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(tmp_path / "t")] and (tmp_path / "t.7.et").exists()
    assert "weight-update delay" in out.stderr
    bad = _write(tmp_path, "DATA\n1\n" + LINE.format(0).replace("ALLREDUCE", "BCAST"))
    for args, message in (([bad, "--num-npus", "8"], "w.txt:3: unknown weight-gradient collective 'BCAST'"),
                          ([str(FIXTURES / "transformer.txt"), "--num-npus", "6"], "6 NPUs cannot be split")):
        err = run_cli("trace", "convert", "text", *args, "-o", str(tmp_path / "x"))
        assert err.returncode == 1 and "Traceback" not in err.stderr  # the CLI's exit status for bad input
        assert len(err.stderr.strip().splitlines()) == 1 and message in err.stderr
