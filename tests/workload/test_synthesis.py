"""``astrasim-py trace synthesize``: profiles that hide names, synthetic traces that keep a workload's character."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from network.config import network_from_dict
from simulator.api import simulate
from simulator.fidelity import compare_workloads
from tests.conftest import REFERENCE, run_cli
from workload.errors import InputError
from workload.groups import metadata_groups, process_groups_node
from workload.reader import decode_trace
from workload.schema import CollectiveType, NodeType
from workload.synthesis import layout as lay
from workload.synthesis.generate import generate
from workload.synthesis.learn import learn
from workload.synthesis.profile import load_profile, profile_from_json
from workload.tools.generate import write_rank_traces
from workload.traceset import TraceLoader, resolve_workload
from workload.validate import validate
from workload.wire import frame_payloads
from workload.writer import make_metadata, make_node, serialize

COMP, COLL = NodeType.COMP_NODE, NodeType.COMM_COLL_NODE
SECRETS = ("secret_matmul", "aten::secret_op", "model.layers", "q_proj", "ProprietaryNet", "hidden=12288")
RF_ID = 987_654_321


def ring(npus: int) -> Any:
    return network_from_dict({"topology": ["Ring"], "npus_count": [npus], "bandwidth": [50.0], "latency": [500.0]})


def secret_attrs(k: int) -> list[tuple[str, Any]]:
    return [("rf_id", RF_ID + k), ("op_schema", "aten::secret_op(Tensor x, int hidden=12288) -> Tensor"),
            ("is_cpu_op", False)]


def mixed_traces(npus: int = 8) -> list[list[Any]]:
    """A microbenchmark-like mix: a compute chain with collectives of several types and sizes branching off it
    (some on the halves of the ranks), joining back later; durations jitter per rank."""
    rng = np.random.default_rng(7)
    base_us = rng.integers(20, 400, size=24).tolist()
    colls = [(CollectiveType.ALL_REDUCE, 1 << 20, ""), (CollectiveType.ALL_GATHER, 64 << 10, "h"),
             (CollectiveType.REDUCE_SCATTER, 4 << 20, ""), (CollectiveType.ALL_TO_ALL, 256 << 10, "h"),
             (CollectiveType.ALL_REDUCE, 16 << 20, ""), (CollectiveType.ALL_REDUCE, 1 << 20, "h")]
    traces = []
    for rank in range(npus):
        half = 1 if rank < npus // 2 else 2
        nodes = [process_groups_node(0, {1: range(npus // 2), 2: range(npus // 2, npus)})]
        prev, pending = None, []
        for k, us in enumerate(base_us):
            nid = 10 + 10 * k
            deps = ([prev] if prev else []) + pending
            pending = []
            nodes.append(make_node(nid, f"secret_matmul_{k}", COMP, data_deps=deps, duration_micros=us + rank % 3,
                                   attrs=[*secret_attrs(k), ("num_ops", us * 10**6), ("tensor_size", us << 12)],
                                   inputs={"values": "ProprietaryNet.block", "shapes": "[[4096]]", "types": "f"}))
            if k % 4 == 1:
                ctype, size, group = colls[(k // 4) % len(colls)]
                nodes.append(make_node(nid + 1, f"nccl:secret_{ctype.name}", COLL, data_deps=[nid], attrs=[
                    ("is_cpu_op", False), ("comm_type", int(ctype)), ("comm_size", size),
                    ("pg_name", str(half) if group else "")]))
                pending = [nid + 1] if k % 8 == 1 else []
            if k == 5:
                nodes.append(make_node(nid + 2, "secret_host_op", COMP, data_deps=[nid], duration_micros=3,
                                       attrs=[("is_cpu_op", True)]))
            prev = nid
        traces.append(nodes)
    return traces


def llm_traces(layers: int = 2, microbatches: int = 2) -> list[list[Any]]:
    """8 ranks: tensor parallel over pairs (stride 1), data parallel at stride 2, two pipeline stages (stride 4).
    Forward and backward per micro-batch with TP all-reduces, activations and gradients sent between stages,
    per-layer data-parallel gradient all-reduces overlapping the backward pass, then an optimizer step."""
    tp = {1: (0, 1), 2: (2, 3), 3: (4, 5), 4: (6, 7)}
    dp = {5: (0, 2), 6: (1, 3), 7: (4, 6), 8: (5, 7)}
    traces = []
    for rank in range(8):
        stage = rank // 4
        tp_pg = next(g for g, m in tp.items() if rank in m)
        dp_pg = next(g for g, m in dp.items() if rank in m)
        nodes = [process_groups_node(0, {**tp, **dp})]
        nid = [1]

        def add(name: str, ntype: int, deps: list[int], us: int = 0, attrs: list[tuple[str, Any]] | None = None,
                nodes: list[Any] = nodes, nid: list[int] = nid) -> int:
            nid[0] += 1
            nodes.append(make_node(nid[0], name, ntype, data_deps=deps, duration_micros=us,
                                   attrs=[*secret_attrs(nid[0]), *(attrs or [])]))
            return nid[0]

        def all_reduce(name: str, deps: list[int], size: int, pg: int) -> int:
            return add(f"nccl:{name}", COLL, deps, attrs=[("comm_type", 0), ("comm_size", size), ("pg_name", str(pg))])

        fwd: dict[tuple[int, int], int] = {}
        last = None
        for mb in range(microbatches):
            x = [last] if last else []
            if stage == 1:
                x = [add(f"recv_act_{mb}", NodeType.COMM_RECV_NODE, [], attrs=[
                    ("comm_src", rank - 4), ("comm_dst", rank), ("comm_size", 8 << 20), ("comm_tag", 100 + mb)])]
            for layer in range(layers):
                qkv = add(f"model.layers.{layer}.self_attn.q_proj", COMP, x, 180 + 10 * layer)
                x = [all_reduce(f"tp_attn_{layer}", [qkv], 8 << 20, tp_pg)]
                mlp = add(f"model.layers.{layer}.mlp", COMP, x, 260)
                x = [all_reduce(f"tp_mlp_{layer}", [mlp], 8 << 20, tp_pg)]
                fwd[(mb, layer)] = x[0]
            if stage == 0:
                x = [add(f"send_act_{mb}", NodeType.COMM_SEND_NODE, x, attrs=[
                    ("comm_src", rank), ("comm_dst", rank + 4), ("comm_size", 8 << 20), ("comm_tag", 100 + mb)])]
            last = x[0]
        grads: dict[int, list[int]] = {layer: [] for layer in range(layers)}
        for mb in range(microbatches):
            g = [last]
            if stage == 0:
                g = [add(f"recv_grad_{mb}", NodeType.COMM_RECV_NODE, g, attrs=[
                    ("comm_src", rank + 4), ("comm_dst", rank), ("comm_size", 8 << 20), ("comm_tag", 200 + mb)])]
            for layer in reversed(range(layers)):
                bwd = add(f"model.layers.{layer}.backward", COMP, [*g, fwd[(mb, layer)]], 520)
                g = [all_reduce(f"tp_bwd_{layer}", [bwd], 8 << 20, tp_pg)]
                grads[layer].append(bwd)
            if stage == 1:
                g = [add(f"send_grad_{mb}", NodeType.COMM_SEND_NODE, g, attrs=[
                    ("comm_src", rank), ("comm_dst", rank - 4), ("comm_size", 8 << 20), ("comm_tag", 200 + mb)])]
            last = g[0]
        reduced = [all_reduce(f"dp_grad_{layer}", grads[layer], 96 << 20, dp_pg) for layer in range(layers)]
        add("optimizer.step", COMP, [*reduced, last], 150)
        traces.append(nodes)
    return traces


def partners(graphs: list[Any]) -> tuple[dict[tuple[int, ...], dict[int, list[tuple[int, int]]]], list[Any],
                                         list[Any]]:
    """Per communicator group, each member's (type, size) sequence of collectives on it; all sends; all receives."""
    sequences: dict[tuple[int, ...], dict[int, list[tuple[int, int]]]] = {}
    sends, recvs = [], []
    for rank, g in enumerate(graphs):
        groups = {name: tuple(m) for i in range(g.num_nodes) for name, m in metadata_groups(g, i) or []}
        for i in range(g.num_nodes):
            t = int(g.types[i])
            if t == COLL:
                members = groups.get(g.attribute(i, "pg_name", ""), tuple(range(len(graphs))))
                sequences.setdefault(members, {}).setdefault(rank, []).append(
                    (g.attribute(i, "comm_type"), g.attribute(i, "comm_size")))
            elif t in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
                key = tuple(g.attribute(i, a) for a in ("comm_src", "comm_dst", "comm_tag", "comm_size"))
                (sends if t == NodeType.COMM_SEND_NODE else recvs).append(key)
    return sequences, sorted(sends), sorted(recvs)


