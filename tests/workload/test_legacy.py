"""Earlier Chakra schemas (workload/legacy.py): each is recognised, said, read as the ASTRA-sim of its era read it
where today's cannot, simulated, and upgraded by `trace upgrade` to 1.0 files that simulate alike.

The fixtures are written here byte by byte in the old encodings (schema 0.0.1's node fields from Chakra's
eg_def.proto of early 2023; 0.0.4 streams without GlobalMetadata as in ASTRA-sim's runs/example of late 2023),
never copied from those files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_cli, trace_bytes
from workload.errors import TraceError
from workload.schema import CollectiveType, NodeType
from workload.traceset import TraceLoader, resolve_workload
from workload.wire import encode_varint, frame_payloads
from workload.writer import make_node, serialize

MiB = 1 << 20


def _varint_field(number: int, value: int) -> bytes:
    return encode_varint(number << 3) + encode_varint(value)


def _bytes_field(number: int, data: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(data)) + data


# schema 0.0.1's Node fields (Chakra's eg_def.proto, January-May 2023)
_EG_FIELDS = {"tensor_size": 6, "simulated_run_time": 7, "num_ops": 12, "comm_type": 13, "communicator_id": 15,
              "comm_src": 16, "comm_dst": 17, "comm_size": 18, "comm_tag": 19, "comm_priority": 20}
EG_COMP, EG_SEND, EG_RECV, EG_COLL = 3, 4, 5, 6
EG_ALL_REDUCE, EG_ALL_TO_ALL, EG_ALL_GATHER, EG_REDUCE_SCATTER = 1, 2, 3, 4


def eg_node(node_id: int, name: str, node_type: int, parents: tuple[int, ...] = (),
            involved_dim: tuple[bool, ...] = (), **values: int) -> bytes:
    """One node in schema 0.0.1's encoding (proto2: repeated fields unpacked)."""
    out = _varint_field(1, node_id) + _bytes_field(2, name.encode()) + _varint_field(3, node_type)
    out += b"".join(_varint_field(4, p) for p in parents)
    for key, value in values.items():
        out += _varint_field(_EG_FIELDS[key], value)
    out += b"".join(_varint_field(14, int(b)) for b in involved_dim)
    return out


def _run(folder: Path, npus: int, warn: list[str] | None = None, **options: object) -> list[int]:
    """Simulate the per-rank files folder/trace.<r>.et (or .eg) on a ring; every rank's finish time."""
    from network.config import network_from_dict
    from simulator.config import DEFAULT_SYSTEM, memory_from_dict, system_from_dict
    from simulator.simulation import RunOptions, Simulation

    net = network_from_dict({"topology": ["Ring"], "npus_count": [npus], "bandwidth": [50.0], "latency": [500.0]})
    sim = Simulation(resolve_workload(str(folder / "trace")), net, system_from_dict(dict(DEFAULT_SYSTEM)),
                     memory_from_dict({"memory-type": "NO_MEMORY_EXPANSION"}), {}, RunOptions(progress=False),
                     warn=(warn.append if warn is not None else None))
    return [r.finish_ns for r in sim.run().ranks]


def _write_set(folder: Path, streams: list[bytes], ext: str = "et") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank, data in enumerate(streams):
        (folder / f"trace.{rank}.{ext}").write_bytes(data)
    return folder


def _current(folder: Path, ranks: list[list[object]], version: str = "1.0.0") -> Path:
    return _write_set(folder, [trace_bytes(nodes, version) for nodes in ranks])


@pytest.mark.parametrize(("old", "new"), [(EG_ALL_REDUCE, CollectiveType.ALL_REDUCE),
                                          (EG_ALL_TO_ALL, CollectiveType.ALL_TO_ALL),
                                          (EG_ALL_GATHER, CollectiveType.ALL_GATHER),
                                          (EG_REDUCE_SCATTER, CollectiveType.REDUCE_SCATTER)])
