"""The library release a profile states: what it enables and which tuning constants its choice uses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.collectives.hardware import load_profile
from simulator.collectives.library import CONSTANTS
from simulator.collectives.nccl import ALL_REDUCE, NVLS, NVLS_TREE, RING, CollectiveModel, Communicator
from simulator.collectives.versions import available, parse_version, tuning_constants
from workload.errors import InputError

GiB = 1 << 30


def test_versions_parse_and_unknown_ones_select_as_the_newest() -> None:
    assert parse_version("2.9.9") == (2, 9) and parse_version("2.27") == (2, 27)
    assert parse_version("v2.18.3-1") == (2, 18)
    assert parse_version("2.x") > parse_version("2.30.7")
    for arch in ("ampere", "hopper", "blackwell"):
        assert tuning_constants(arch, "nccl", "2.x") is CONSTANTS[arch]
        assert tuning_constants(arch, "nccl", "2.27.7") == CONSTANTS[arch]
    assert tuning_constants("cdna3", "rccl", "2.22.3") is CONSTANTS["cdna3"]


def test_algorithms_arrive_with_their_release() -> None:
    assert not available(NVLS, "nccl", "2.16.5") and available(NVLS, "nccl", "2.17.1")
    assert not available(NVLS_TREE, "nccl", "2.17.1") and available(NVLS_TREE, "nccl", "2.18.1")
    assert not available("pat", "nccl", "2.22.3") and available("pat", "nccl", "2.23.4")
    assert available(RING, "nccl", "2.9.9") and available(NVLS, "rccl", "2.0")


def test_an_old_release_on_an_nvswitch_node_has_no_nvls_and_hopper_no_ll128() -> None:
    h200 = load_profile("hgx-h200")
    one, two = Communicator.packed(8, 1), Communicator.packed(16, 2)
    newest, old = CollectiveModel(h200), CollectiveModel(replace(h200, library_version="2.14.3"))
    assert newest.plan(ALL_REDUCE, GiB, one).chosen.algorithm == NVLS
    assert all(c.algorithm not in (NVLS, NVLS_TREE) for c in old.plan(ALL_REDUCE, GiB, one).candidates)
    assert all(c.protocol != "LL128" for c in old.plan(ALL_REDUCE, 1 << 22, one).candidates)
    assert any(c.protocol == "LL128" for c in newest.plan(ALL_REDUCE, 1 << 22, one).candidates)
    assert not tuning_constants("blackwell", "nccl", "2.24.3").ll128
    assert tuning_constants("blackwell", "nccl", "2.25.1").ll128
    with pytest.raises(InputError, match="valid"):
        old.plan(ALL_REDUCE, GiB, two, "nvls_tree")


def test_nccl_2_9_chooses_with_its_own_constants() -> None:
    """NCCL 2.9's ring LL counted a quarter of the link (2.21 on: half) and its Simple ring's plateau 1.9x its
    latency (2.18 on: 1.4x): the ring gives way to the tree and to LL128 earlier than the newest release lets it."""
    old = tuning_constants("ampere", "nccl", "2.9.9")
    assert (old.ring_ll_factor, old.ring_plateau, old.hop_inter_us[RING][2]) == (0.25, 1.9, 9.6)
    p4d = load_profile("aws-p4d-a100")
    assert p4d.library_version == "2.9.9"
    two = Communicator.packed(16, 2)
    then, now = CollectiveModel(p4d), CollectiveModel(replace(p4d, library_version="2.x"))
    sizes = [1 << k for k in range(3, 33)]
    then_choice = [(then.plan(ALL_REDUCE, s, two).chosen.algorithm, then.plan(ALL_REDUCE, s, two).chosen.protocol)
                   for s in sizes]
    now_choice = [(now.plan(ALL_REDUCE, s, two).chosen.algorithm, now.plan(ALL_REDUCE, s, two).chosen.protocol)
                  for s in sizes]
    assert then_choice != now_choice
    assert then_choice.count((RING, "LL")) < now_choice.count((RING, "LL"))