def load(prefix: Path | str) -> list[Any]:
    traces = resolve_workload(str(prefix))
    loader = TraceLoader()
    return [loader.load(traces.file_for(r), r) for r in range(traces.num_ranks or 1)]


def write(tmp_path: Path, name: str, traces: list[list[Any]]) -> Path:
    prefix = tmp_path / name / "trace"
    write_rank_traces(str(prefix), traces)
    return prefix


@pytest.fixture(params=["mixed", "llm"])
def workload(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return write(tmp_path, request.param, mixed_traces() if request.param == "mixed" else llm_traces())


def test_grid_layout_of_the_llm_groups() -> None:
    groups = [(0, 1), (2, 3), (4, 5), (6, 7), (0, 2), (1, 3), (4, 6), (5, 7)]
    dims = lay.infer_dims(8, groups, [4, -4])
    assert dims == (2, 2, 2)
    assert lay.family_of_group(dims, (5, 7)) == lay.Family((1,))
    assert lay.family_of_group(dims, (4, 5)) == lay.Family((0,))
    assert lay.shift_between(dims, 1, 5) == (2, 1) and lay.shift_between(dims, 1, 2) is None
    assert lay.family_of_group(lay.infer_dims(4, [(0, 1), (0, 2)]), (1, 2)) is None and lay.box([0, 1, 3]) is None
    # first and last of four pipeline stages (tied embeddings): a sub-box limited to coordinates 0 and 3
    dims16 = lay.infer_dims(16, [(0, 1), (0, 2), (0, 12), (1, 13)], [4, -4])
    assert dims16 == (2, 2, 4) and lay.family_of_group(dims16, (1, 13)) == lay.Family((2,), coords=((0, 3),))
    layout = lay.Layout(dims, (2,), (0, 1), (lay.Family((0,)), lay.Family((1,))))
    grown = layout.resized(16, [1, 0])
    assert grown.dims == (2, 4, 2) and grown.group(9, 1) == (9, 11, 13, 15) and grown.peer(9, 2, -1) == 1
    with pytest.raises(InputError, match="use a multiple of 4"):
        layout.resized(5, [1, 0])
    assert layout.resized(4, [1, 0]).dims == (2, 1, 2)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.data())