def test_schema_0_0_1_collectives_are_todays_collectives(tmp_path: Path, old: int, new: CollectiveType) -> None:
    """0.0.1 numbered collectives 1-4 (all-reduce, all-to-all, all-gather, reduce-scatter) and kept the size in
    field 18: each runs as today's collective of that size."""
    eg = frame_payloads([eg_node(7, "c", EG_COLL, comm_type=old, comm_size=MiB, involved_dim=(True,))])
    now = make_node(7, "c", NodeType.COMM_COLL_NODE,
                    attrs={"comm_type": int(new), "comm_size": MiB, "involved_dim": [True]})
    warned: list[str] = []
    assert _run(_write_set(tmp_path / "eg", [eg] * 4, "eg"), 4, warned) == _run(_current(tmp_path / "now",
                                                                                          [[now]] * 4), 4)
    assert any("Chakra schema 0.0.1" in w and "read as ASTRA-sim 2.0 of that era did" in w for w in warned)


def test_schema_0_0_1_times_in_ns_parents_and_skipped_compute(tmp_path: Path) -> None:
    """Run times were ns (2,500 ns, not a whole µs, is kept exactly), parents are dependencies, and a compute node
    with neither run time nor ops was skipped without taking time, as ASTRA-sim of that era did."""
    eg = frame_payloads([
        eg_node(1, "fwd", EG_COMP, simulated_run_time=2500),
        eg_node(2, "grad_sync", EG_COLL, (1,), (True,), comm_type=EG_ALL_REDUCE, comm_size=MiB),
        eg_node(3, "empty", EG_COMP, (2,)),
    ])
    alone = make_node(2, "grad_sync", NodeType.COMM_COLL_NODE,
                      attrs={"comm_type": 0, "comm_size": MiB, "involved_dim": [True]})
    warned: list[str] = []
    finish = _run(_write_set(tmp_path / "eg", [eg] * 4, "eg"), 4, warned)
    assert finish == [2500 + t for t in _run(_current(tmp_path / "now", [[alone]] * 4), 4)]
    assert any("1 compute node(s) with neither simulated_run_time nor num_ops" in w for w in warned)


def test_schema_0_0_1_send_and_receive(tmp_path: Path) -> None:
    send = eg_node(1, "s", EG_SEND, comm_src=0, comm_dst=1, comm_size=MiB, comm_tag=5)
    recv = eg_node(1, "r", EG_RECV, comm_src=0, comm_dst=1, comm_size=MiB, comm_tag=5)
    now = [[make_node(1, "s", NodeType.COMM_SEND_NODE,
                      attrs={"comm_src": 0, "comm_dst": 1, "comm_size": MiB, "comm_tag": 5})],
           [make_node(1, "r", NodeType.COMM_RECV_NODE,
                      attrs={"comm_src": 0, "comm_dst": 1, "comm_size": MiB, "comm_tag": 5})]]
    eg = _write_set(tmp_path / "eg", [frame_payloads([send]), frame_payloads([recv])], "eg")
    assert _run(eg, 2) == _run(_current(tmp_path / "now", now), 2)


def test_schema_0_0_1_faults_name_the_node(tmp_path: Path) -> None:
    cases = [(eg_node(4, "c", EG_COLL, comm_type=0, comm_size=8), "comm_type 0, which names no collective"),
             (eg_node(4, "x", 9, simulated_run_time=8), "node type 9 is not one of Chakra 0.0.1's")]
    for i, (node, problem) in enumerate(cases):
        path = tmp_path / f"t{i}.0.eg"
        path.write_bytes(frame_payloads([eg_node(1, "a", EG_COMP, simulated_run_time=5, num_ops=3), node]))
        with pytest.raises(TraceError, match=problem) as info:
            TraceLoader().load(str(path), 0)
        assert "node 4" in str(info.value)


