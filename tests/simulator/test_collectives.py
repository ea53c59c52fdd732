"""Every native algorithm meets its collective's postcondition, and the timed executors send exactly
the traffic of the pure descriptions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from network.backends import CongestionUnaware
from network.config import network_from_dict
from network.messaging import Messaging
from simulator.collectives import plans
from simulator.config import system_from_dict
from simulator.engine import Engine
from simulator.system import RankSystem, SystemSetup
from workload.errors import InputError

KINDS = {
    "ring": ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"),
    "direct": ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"),
    "halvingDoubling": ("all_reduce", "reduce_scatter", "all_gather"),
    "doubleBinaryTree": ("all_reduce",),
}
POWER_OF_TWO = ("halvingDoubling", "doubleBinaryTree")


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, int]:
    family = draw(st.sampled_from(sorted(KINDS)))
    kind = draw(st.sampled_from(KINDS[family]))
    n = 2 ** draw(st.integers(1, 5)) if family in POWER_OF_TWO else draw(st.integers(2, 12))
    return family, kind, n


@settings(max_examples=200, deadline=None)
@given(cases())
def test_algorithm_meets_the_collective_postcondition(case: tuple[str, str, int]) -> None:
    family, kind, n = case
    trees = (True, False) if family == "doubleBinaryTree" else (True,)
    for root_max in trees:
        state = plans.execute(plans.describe(family, kind, n, 1024 * n, root_max), kind, n)
        assert plans.postcondition_holds(kind, n, state), (family, kind, n, root_max)


def test_a_broken_plan_is_caught() -> None:
    plan = plans.ring("all_reduce", 4, 4096)
    del plan[-1]  # drop the last all-gather step
    assert not plans.postcondition_holds("all_reduce", 4, plans.execute(plan, "all_reduce", 4))


class RecordingMessaging(Messaging):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.sent: dict[int, list[tuple[int, int]]] = {}

    def send(self, src, dst, size_bytes, tag, on_sent, arg=None):  # type: ignore[no-untyped-def]
        self.sent.setdefault(src, []).append((dst, size_bytes))
        super().send(src, dst, size_bytes, tag, on_sent, arg)


def executor_traffic(algorithm: str, kind: str, n: int, size: int) -> tuple[list[list[tuple[int, int]]], int]:
    """Run one collective of one chunk on an n-NPU ring; each rank's sends in order, and ranks done."""
    engine = Engine()
    network = network_from_dict({"topology": ["Ring"], "npus_count": [n], "bandwidth": [50.0], "latency": [500.0]})
    messaging = RecordingMessaging(engine, CongestionUnaware(network, engine))
    key = kind.replace("_", "-") + "-implementation"
    system = system_from_dict({"preferred-dataset-splits": 1, "local-mem-bw": 1600, key: [algorithm]})
    setup = SystemSetup(engine=engine, messaging=messaging, config=system, npus_per_dim=(n,))
    done: list[int] = []
    for r in range(n):
        dataset = RankSystem(r, setup).generate_collective(kind, size, [True], None, 0)
        dataset.on_done = lambda ns, r=r: done.append(r)
    engine.run()
    return [messaging.sent.get(r, []) for r in range(n)], len(done)


ALGORITHMS = [("ring", "ring"), ("direct", "direct"), ("direct2", "direct"), ("halvingDoubling", "halvingDoubling"),
              ("doubleBinaryTree", "doubleBinaryTree")]


@pytest.mark.parametrize("algorithm,family,n", [(a, f, n) for a, f in ALGORITHMS for n in (2, 4, 8, 6)
                                                if f not in POWER_OF_TWO or not n & (n - 1)])
def test_executor_sends_what_the_plan_describes(algorithm: str, family: str, n: int) -> None:
    size = 4096 * n
    for kind in KINDS[family]:
        sent, finished = executor_traffic(algorithm, kind, n, size)
        assert finished == n, (algorithm, kind, n)
        want = plans.sends_per_rank(plans.describe(family, kind, n, size), n)
        assert sent == want, (algorithm, kind, n)


@pytest.mark.parametrize("algorithm", ["halvingDoubling", "doubleBinaryTree"])
@pytest.mark.parametrize("n", [3, 5, 6, 7])
def test_power_of_two_algorithms_refuse_other_sizes_clearly(algorithm: str, n: int) -> None:
    with pytest.raises(InputError, match=f"power-of-two number of NPUs.*{n}"):
        executor_traffic(algorithm, "all_reduce", n, 4096 * n)