def test_grid_groups_are_recovered(sizes: list[int], data: st.DataObject) -> None:
    dims = tuple(s + 1 for s in sizes)
    n = int(np.prod(dims))
    masks = data.draw(st.lists(st.sets(st.integers(0, len(dims) - 1), min_size=1), min_size=1, max_size=3))
    families = [lay.Family(tuple(sorted(m))) for m in masks]
    layout = lay.Layout(dims, (), (0,), tuple(families))
    groups = {layout.group(r, f) for f in range(len(families)) for r in range(n)}
    found = lay.infer_dims(n, groups)
    assert int(np.prod(found)) == n
    for g in groups:
        family = lay.family_of_group(found, g)
        assert family is not None and not family.coords
        assert lay.Layout(found, (), (0,), (family,)).group(g[0], 0) == g


def test_profile_and_synthetic_traces_hide_names_and_strings(workload: Path, tmp_path: Path) -> None:
    profile = learn(load(workload))
    path = tmp_path / "profile.json"
    profile.save(path)
    text = path.read_text()
    for secret in (*SECRETS, "nccl", "recv_act", "rf_id", "op_schema", "pg_name", str(RF_ID)):
        assert secret not in text
    assert load_profile(path).to_json() == json.loads(text)  # round trip
    prefix = tmp_path / "syn" / "t"
    write_rank_traces(str(prefix), generate(profile, seed=3))
    allowed = {"is_cpu_op", "comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag", "pg_name", "num_ops",
               "tensor_size"}
    for graph in load(prefix):
        assert not any(s.encode() in graph.buf.tobytes() for s in SECRETS)
        for i in range(graph.num_nodes):
            assert re.fullmatch(r"[a-z_]+_\d+|process_groups", graph.name(i))
            assert {name for name, _, _ in graph.attributes(i)} <= allowed
            assert graph.io_info(i, "outputs") is None
            if graph.name(i) != "process_groups":
                assert graph.io_info(i, "inputs") is None
        ids = graph.ids.tolist()
        assert ids == list(range(len(ids)))


