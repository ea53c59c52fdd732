"""The native algorithms as pure descriptions: who sends which pieces of data to whom, step by step.

A plan is a list of steps; a step is a list of messages that may travel at the same time. ``execute``
runs a plan on symbolic data (which ranks' contributions each piece holds) and ``postcondition_holds``
checks the collective's contract, so every algorithm can be tested the way msccl-tools does. The timed
executors in ``algorithms.py`` send exactly these messages (a test compares their traffic per rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.collectives.topology import _tree_shape

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL = "all_reduce", "all_gather", "reduce_scatter", "all_to_all"
Piece = int | tuple[int, int]  # a piece index, or (source, destination) for all-to-all


@dataclass(frozen=True, slots=True)
class Message:
    src: int
    dst: int
    pieces: tuple[Piece, ...]
    reduce: bool  # the receiver adds the data to what it holds (else it stores a copy)
    size: int  # bytes, as the timed executor sends them


Plan = list[list[Message]]
State = list[dict[Piece, frozenset[int]]]  # per rank: piece -> contributions it holds


def initial_state(kind: str, n: int) -> State:
    if kind == ALL_GATHER:
        return [{r: frozenset({r})} for r in range(n)]
    if kind == ALL_TO_ALL:
        return [{(r, d): frozenset({r}) for d in range(n)} for r in range(n)]
    return [{p: frozenset({r}) for p in range(n)} for r in range(n)]


def execute(plan: Plan, kind: str, n: int) -> State:
    """Run a plan on symbolic data; every message must carry pieces its sender holds at that step."""
    state = initial_state(kind, n)
    for step in plan:
        outgoing = []
        for m in step:
            missing = [p for p in m.pieces if p not in state[m.src]]
            if missing:
                raise AssertionError(f"rank {m.src} sends piece(s) {missing} it does not hold")
            outgoing.append((m, [(p, state[m.src][p]) for p in m.pieces]))
        for m, data in outgoing:
            held = state[m.dst]
            for p, contrib in data:
                held[p] = held.get(p, frozenset()) | contrib if m.reduce else contrib
    return state


def postcondition_holds(kind: str, n: int, state: State) -> bool:
    everyone = frozenset(range(n))
    if kind == ALL_REDUCE:
        return all(all(r.get(p) == everyone for p in range(n)) for r in state)
    if kind == ALL_GATHER:
        return all(all(r.get(p) == frozenset({p}) for p in range(n)) for r in state)
    if kind == REDUCE_SCATTER:  # each rank ends with a different fully reduced piece
        owned = [[p for p, c in r.items() if c == everyone] for r in state]
        return all(owned) and len({o[0] for o in owned}) == n
    return all(all(state[d].get((s, d)) == frozenset({s}) for s in range(n)) for d in range(n))


def ring(kind: str, n: int, size: int) -> Plan:
    """Clockwise ring: every step each rank sends one piece to the next rank."""
    nxt = [(r + 1) % n for r in range(n)]
    msg = size if kind == ALL_GATHER else size // n
    plan: Plan = []
    if kind in (ALL_REDUCE, REDUCE_SCATTER):
        for k in range(n - 1):
            plan.append([Message(r, nxt[r], ((r - k) % n,), True, msg) for r in range(n)])
    if kind in (ALL_REDUCE, ALL_GATHER):
        first = 1 if kind == ALL_REDUCE else 0  # after a reduce-scatter rank r owns piece r + 1
        for k in range(n - 1):
            plan.append([Message(r, nxt[r], ((r + first - k) % n,), False, msg) for r in range(n)])
    if kind == ALL_TO_ALL:  # relay: pieces travel hop by hop, the farthest-going first
        queues = [sorted(((r, d) for d in range(n) if d != r), key=lambda p, r=r: -((p[1] - r) % n))
                  for r in range(n)]
        for _ in range(n * (n - 1) // 2):
            step = [Message(r, nxt[r], (queues[r].pop(0),), False, msg) for r in range(n)]
            for m in step:
                piece = m.pieces[0]
                if piece[1] != m.dst:
                    queues[m.dst].append(piece)
            plan.append(step)
    return plan


def direct(kind: str, n: int, size: int) -> Plan:
    """Each rank sends to every other rank in turn (rank + 1, rank + 2, ...)."""
    msg = size if kind == ALL_GATHER else size // n
    plan: Plan = []
    if kind in (ALL_REDUCE, REDUCE_SCATTER):
        plan += [[Message(r, (r + k) % n, ((r + k) % n,), True, msg) for r in range(n)] for k in range(1, n)]
    if kind in (ALL_REDUCE, ALL_GATHER):
        plan += [[Message(r, (r + k) % n, (r,), False, msg) for r in range(n)] for k in range(1, n)]
    if kind == ALL_TO_ALL:
        plan += [[Message(r, (r + k) % n, ((r, (r + k) % n),), False, msg) for r in range(n)] for k in range(1, n)]
    return plan


def halving_doubling(kind: str, n: int, size: int) -> Plan:
    """Recursive halving (distance 1, 2, 4, ...) then, for all-reduce, doubling back; partner = rank XOR d."""
    steps = int(math.log2(n))
    plan: Plan = []
    held = [list(range(n)) for _ in range(n)]  # pieces each rank still reduces, halved every step
    msg = size // 2
    if kind in (ALL_REDUCE, REDUCE_SCATTER):
        for j in range(steps):
            d = 1 << j
            step = []
            for r in range(n):
                half = len(held[r]) // 2
                keep, give = (held[r][:half], held[r][half:]) if r & d == 0 else (held[r][half:], held[r][:half])
                step.append(Message(r, r ^ d, tuple(give), True, msg))
                held[r] = keep
            plan.append(step)
            msg //= 2
    if kind == ALL_REDUCE:
        msg *= 2
        for j in reversed(range(steps)):
            d = 1 << j
            plan.append([Message(r, r ^ d, tuple(held[r]), False, msg) for r in range(n)])
            held = [sorted(held[r] + held[r ^ d]) for r in range(n)]
            msg *= 2
    if kind == ALL_GATHER:
        owned = [[r] for r in range(n)]
        msg = size
        for j in reversed(range(steps)):
            d = 1 << j
            plan.append([Message(r, r ^ d, tuple(owned[r]), False, msg) for r in range(n)])
            owned = [sorted(owned[r] + owned[r ^ d]) for r in range(n)]
            msg *= 2
    return plan


def binary_tree_all_reduce(n: int, size: int, root_max: bool) -> Plan:
    """One of the double binary tree's trees: reduce up to the root, then send the result back down."""
    shape = _tree_shape(n, root_max)
    depth = [0] * n
    for pos in range(n):
        p, d = shape[pos][0], 0
        while p >= 0:
            d, p = d + 1, shape[p][0]
        depth[pos] = d
    deepest = max(depth)
    everything = tuple(range(n))
    plan: Plan = []
    for level in range(deepest, 0, -1):  # up: each node sends once all its children have sent
        plan.append([Message(pos, shape[pos][0], everything, True, size) for pos in range(n) if depth[pos] == level])
    for level in range(deepest):  # down
        plan.append([Message(pos, child, everything, False, size) for pos in range(n) if depth[pos] == level
                     for child in shape[pos][1:] if child >= 0])
    return plan


def describe(family: str, kind: str, n: int, size: int, root_max: bool = True) -> Plan:
    """The plan of an algorithm family (ring, direct, halvingDoubling, doubleBinaryTree) on n ranks."""
    if family == "ring":
        return ring(kind, n, size)
    if family == "direct":
        return direct(kind, n, size)
    if family == "halvingDoubling":
        return halving_doubling(kind, n, size)
    if family == "doubleBinaryTree":
        return binary_tree_all_reduce(n, size, root_max)
    raise KeyError(family)


def sends_per_rank(plan: Plan, n: int) -> list[list[tuple[int, int]]]:
    """Each rank's messages in send order as (destination, bytes)."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for step in plan:
        for m in step:
            out[m.src].append((m.dst, m.size))
    return out
