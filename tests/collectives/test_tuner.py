"""aws-ofi-nccl's region tuner: which (algorithm, protocol) it sets, where it leaves the choice to NCCL, and profiles
that load it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.collectives.algorithms import ALL_GATHER, ALL_REDUCE
from simulator.collectives.hardware import load_profile, parse_profile
from simulator.collectives.library import LL, LL128, NVLS_TREE, RING, SIMPLE, TREE, Communicator
from simulator.collectives.nccl import CollectiveModel
from simulator.collectives.tuner import MAX_RANKS, MAX_SIZE, Region, _extend, tuner_choice
from workload.errors import ConfigError

P6 = "aws-ofi-nccl/p6-b200"
EVERY_PAIR = {(a, p) for a in (RING, TREE, NVLS_TREE) for p in (LL, LL128, SIMPLE)}


@pytest.mark.parametrize(("size_bytes", "expected"), [
    (64 << 10, (TREE, LL)),  # below 384 KiB at 32 ranks
    (1 << 20, (TREE, LL128)),
    (64 << 20, (RING, LL128)),  # on the ring/LL128 region's 32-rank edge
    (256 << 20, (NVLS_TREE, SIMPLE)),
    (4 << 30, (RING, SIMPLE)),
])
def test_p6_regions_at_four_nodes(size_bytes: int, expected: tuple[str, str]) -> None:
    assert tuner_choice(P6, ALL_REDUCE, size_bytes, 32, 4, EVERY_PAIR) == expected


def test_p5_regions() -> None:
    offered = EVERY_PAIR
    assert tuner_choice("aws-ofi-nccl/p5", ALL_REDUCE, 32 << 20, 32, 4, offered) == (TREE, LL128)
    assert tuner_choice("aws-ofi-nccl/p5", ALL_REDUCE, 8 << 30, 32, 4, offered) == (RING, SIMPLE)
    # a pair NCCL does not offer is skipped: the next region holding the call decides, or NCCL
    assert tuner_choice("aws-ofi-nccl/p5", ALL_REDUCE, 32 << 20, 32, 4, offered - {(TREE, LL128)}) is None


def test_tuner_leaves_two_nodes_partial_nodes_and_other_collectives_to_nccl() -> None:
    assert tuner_choice(P6, ALL_REDUCE, 1 << 20, 16, 2, EVERY_PAIR) is None
    assert tuner_choice(P6, ALL_REDUCE, 1 << 20, 16, 4, EVERY_PAIR) is None  # 4 GPUs per node: no regions
    assert tuner_choice(P6, ALL_GATHER, 1 << 20, 32, 4, EVERY_PAIR) is None
    assert tuner_choice("unknown", ALL_REDUCE, 1 << 20, 32, 4, EVERY_PAIR) is None


def test_extend_reaches_the_far_edge() -> None:
    x, y = _extend((393216, 16), (393216, 1024))  # a vertical line: up to the largest rank count
    assert (x, y) == (math.log2(393216), math.log2(MAX_RANKS))
    x, y = _extend((1, 1), (2, 2))  # the diagonal meets the largest rank count (2^20) before the largest size
    assert (x, y) == (math.log2(MAX_RANKS), math.log2(MAX_RANKS))
    x, y = _extend((1, 1), (4, 2))  # a shallower line meets the largest size first
    assert (x, y) == (math.log2(MAX_SIZE), math.log2(MAX_SIZE) / 2)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.5, 9.5), st.floats(0.5, 9.5))
def test_square_region_holds_exactly_its_inside(x: float, y: float) -> None:
    square = Region(RING, SIMPLE, ((0.0, 0.0), (10.0, 0.0), (10.0, 10.0), (0.0, 10.0)))
    assert square.holds((x, y))
    assert not square.holds((x + 10.5, y))
    assert square.holds((0.0, y))  # edges count as inside


def test_model_follows_the_tuner_only_where_it_applies() -> None:
    profile = load_profile("aws-p6-b200")
    with_tuner, without = CollectiveModel(profile), CollectiveModel(replace(profile, tuner=None))
    four = Communicator.packed(32, 4)
    chosen = with_tuner.plan(ALL_REDUCE, 256 << 20, four).chosen
    assert (chosen.algorithm, chosen.protocol) == (NVLS_TREE, SIMPLE)
    assert chosen in with_tuner.plan(ALL_REDUCE, 256 << 20, four).candidates
    two = Communicator.packed(16, 2)
    for size in (64 << 10, 1 << 20, 256 << 20):
        assert with_tuner.plan(ALL_REDUCE, size, two) == without.plan(ALL_REDUCE, size, two)
    forced = with_tuner.plan(ALL_REDUCE, 256 << 20, four, "ring").chosen  # NCCL_ALGO: the tuner is not consulted
    assert forced.algorithm == RING


def test_profile_tuner_key_is_checked() -> None:
    good = {"name": "x", "gpu": "g", "gpus_per_node": 8, "library": "nccl", "library_version": "2", "arch": "hopper",
            "scale_up": {"fabric": "nvswitch", "links_per_gpu": 18, "link_bandwidth_GBps": 25, "latency_us": 1}}
    assert parse_profile({**good, "tuner": P6}, "p.yml").tuner == P6
    with pytest.raises(ConfigError, match="tuner"):
        parse_profile({**good, "tuner": "aws-ofi-nccl/p7"}, "p.yml")