def test_same_size_keeps_type_mix_sizes_and_iteration_time(workload: Path, tmp_path: Path) -> None:
    synthetic = tmp_path / "syn" / "t"
    write_rank_traces(str(synthetic), generate(learn(load(workload)), seed=11))
    report = compare_workloads(workload, synthetic, ring(8))
    assert report.ok, report.format_text()
    shares = {m.name: m for m in report.metrics if m.measure == "share"}
    assert shares and all(abs(m.difference) <= 0.02 for m in shares.values())
    assert abs(report.time_error or 0) <= 0.10 and report.original_ns
    assert all(m.difference <= 0.15 for m in report.metrics if m.measure == "ks")


def test_generation_is_deterministic_by_seed(tmp_path: Path) -> None:
    profile = learn(load(write(tmp_path, "mixed", mixed_traces())), noise=0.1, seed=5)
    outputs = {}
    for label, seed in (("a", 1), ("b", 1), ("c", 2)):
        write_rank_traces(str(tmp_path / label / "t"), generate(profile, scale=1.5, seed=seed))
        outputs[label] = [(tmp_path / label / f"t.{r}.et").read_bytes() for r in range(8)]
    assert outputs["a"] == outputs["b"]
    assert outputs["a"] != outputs["c"]
    again = learn(load(tmp_path / "mixed" / "trace"), noise=0.1, seed=5).to_json()
    assert again == profile.to_json()


@pytest.mark.parametrize("kind", ["mixed", "llm"])
def test_twice_the_ranks_and_nodes_runs_without_deadlock(kind: str, tmp_path: Path) -> None:
    original = write(tmp_path, kind, mixed_traces() if kind == "mixed" else llm_traces())
    graphs = load(original)
    profile = learn(graphs)
    prefix = tmp_path / "big" / "t"
    write_rank_traces(str(prefix), generate(profile, npus=16, scale=2.0, seed=4))
    big = load(prefix)
    assert len(big) == 16
    per_rank = sorted({g.num_nodes for g in big})
    assert per_rank == sorted({2 * (g.num_nodes - 1) + 1 for g in graphs})  # two iterations + group declaration
    sequences, sends, recvs = partners(big)
    assert sends == recvs and len(sends) == 4 * len(partners(graphs)[1])
    for members, by_rank in sequences.items():
        assert sorted(by_rank) == list(members)
        assert all(seq == by_rank[members[0]] for seq in by_rank.values())
    base = simulate(original, ring(8)).finish_ns
    result = simulate(prefix, ring(16))
    assert all(r.finish_ns > 0 for r in result.ranks)
    assert 1.6 * base < result.finish_ns < 3.0 * base


@pytest.mark.parametrize("scale", [0.5, 1.5])
def test_fractional_scales_thin_one_copy_consistently(scale: float, tmp_path: Path) -> None:
    original = write(tmp_path, "llm", llm_traces())
    profile = learn(load(original))
    prefix = tmp_path / "s" / "t"
    write_rank_traces(str(prefix), generate(profile, scale=scale, seed=9))
    graphs = load(prefix)
    for graph in graphs:
        validate(graph)
    nodes = sum(g.num_nodes - 1 for g in graphs)
    assert 0.6 * scale < nodes / sum(g.num_nodes - 1 for g in load(original)) < 1.4 * scale
    assert simulate(prefix, ring(8)).finish_ns > 0  # every collective and message found its partners