def test_a_stream_mixing_two_schemas_is_refused(tmp_path: Path) -> None:
    mixed = eg_node(1, "a", EG_COMP, num_ops=4) + _bytes_field(10, _bytes_field(1, b"comm_size"))
    path = tmp_path / "t.0.et"
    path.write_bytes(frame_payloads([mixed]))
    with pytest.raises(TraceError, match=r"mix the fields of Chakra 0\.0\.1"):
        TraceLoader().load(str(path), 0)


def test_typed_attribute_schemas_are_named_and_refused(tmp_path: Path) -> None:
    """Chakra 0.0.2 / 0.0.3 (mid-2023) kept typed attributes in node field 11, with value fields renumbered between
    its versions and no ASTRA-sim reading them: refused with the schema named, with or without GlobalMetadata."""
    attr = _bytes_field(1, b"comm_size") + _varint_field(2, 2) + _varint_field(6, 1024)
    node = _varint_field(1, 1) + _bytes_field(2, b"ar") + _varint_field(3, 7) + _bytes_field(11, attr)
    for i, data in enumerate((frame_payloads([node]), trace_bytes([]) + frame_payloads([node]))):
        path = tmp_path / f"t{i}.0.et"
        path.write_bytes(data)
        with pytest.raises(TraceError, match=r"Chakra schema 0\.0\.2/0\.0\.3 .* node message #0"):
            TraceLoader().load(str(path), 0)


def test_eg_files_are_found_by_prefix_and_et_files_preferred(tmp_path: Path) -> None:
    eg = frame_payloads([eg_node(1, "a", EG_COMP, simulated_run_time=5)])
    _write_set(tmp_path, [eg, eg], "eg")
    assert [Path(f).name for f in resolve_workload(str(tmp_path / "trace")).files] == ["trace.0.eg", "trace.1.eg"]
    (tmp_path / "trace.1.et").write_bytes(trace_bytes([make_node(1, "a", NodeType.COMP_NODE, duration_micros=1)]))
    assert [Path(f).name for f in resolve_workload(str(tmp_path / "trace")).files] == ["trace.0.eg", "trace.1.et"]


def _resnet_like(version: str, **coll_attrs: object) -> list[object]:
    """A 0.0.4 data-parallel step as Chakra's late-2023 text converter wrote it: compute, then the gradient
    all-reduce with comm_type and involved_dim only."""
    return [make_node(0, "COMP_NODE_fc_BWD_WG", NodeType.COMP_NODE, duration_micros=5),
            make_node(1, "COMM_COLL_NODE_fc_ALLREDUCE", NodeType.COMM_COLL_NODE, data_deps=[0],
                      attrs={"comm_type": 0, "involved_dim": [True], **coll_attrs}),
            make_node(2, "COMP_NODE_fc_BWD_IG", NodeType.COMP_NODE, data_deps=[0], duration_micros=3)]


def test_0_0_4_collectives_without_size_or_cpu_flag_take_no_time_as_in_their_era(tmp_path: Path) -> None:
    """ASTRA-sim's 2.0-era ResNet-50 set: its collectives carry neither comm_size nor is_cpu_op. That era's
    ASTRA-sim skipped them (a missing is_cpu_op read as true); ASTRA-sim 2.x today stops without a result. Read as
    the era did, with a warning; the same nodes in a 1.0 file are refused as today's ASTRA-sim refuses them."""
    warned: list[str] = []
    finish = _run(_current(tmp_path / "old", [_resnet_like("0.0.4")] * 4, "0.0.4"), 4, warned)
    assert finish == [8000] * 4  # 5 µs then 3 µs of compute, no communication
    assert any("neither comm_size nor is_cpu_op" in w and "Read as that era did" in w for w in warned)
    with pytest.raises(TraceError, match="without its 'comm_size' attribute"):
        _run(_current(tmp_path / "new", [_resnet_like("1.0.0")] * 4), 4)


