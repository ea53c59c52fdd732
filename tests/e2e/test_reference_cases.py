"""Every ASTRA-sim 2.x reference case, to the nanosecond (multiset of per-rank finish/exposed times)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from network.config import load_network
from simulator.config import load_memory, load_system
from simulator.simulation import RunOptions, Simulation
from tests.conftest import REFERENCE, run_cli
from workload.groups import load_comm_groups
from workload.traceset import resolve_workload

CASES = sorted(p for p in (REFERENCE / "cases").glob("*") if p.is_dir()) if REFERENCE.is_dir() else []


def expected(case: Path) -> tuple[dict, collections.Counter]:
    exp = json.loads((case / "expected.json").read_text())
    return exp, collections.Counter({(e["finish_ns"], e["exposed_comm_ns"]): e["ranks"] for e in exp["expect"]})


def run_case(case: Path, engine: str = "auto", warnings: list[str] | None = None) -> collections.Counter:
    exp, _ = expected(case)
    network = load_network(case / "network.yml")
    groups = load_comm_groups(case / "comm_groups.json", network.num_npus) if (case / "comm_groups.json").exists() \
        else {}
    options = RunOptions(backend=exp["backend"], rendezvous=exp.get("rendezvous_protocol", False), engine=engine,
                         progress=False)
    result = Simulation(resolve_workload(str(case / "workload" / "trace")), network, load_system(case / "system.json"),
                        load_memory(case / "memory.json"), groups, options,
                        None if warnings is None else warnings.append).run()
    return collections.Counter((r.finish_ns, r.exposed_comm_ns) for r in result.ranks)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reference_case(case: Path) -> None:
    warnings: list[str] = []
    assert run_case(case, warnings=warnings) == expected(case)[1]
    # ASTRA-sim printed a result, so it paired every collective over every rank (simulator/stream_numbers.py)
    assert not [w for w in warnings if "would not pair" in w]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_message_level_engine_agrees(case: Path) -> None:
    assert run_case(case, engine="message") == expected(case)[1]


def test_cli_with_astra_sim_flags(reference: Path, tmp_path: Path) -> None:
    case = reference / "cases" / "stg-gpt-dp2tp2pp2-L8-aware"
    out = tmp_path / "result.json"
    result = run_cli(f"--workload-configuration={case}/workload/trace", f"--system-configuration={case}/system.json",
                     f"--network-configuration={case}/network.yml",
                     f"--remote-memory-configuration={case}/memory.json",
                     f"--comm-group-configuration={case}/comm_groups.json", "--backend", "analytical-aware",
                     "--rendezvous-protocol=false", "--logging-folder=log", "--json", str(out), "--format", "astra-sim")
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    got = collections.Counter((r["finish_ns"], r["exposed_comm_ns"]) for r in doc["ranks"])
    assert got == expected(case)[1]
    assert doc["finish_ns"] == max(r["finish_ns"] for r in doc["ranks"]) and doc["backend"] == "analytical-aware"
    assert {"version", "config"} <= set(doc)
    lines = result.stdout.splitlines()
    assert "sys[3] finished, 488058558 cycles, exposed communication 258072043 cycles." in lines
    assert any(line.startswith("sys[7], Wall time: 327186264 | GPU time: ") for line in lines)