def test_from_profile_alone_and_with_more_ranks(tmp_path: Path) -> None:
    profile = learn(load(write(tmp_path, "mixed", mixed_traces())))
    profile.save(tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert [m.SerializeToString() for m in generate(again, seed=2)[3]] == \
        [m.SerializeToString() for m in generate(profile, seed=2)[3]]
    traces = generate(again, npus=12)  # the halves grow from 4 to 6 ranks
    write_rank_traces(str(tmp_path / "twelve" / "t"), traces)
    assert simulate(tmp_path / "twelve" / "t", ring(12)).finish_ns > 0


def test_groups_that_fit_no_grid_are_kept_explicit(tmp_path: Path) -> None:
    groups = {1: (0, 1), 2: (2, 3), 3: (0, 2), 4: (1, 3), 5: (0, 3), 6: (1, 2)}  # rows, columns, diagonals
    traces = [[process_groups_node(0, groups)] + [
        make_node(k, "x", COLL, data_deps=[k - 1] if k > 1 else [], attrs={"comm_type": 0, "comm_size": 1 << 20,
                                                                              "pg_name": str(g)})
        for k, g in enumerate((g for g, m in groups.items() if rank in m), start=1)] for rank in range(4)]
    profile = learn(load(write(tmp_path, "odd", traces)))
    assert profile.layout.explicit and len(profile.classes) == 4
    write_rank_traces(str(tmp_path / "s" / "t"), generate(profile))
    synthetic = partners(load(tmp_path / "s" / "t"))[0]
    assert set(synthetic) == set(groups.values())
    assert all(seq == [(0, 1_050_000)] for by_rank in synthetic.values() for seq in by_rank.values())  # 3 digits
    assert simulate(tmp_path / "s" / "t", ring(4)).finish_ns > 0
    with pytest.raises(InputError, match="fit no regular grid"):
        generate(profile, npus=8)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["comp", "cpu", "coll"]), st.integers(0, 500),
                          st.lists(st.integers(1, 6), max_size=3)), min_size=1, max_size=30),
       st.integers(0, 2**31 - 1))
def test_random_graphs_keep_their_shape(spec: list[tuple[str, int, list[int]]], seed: int) -> None:
    nodes = []
    for k, (kind, value, back) in enumerate(spec):
        deps = sorted({k - b for b in back if k - b >= 0})
        if kind == "coll":
            nodes.append(make_node(k, f"c{k}", COLL, data_deps=deps,
                                   attrs={"comm_type": value % 3 * 2, "comm_size": value * 1000}))
        else:
            nodes.append(make_node(k, f"n{k}", COMP, data_deps=deps, duration_micros=value,
                                   attrs={"is_cpu_op": kind == "cpu"}))
    graph = decode_trace(frame_payloads([serialize(make_metadata())] + [serialize(n) for n in nodes]), "mem")
    profile = learn([graph, graph])
    out = generate(profile_from_json(json.loads(json.dumps(profile.to_json()))), seed=seed)
    assert out[0] == out[1] and [n.type for n in out[0]] == [n.type for n in nodes]
    assert [sorted(n.data_deps) for n in out[0]] == [sorted(n.data_deps) for n in nodes]
    sizes = [a.int64_val for n in out[0] for a in n.attr if a.name == "comm_size"]
    original = [a.int64_val for n in nodes for a in n.attr if a.name == "comm_size"]
    assert all(o / 1.2 <= s <= o * 1.2 for s, o in zip(sizes, original, strict=True))  # within its log bin


def microbenchmarks() -> list[Path]:
    root = REFERENCE / "examples" / "microbenchmarks"
    return sorted(root.glob("*/8npus_*/*.0.et")) if root.is_dir() else []


@pytest.mark.parametrize("first", microbenchmarks(), ids=lambda p: p.parent.parent.name)
def test_reference_microbenchmarks(first: Path, tmp_path: Path) -> None:
    prefix = first.parent / first.name.removesuffix(".0.et")
    synthetic = tmp_path / "t"
    write_rank_traces(str(synthetic), generate(learn(load(prefix)), seed=1))
    report = compare_workloads(prefix, synthetic, ring(8))
    assert report.ok and abs(report.time_error or 1) <= 0.10, report.format_text()


def test_reference_llm_case_with_groups_and_pipeline(reference: Path, tmp_path: Path) -> None:
    case = reference / "cases" / "stg-gpt-dp2tp2pp2-L8-aware"
    if not case.is_dir():
        pytest.skip("needs the STG GPT case in ../shared/reference/astra-sim-2x/cases (as CI has it)")
    groups = {int(k): tuple(v) for k, v in json.loads((case / "comm_groups.json").read_text()).items()}
    profile = learn(load(case / "workload" / "trace"), groups)
    assert profile.layout.dims == (2, 2, 2) and len(profile.classes) == 2
    synthetic = tmp_path / "t"
    write_rank_traces(str(synthetic), generate(profile, seed=1))
    report = compare_workloads(case / "workload" / "trace", synthetic, case / "network.yml", case / "system.json",
                               groups, warn=lambda m: None)
    assert report.ok and abs(report.time_error or 1) <= 0.10, report.format_text()
    write_rank_traces(str(tmp_path / "big" / "t"), generate(profile, npus=16, scale=2.0, seed=1))
    net = {"topology": ["Switch"], "npus_count": [16], "bandwidth": [400.0], "latency": [936.25]}
    assert simulate(tmp_path / "big" / "t", network_from_dict(net), case / "system.json",
                    warn=lambda m: None).finish_ns > 1.8 * report.original_ns