def test_0_0_4_collectives_with_a_size_run_as_today(tmp_path: Path) -> None:
    """With comm_size but no is_cpu_op, ASTRA-sim 2.x today runs the collective on the GPU: kept, with a warning
    that the era's ASTRA-sim skipped it."""
    warned: list[str] = []
    old = _run(_current(tmp_path / "old", [_resnet_like("0.0.4", comm_size=MiB)] * 4, "0.0.4"), 4, warned)
    explicit = _run(_current(tmp_path / "new", [_resnet_like("1.0.0", comm_size=MiB, is_cpu_op=False)] * 4), 4)
    assert old == explicit and old[0] > 8000
    assert any("have no is_cpu_op: run on the GPU, as ASTRA-sim 2.x does today" in w for w in warned)


def test_0_0_4_without_metadata_reads_its_first_node(tmp_path: Path) -> None:
    """ASTRA-sim's runs/example ResNet-50 (late 2023): today's field numbers, dependencies as ctrl_deps, and no
    GlobalMetadata: the first message is node 0, read as a node (ASTRA-sim loses it)."""
    nodes = [make_node(0, "first", NodeType.COMP_NODE, duration_micros=4),
             make_node(1, "sync", NodeType.COMM_COLL_NODE, ctrl_deps=[0],
                       attrs={"comm_type": 0, "comm_size": MiB, "involved_dim": [True]})]
    bare = frame_payloads([serialize(n) for n in nodes])
    warned: list[str] = []
    finish = _run(_write_set(tmp_path / "bare", [bare] * 4), 4, warned)
    assert finish == _run(_current(tmp_path / "meta", [nodes] * 4, "0.0.4"), 4)
    assert any("0.0.4 (no GlobalMetadata)" in w and "starts with node 0 ('first')" in w for w in warned)
    shown = run_cli("trace", "inspect", str(tmp_path / "bare" / "trace"))
    assert "Chakra schema version: 0.0.4 (no GlobalMetadata)" in shown.stdout


def test_trace_upgrade_writes_1_0_files_that_simulate_alike(tmp_path: Path) -> None:
    """`trace upgrade` on each old encoding: 1.0 files whose metadata names the schema they came from, which load
    without legacy warnings and give the same finish times; a run time finer than 1 µs is rounded with a warning."""
    whole = frame_payloads([eg_node(1, "fwd", EG_COMP, simulated_run_time=3000),
                            eg_node(2, "sync", EG_COLL, (1,), (True,), comm_type=EG_ALL_GATHER, comm_size=MiB)])
    sets = {"eg": _write_set(tmp_path / "eg", [whole] * 4, "eg"),
            "resnet": _current(tmp_path / "resnet", [_resnet_like("0.0.4")] * 4, "0.0.4")}
    for name, folder in sets.items():
        done = run_cli("trace", "upgrade", str(folder / "trace"), "-o", str(tmp_path / f"up_{name}"))
        assert done.returncode == 0, done.stderr
        assert "4 file(s) of Chakra schema" in done.stdout and "-> 1.0.0" in done.stdout
        graph = TraceLoader().load(str(tmp_path / f"up_{name}.0.et"), 0)
        assert graph.version == "1.0.0" and graph.metadata["upgraded_from"].startswith("0.0.")
        assert not graph.warnings
        upgraded = tmp_path / f"up_{name}_set"
        upgraded.mkdir()
        for r in range(4):
            os.replace(tmp_path / f"up_{name}.{r}.et", upgraded / f"trace.{r}.et")
        assert _run(upgraded, 4) == _run(folder, 4)
    fine = _write_set(tmp_path / "fine", [frame_payloads([eg_node(1, "f", EG_COMP, simulated_run_time=2400)])], "eg")
    done = run_cli("trace", "upgrade", str(fine / "trace"), "-o", str(tmp_path / "fine_up"))
    assert done.returncode == 0 and "1 run time(s) in ns are not whole microseconds" in done.stderr
    assert "up to 400 ns off" in done.stderr
    assert int(TraceLoader().load(str(tmp_path / "fine_up.0.et"), 0).duration_micros[0]) == 2


