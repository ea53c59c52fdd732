"""Against a real ASTRA-sim 2.x binary, when one is at hand (ASTRA_SIM_BIN: the folder of its analytical
binaries, or them on PATH): our generated LLM traces with their groups file run unchanged there and give every
rank's numbers exactly as here, and traces that `trace upgrade` wrote from an older schema give ASTRA-sim the
numbers we simulate from the original files."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.workload.test_legacy import EG_ALL_REDUCE, EG_COLL, EG_COMP, eg_node
from workload.wire import frame_payloads

_spec = importlib.util.spec_from_file_location("astrasim_interop", REPO / "benchmarks" / "astrasim_interop.py")
assert _spec is not None and _spec.loader is not None
interop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(interop)
BINARIES = interop.find_binaries(None)
pytestmark = pytest.mark.skipif(not BINARIES, reason="no ASTRA-sim binary (set ASTRA_SIM_BIN to its bin folder)")
_FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles, exposed communication (\d+) cycles")


def test_a_generated_llm_trace_set_runs_unchanged_in_astra_sim() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "astrasim_interop.py"), "--only",
                           "GPT-3 1.3B, 2 layers"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "all identical" in done.stdout, done.stdout + done.stderr
    assert done.stdout.count("identical on every rank") == len(BINARIES) + 1


def test_the_gradient_norm_over_every_rank_after_stage_specific_group_collectives_pairs_in_astra_sim() -> None:
    """The distributed optimizer and the iteration tail: its groups file names a group of every rank for the
    gradient norm's all-reduce, which ASTRA-sim never paired on its own (stages run different group collectives)."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "astrasim_interop.py"), "--only",
                           "distributed optimizer, iteration tail"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "all identical" in done.stdout, done.stdout + done.stderr
    assert done.stdout.count("identical on every rank") == len(BINARIES) + 1


def test_upgraded_old_schema_traces_give_astra_sim_our_numbers(tmp_path: Path) -> None:
    eg = frame_payloads([eg_node(1, "fwd", EG_COMP, simulated_run_time=7000),
                         eg_node(2, "sync", EG_COLL, (1,), (True,), comm_type=EG_ALL_REDUCE, comm_size=1 << 20),
                         eg_node(3, "bwd", EG_COMP, (1,), simulated_run_time=4000)])
    for rank in range(8):
        (tmp_path / f"old.{rank}.eg").write_bytes(eg)
    net, system, memory = interop.write_inputs(str(tmp_path), [("Ring", 8, 50, 500)])
    assert run_cli("trace", "upgrade", str(tmp_path / "old"), "-o", str(tmp_path / "new")).returncode == 0
    for backend, binary in BINARIES.items():
        ours = run_cli("--workload", str(tmp_path / "old"), "--network", net, "--system", system, "--memory", memory,
                       "--backend", backend, "--format", "astra-sim")
        theirs = subprocess.run([binary, f"--workload-configuration={tmp_path / 'new'}",
                                 f"--system-configuration={system}", f"--network-configuration={net}",
                                 f"--remote-memory-configuration={memory}"], capture_output=True, text=True,
                                timeout=600, cwd=tmp_path)  # ASTRA-sim writes log/ in its working folder
        assert _FINISHED.findall(theirs.stdout + theirs.stderr) and sorted(
            _FINISHED.findall(theirs.stdout + theirs.stderr)) == sorted(_FINISHED.findall(ours.stdout)), backend


@pytest.mark.parametrize("group_collectives", [(1, 0), (2, 1), (1, 1), (0, 0)])
def test_astra_sim_stops_without_a_result_exactly_where_we_warn(tmp_path: Path,
                                                                group_collectives: tuple[int, int]) -> None:
    """A collective over every rank after different numbers of group collectives on different ranks: ASTRA-sim
    never finishes it where we warn that it would not pair it, elsewhere it prints our numbers; naming a group of
    every rank instead (what --groups-file traces do), it prints our numbers in every case."""
    import json

    from tests.simulator.test_stream_numbers import GROUPS, PAIRING, write_traces

    prefix = write_traces(tmp_path, group_collectives, metadata=False)
    (tmp_path / "named").mkdir()
    named = write_traces(tmp_path / "named", group_collectives, pg_name="3", metadata=False)
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({k: v for k, v in GROUPS.items() if len(v) < 4}))
    all_groups = tmp_path / "all_groups.json"
    all_groups.write_text(json.dumps(GROUPS))
    net, system, memory = interop.write_inputs(str(tmp_path), [("Ring", 4, 50, 500)])
    for backend, binary in BINARIES.items():
        theirs, _, _ = interop.run([binary, f"--workload-configuration={prefix}", f"--system-configuration={system}",
                                    f"--network-configuration={net}", f"--remote-memory-configuration={memory}",
                                    f"--comm-group-configuration={groups}"], str(tmp_path))
        ours = run_cli("--workload", prefix, "--network", net, "--system", system, "--memory", memory,
                       "--comm-groups", str(groups), "--backend", backend, "--format", "astra-sim")
        assert ours.returncode == 0, ours.stderr
        warned = PAIRING in ours.stderr
        assert warned == (group_collectives[0] != group_collectives[1]), ours.stderr
        theirs_named, _, _ = interop.run([binary, f"--workload-configuration={named}",
                                          f"--system-configuration={system}", f"--network-configuration={net}",
                                          f"--remote-memory-configuration={memory}",
                                          f"--comm-group-configuration={all_groups}"], str(tmp_path))
        numbers = {int(r): (int(t), int(e)) for r, t, e in _FINISHED.findall(ours.stdout)}
        assert theirs == ({} if warned else numbers), backend
        assert theirs_named == numbers, backend  # a group of every rank: ASTRA-sim pairs it in issue order too
