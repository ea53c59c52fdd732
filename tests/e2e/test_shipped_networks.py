"""Every shipped network, with every backend and every shipped system file, runs every collective at the
sizes people use, and a real deadlock is still reported as one.

Sizes are nccl-tests' buffer sizes: an all-gather of 64 MiB gathers 64 MiB (each rank's input is 64 MiB / n).
The packet backend at 64 MiB with the shipped 4 KiB packets moves tens of millions of packet-hops per run,
so the default run checks it with packets and buffers 64x larger (the same timing asymmetries between
ranks, far fewer events) and the full matrix at the shipped packet size is marked slow.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from network.config import NetworkConfig, load_network
from simulator.api import simulate
from simulator.config import load_system
from simulator.simulation import DeadlockError
from tests.conftest import REPO
from workload.errors import InputError
from workload.schema import CollectiveType
from workload.tools.generate import collective, write_rank_traces

NETWORKS = sorted(p.name for p in (REPO / "configs" / "network").glob("*.yml"))
SYSTEMS = sorted(p.name for p in (REPO / "configs" / "system").glob("*.json"))
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SIZES = {"1MiB": 1 << 20, "64MiB": 64 << 20}
BACKENDS = ("analytical-unaware", "analytical-aware", "packet")
# Runs of more than a few seconds on 2 cores, kept for -m slow: ring all-to-all moves n(n-1)/2 messages per
# chunk (64-NPU rings, the 512-NPU pod), and the packet backend moves every packet of the pod's 512 NPUs.
HEAVY = {("fat_tree_64.yml", "*", "all_to_all"), ("pod_3d.yml", "*", "all_to_all"), ("pod_3d.yml", "packet", "*"),
         ("fat_tree_k8.yml", "packet", "all_to_all"), ("dragonfly_72.yml", "packet", "all_to_all")}


def heavy(net: str, backend: str, kind: str) -> bool:
    return any((net, b, k) in HEAVY for b in (backend, "*") for k in (kind, "*"))


@cache
def network(name: str) -> NetworkConfig:
    return load_network(REPO / "configs" / "network" / name)


def trace(folder: Path, kind: str, size_bytes: int, npus: int) -> str:
    """One trace file that every rank runs: a collective of ``size_bytes`` (nccl-tests' buffer size)."""
    per_rank = max(size_bytes // npus, 1) if kind == "all_gather" else size_bytes
    path = folder / f"{kind}_{size_bytes}_{npus}"
    if not path.with_suffix(".0.et").exists():
        write_rank_traces(str(path), collective(1, CollectiveType[kind.upper()], per_rank))
    return str(path.with_suffix(".0.et"))


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shipped")


def run(traces: Path, net: NetworkConfig, kind: str, size_bytes: int, backend: str, system: Path | None = None
        ) -> int:
    result = simulate(trace(traces, kind, size_bytes, net.num_npus), net, system, backend=backend)
    assert result.complete and all(r.finish_ns > 0 for r in result.ranks)
    return result.finish_ns


def cases(backends: tuple[str, ...], sizes: dict[str, int], slow_when: object) -> list[object]:
    out = []
    for net in NETWORKS:
        for backend in backends:
            for kind in KINDS:
                for label, size in sizes.items():
                    slow = slow_when(net, backend, kind, label)  # type: ignore[operator]
                    out.append(pytest.param(net, backend, kind, size, id=f"{net[:-4]}-{backend}-{kind}-{label}",
                                            marks=[pytest.mark.slow] if slow else []))
    return out


@pytest.mark.parametrize(("net", "backend", "kind", "size"), cases(
    BACKENDS, SIZES,
    lambda net, backend, kind, label: heavy(net, backend, kind) or (backend, label) == ("packet", "64MiB")))
def test_every_shipped_network_runs_every_collective(traces: Path, net: str, backend: str, kind: str,
                                                     size: int) -> None:
    run(traces, network(net), kind, size, backend)


@pytest.mark.parametrize(("net", "backend", "kind", "size"), cases(
    ("packet",), {"64MiB": 64 << 20}, lambda net, backend, kind, label: heavy(net, backend, kind)))
def test_packet_backend_at_64MiB_with_large_packets(traces: Path, net: str, backend: str, kind: str,
                                                    size: int) -> None:
    base = network(net)
    packet = replace(base.packet, mtu_bytes=64 * base.packet.mtu_bytes, buffer_bytes=64 * base.packet.buffer_bytes)
    run(traces, replace(base, packet=packet), kind, size, backend)


def _fits(system: str, net: str) -> bool:
    """A system file meant for a network has one algorithm per dimension of it."""
    algorithms = load_system(REPO / "configs" / "system" / system).implementation("all_reduce")
    return len(algorithms) == network(net).num_dims


def system_cases() -> list[object]:
    out = []
    for system in SYSTEMS:
        for net in NETWORKS:
            if not _fits(system, net):
                continue  # a system file lists one algorithm per dimension of the networks it is meant for
            for kind in KINDS:
                for backend in ("analytical-unaware", "analytical-aware"):
                    slow = heavy(net, backend, kind) or backend == "analytical-aware" or net == "pod_3d.yml"
                    out.append(pytest.param(system, net, kind, backend, id=f"{system[:-5]}-{net[:-4]}-{kind}-{backend}",
                                            marks=[pytest.mark.slow] if slow else []))
    return out


@pytest.mark.parametrize(("system", "net", "kind", "backend"), system_cases())
def test_every_shipped_system_file_runs_or_says_why(traces: Path, system: str, net: str, kind: str,
                                                    backend: str) -> None:
    """A system file runs every collective on the networks it fits; where an algorithm cannot run on a
    dimension (halving-doubling on 9 NPUs) the error says so. Never a deadlock."""
    try:
        run(traces, network(net), kind, 1 << 20, backend, REPO / "configs" / "system" / system)
    except DeadlockError:
        raise
    except InputError as e:
        assert "power-of-two" in str(e), e


def test_a_real_deadlock_on_a_fabric_is_still_reported(tmp_path: Path) -> None:
    """One rank issues an all-reduce the others never issue: every backend reports the deadlock."""
    net = network("fat_tree_64_oversubscribed.yml")
    prefix = tmp_path / "t"
    ranks = collective(net.num_npus, CollectiveType.ALL_REDUCE, 1 << 20, repeat=2)
    ranks[5] = ranks[5][:1]  # rank 5 stops after the first all-reduce
    write_rank_traces(str(prefix), ranks)
    for backend in BACKENDS:
        with pytest.raises(DeadlockError, match=r"rank 0.*waits for"):
            simulate(str(prefix), net, backend=backend)

