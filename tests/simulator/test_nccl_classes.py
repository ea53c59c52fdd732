"""Resource classes of the NCCL model in a folded run (simulator/nccl_classes.py): a NIC's class is the set of
NICs the shifts map it to, found from its GPU's orbit; it equals walking the shifts NIC by NIC, and costs the
orbits a run uses, not a walk per NIC (QA R5: 140 ms per communicator on 16,384 ranks of Llama-3 405B)."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.collectives.hardware import HardwareProfile, load_profile
from simulator.nccl_classes import NcclClasses
from simulator.quotient import Quotient, Shift


def node_profile(gpus_per_node: int, nics_per_node: int) -> HardwareProfile:
    """A shipped profile with nodes of ``gpus_per_node`` GPUs and ``nics_per_node`` NICs."""
    hgx = load_profile("hgx-h100")
    assert hgx.scale_out is not None
    return replace(hgx, gpus_per_node=gpus_per_node, scale_out=replace(hgx.scale_out, nics_per_node=nics_per_node))


def quotient_of_shifts(npus: int, sigmas: list[np.ndarray], orders: list[int]) -> Quotient:
    """The quotient of ``npus`` ranks by commuting permutations ``sigmas`` of ``orders`` (a free action)."""
    size = math.prod(orders)
    rep_of, orbit_of = np.full(npus, -1), np.full(npus, -1)
    coords = np.zeros((npus, len(orders)), dtype=np.int64)
    exponents = np.array(list(itertools.product(*(range(o) for o in orders))), dtype=np.int64)
    reps, rows = [], []
    for r in range(npus):
        if rep_of[r] >= 0:
            continue
        images = np.array(r)
        for sigma, order in zip(sigmas, orders, strict=True):  # images[e0, e1, ...] = s0^e0 s1^e1 ... (r)
            layers = [images]
            for _ in range(order - 1):
                layers.append(sigma[layers[-1]])
            images = np.stack(layers, axis=-1)
        row = images.reshape(-1)
        assert len(set(row.tolist())) == size and (rep_of[row] < 0).all(), "not a free action"
        rep_of[row], orbit_of[row], coords[row] = r, len(reps), exponents
        reps.append(r)
        rows.append(row)
    shifts = [Shift(sigma, order, f"shift {k}", {}) for k, (sigma, order) in enumerate(zip(sigmas, orders,
                                                                                         strict=True))]
    return Quotient(reps, rep_of, orbit_of, coords, tuple(orders), np.array(rows, dtype=np.int64), "test", shifts)


def walked(q: Quotient, key: tuple[Any, ...], gpn: int, nics: int) -> tuple[tuple[Any, ...], int]:
    """A NIC's class by definition: every NIC the shifts reach from it (the smallest, how many)."""
    seen, frontier = {key}, [key]
    while frontier:
        nxt = []
        for _, node, nic in frontier:
            gpu = node * gpn + -(-nic * gpn // nics)
            for s in q.shifts:
                image = int(s.sigma[gpu])
                found = ("nic", image // gpn, (image % gpn) * nics // gpn)
                if found not in seen:
                    seen.add(found)
                    nxt.append(found)
        frontier = nxt
    return min(seen), len(seen)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([(8, 8), (8, 4), (8, 16), (4, 2), (2, 1)]), st.integers(2, 6), st.data())
def test_nic_classes_are_the_nics_the_shifts_reach(layout: tuple[int, int], nodes: int, data: st.DataObject) -> None:
    """Node rotations and rotations inside nodes that keep NICs whole, alone or together: each NIC's class equals
    the walk over the shifts."""
    gpn, nics = layout
    npus = gpn * nodes
    ranks = np.arange(npus)
    node_step = data.draw(st.sampled_from([d for d in range(1, nodes + 1) if nodes % d == 0]), "node step")
    block = max(1, gpn // nics)  # GPUs per NIC: a rotation inside nodes moves whole NICs
    local_step = data.draw(st.sampled_from([c for c in range(block, gpn + 1, block) if gpn % c == 0]), "local step")
    sigmas, orders = [], []
    if node_step < nodes:
        sigmas.append((ranks + node_step * gpn) % npus)
        orders.append(nodes // node_step)
    if local_step < gpn:
        sigmas.append((ranks // gpn) * gpn + (ranks % gpn + local_step) % gpn)
        orders.append(gpn // local_step)
    if not sigmas:
        sigmas, orders = [ranks.copy()], [1]
    q = quotient_of_shifts(npus, sigmas, orders)
    classes = NcclClasses(q, node_profile(gpn, nics))
    for r in data.draw(st.permutations(range(npus)), "query order"):
        key = ("nic", r // gpn, (r % gpn) * nics // gpn)
        assert classes.resource(key) == walked(q, key, gpn, nics), key
        assert classes.resource(("up", r)) == (("up", int(q.rep_of[r])), q.orbit_size)


def test_nic_classes_cost_the_orbits_not_a_walk_per_nic() -> None:
    """16,384 ranks in 16 classes of 1,024 (as Llama-3 405B folds): every NIC's class in well under a second of
    CPU (walking the shifts from each NIC took about 1.5 ms a NIC, 25 s for all of them)."""
    gpn = nics = 8
    npus = 16_384
    ranks = np.arange(npus)
    q = quotient_of_shifts(npus, [(ranks + 16) % npus], [npus // 16])
    classes = NcclClasses(q, node_profile(gpn, nics))
    started = time.process_time()
    found = {classes.resource(("nic", r // gpn, r % gpn)) for r in range(npus)}
    used_s = time.process_time() - started
    assert found == {(("nic", o // gpn, o % gpn), 1024) for o in range(16)}
    assert used_s < 2.0, f"{used_s:.2f} s of CPU"