def test_cli_synthesize_compare_and_from_profile(tmp_path: Path) -> None:
    original = write(tmp_path, "llm", llm_traces())
    net = tmp_path / "ring8.yml"
    net.write_text("topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n")
    out = run_cli("trace", "synthesize", str(original), "-o", str(tmp_path / "syn" / "t"), "--seed", "3",
                  "--save-profile", str(tmp_path / "p.json"), "--compare", "--network", str(net), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["outputs"] == [str(tmp_path / "p.json"), str(tmp_path / "syn" / "t")]
    assert doc["fidelity"]["ok"] and abs(doc["fidelity"]["time_error"]) <= 0.10
    again = run_cli("trace", "synthesize", "--from-profile", str(tmp_path / "p.json"), "-o",
                    str(tmp_path / "again" / "t"), "--seed", "3")
    assert again.returncode == 0 and again.stdout.split() == [str(tmp_path / "again" / "t")], again.stderr
    assert (tmp_path / "again" / "t.5.et").read_bytes() == (tmp_path / "syn" / "t.5.et").read_bytes()
    text = run_cli("trace", "synthesize", str(original), "-o", str(tmp_path / "x" / "t"), "--compare",
                   "--network", str(net))
    assert text.returncode == 0 and "iteration time" in text.stdout and "within tolerance" in text.stdout


def test_bad_inputs_give_one_line_errors(tmp_path: Path) -> None:
    import argparse

    from workload.synthesis import cli

    original = write(tmp_path, "llm", llm_traces())
    (tmp_path / "bad.json").write_text('{"format": "astrasim-py trace profile", "version": 1, "layout": []}')
    (tmp_path / "text.json").write_text("not json")
    out = str(tmp_path / "o")
    cases = [
        (["--from-profile", str(tmp_path / "missing.json"), "-o", out], "profile file not found"),
        (["--from-profile", str(tmp_path / "text.json"), "-o", out], "not valid JSON"),
        (["--from-profile", str(tmp_path / "bad.json"), "-o", out], "layout must be an object"),
        ([str(original), "-o", out, "--npus", "5"], "use a multiple of 4"),
        ([str(original), "-o", out, "--compare"], "--compare needs --network"),
        ([str(original), "-o", out, "--scale", "0"], "--scale must be a positive number"),
        ([str(original)], "nothing to write"),
        ([str(tmp_path / "nowhere"), "-o", out], "no such file"),
        ([str(original) + ".0.et", "-o", out], "give --npus"),
        ([str(original), "--from-profile", str(tmp_path / "bad.json"), "-o", out], "not both"),
    ]
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    for args, message in cases:
        with pytest.raises(InputError) as e:
            cli.main(parser.parse_args(args), lambda m: None)
        assert message in str(e.value) and "\n" not in str(e.value)
    for args, message in cases[::4]:  # the same through the command line: one line, no traceback
        done = run_cli("trace", "synthesize", *args)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_undefined_group_and_unmatched_send_are_reported() -> None:
    nodes = [make_node(1, "c", COLL, attrs={"comm_type": 0, "comm_size": 8, "pg_name": "4"})]

    def graph(ns: list[Any]) -> Any:
        return decode_trace(frame_payloads([serialize(make_metadata())] + [serialize(n) for n in ns]), "t.et")

    with pytest.raises(InputError, match="communicator group 4 is not defined"):
        learn([graph(nodes), graph(nodes)])
    send = [make_node(1, "s", NodeType.COMM_SEND_NODE, attrs={"comm_dst": 1, "comm_size": 8, "comm_tag": 1})]
    with pytest.raises(InputError, match="has no matching receive"):
        learn([graph(send), graph([make_node(1, "c", COMP)])])