def test_trace_upgrade_makes_its_output_folder(tmp_path: Path) -> None:
    """`-o new/folder/prefix` creates the folder, as generate, convert and rescale do (it used to be refused)."""
    whole = frame_payloads([eg_node(1, "fwd", EG_COMP, simulated_run_time=3000)])
    folder = _write_set(tmp_path / "eg", [whole] * 2, "eg")
    done = run_cli("trace", "upgrade", str(folder / "trace"), "-o", str(tmp_path / "new" / "up" / "trace"))
    assert done.returncode == 0, done.stderr
    assert TraceLoader().load(str(tmp_path / "new" / "up" / "trace.1.et"), 1).version == "1.0.0"
    (tmp_path / "file").write_text("")
    refused = run_cli("trace", "upgrade", str(folder / "trace"), "-o", str(tmp_path / "file" / "up" / "trace"))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.count("\n") == 1 and "Not a directory" in refused.stderr


# ASTRA-sim's own 2.0-era example sets, when fetched (not committed): set ASTRASIM_PY_LEGACY_TRACES to a folder
# holding resnet_dp/ and onecomm_allreduce/ (inputs/workload/ASTRA-sim-2.0/*.tar in its history, 2024-08) with
# inputs/ (inputs/ of that commit), runs_resnet/ (runs/example/workload/ of Nov 20 2023) and runs_transformer/
# (the .eg files of runs/example/workload/ of Nov 13 2023) with runs_inputs/{resnet,transformer}_{network.yml,
# system.json} (runs/example/ of those commits). The expected numbers are what ASTRA-sim 2.x printed for the same
# traces upgraded by `trace upgrade` (onecomm: for the original files; today's ASTRA-sim stops on the others).
LEGACY = os.environ.get("ASTRASIM_PY_LEGACY_TRACES", "")
ORIGINALS = [
    ("resnet_dp/Resnet50_DataParallel", "inputs/network/analytical/Ring.yml", "inputs/system/Ring.json",
     {(1_082_450_000, 0)}),
    ("onecomm_allreduce/one_comm_coll_node_allreduce", "inputs/network/analytical/Ring_FullyConnected_Switch.yml",
     "inputs/system/Ring_FullyConnected_Switch.json", {(2_780, 2_780)}),
    ("runs_resnet/resnet50_DataParallel", "runs_inputs/resnet_network.yml", "runs_inputs/resnet_system.json",
     {(1_082_454_160, 4_160)}),
    ("runs_transformer/transformer_2stack", "runs_inputs/transformer_network.yml",
     "runs_inputs/transformer_system.json", {(10_628_679_012, 10_217_829_284)}),
]


@pytest.mark.slow
@pytest.mark.skipif(not LEGACY, reason="set ASTRASIM_PY_LEGACY_TRACES to ASTRA-sim's fetched 2.0-era traces")
@pytest.mark.parametrize(("prefix", "network", "system", "expected"), ORIGINALS)
def test_astra_sims_2_0_era_examples(prefix: str, network: str, system: str, expected: set[tuple[int, int]]
                                     ) -> None:
    base = Path(LEGACY)
    done = run_cli("--workload", str(base / prefix), "--network", str(base / network), "--system",
                   str(base / system), "--format", "astra-sim")
    assert done.returncode == 0, done.stderr
    finished = [line.split() for line in done.stdout.splitlines() if " finished, " in line]
    assert {(int(w[2]), int(w[6])) for w in finished} == expected and len(finished) == 64
    # every set but onecomm (is_cpu_op and comm_size written) is read differently from today's ASTRA-sim: said
    assert ("Chakra schema 0.0." in done.stderr) == ("onecomm" not in prefix)
