"""Hundreds of random configurations, each against the numbers ASTRA-sim 2.x printed for it.

The cases come from oracle_cases.build_case (every algorithm, scheduling policy, active-chunk count,
queue count, injection scale, 1-3 dimensional networks of every building block, both backends,
communicator groups from files and METADATA nodes, send/recv with rendezvous, remote memory types,
roofline and replay-only); oracle_expected.json holds what ASTRA-sim printed for each.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from simulator.api import simulate
from tests.e2e.oracle_cases import build_case

EXPECTED = json.loads((Path(__file__).parent / "oracle_expected.json").read_text())["cases"]


@pytest.mark.parametrize("seed", sorted(EXPECTED, key=int))
def test_matches_astra_sim(tmp_path: Path, seed: str) -> None:
    settings = build_case(int(seed), tmp_path)
    groups = tmp_path / "comm_groups.json"
    result = simulate(tmp_path / "workload" / "trace", tmp_path / "network.yml", tmp_path / "system.json",
                      tmp_path / "memory.json", groups if groups.exists() else None, backend=settings["backend"],
                      rendezvous=settings["rendezvous"], queues_per_dim=settings["queues"],
                      injection_scale=settings["injection"])
    got = collections.Counter((r.finish_ns, r.exposed_comm_ns) for r in result.ranks)
    assert got == collections.Counter({(f, e): n for f, e, n in EXPECTED[seed]})
