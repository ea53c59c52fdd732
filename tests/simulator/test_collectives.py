"""Every native algorithm meets its collective's postcondition, and the timed executors send exactly
the traffic of the pure descriptions."""

from __future__ import annotations

from pathlib import Path

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
from tests.conftest import simulate
from workload.errors import InputError
from workload.schema import NodeType
from workload.writer import make_node

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


def _custom_ring_all_reduce(folder: Path, npus: int = 8, size: int = 1 << 20, reduce_us: int = 7) -> str:
    """A ring all-reduce as a custom algorithm ET per rank (what MSCCL-style tools export, like ASTRA-sim's
    custom_ring_allreduce_8npus_1MB example): a send to the next rank, then per reduce-scatter step a receive from
    the previous one, a reduction and a send, then all-gather receive/send steps, and a last receive."""
    from workload.writer import make_node, write_trace

    chunk = size // npus
    prefix = folder / "custom_allreduce"
    for rank in range(npus):
        nxt, prev = (rank + 1) % npus, (rank - 1) % npus
        steps = [("send",)] + [("recv",), ("comp",), ("send",)] * (npus - 1) + [("recv",), ("send",)] * (npus - 2) \
            + [("recv",)]
        nodes = []
        for i, (what,) in enumerate(steps):
            deps = [i - 1] if i else []
            if what == "send":
                nodes.append(make_node(i, f"send{i}", NodeType.COMM_SEND_NODE, data_deps=deps,
                                       attrs={"comm_type": 5, "comm_size": chunk, "comm_dst": nxt, "comm_tag": 0}))
            elif what == "recv":
                nodes.append(make_node(i, f"recv{i}", NodeType.COMM_RECV_NODE, data_deps=deps,
                                       attrs={"comm_type": 6, "comm_size": chunk, "comm_src": prev, "comm_tag": 0}))
            else:
                nodes.append(make_node(i, f"reduce{i}", NodeType.COMP_NODE, data_deps=deps, duration_micros=reduce_us))
        write_trace(prefix.with_name(f"custom_allreduce.{rank}.et"), nodes)
    return str(prefix)


def test_custom_collective_gives_astra_sims_example_number(tmp_path: Path) -> None:
    """ASTRA-sim's custom-collective example (8 NPUs, 1 MiB all-reduce, a ring algorithm given as Chakra ETs, on
    its Ring_8npus network, FIFO, one split) prints 90,174 ns: 7 steps of (message 2,941 ns + reduction 7 us) and 7
    message-only steps."""
    prefix = _custom_ring_all_reduce(tmp_path)
    node = make_node(1, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0, "comm_size": 1 << 20})
    system = {"scheduling-policy": "FIFO", "preferred-dataset-splits": 1, "local-mem-bw": 50,
              "all-reduce-implementation-custom": [prefix]}
    for backend in ("analytical-unaware", "analytical-aware"):
        result = simulate(tmp_path, [[node]] * 8, system=system, backend=backend)
        assert {r.finish_ns for r in result.ranks} == {90_174}, backend


@pytest.mark.parametrize(("system", "message"), [
    ({"preferred-dataset-splits": 4}, "set it to 1"),
    ({"all-reduce-implementation-custom": ["a", "b"]}, "must be a list of one Chakra ET path prefix"),
    ({"per-node-custom-implementation": "x.yaml"}, "is not supported"),
    ({"all-reduce-implementation-custom": ["nowhere/custom"]}, "nowhere/custom.0.et"),
])
def test_custom_collective_errors_say_what_to_fix(tmp_path: Path, system: dict, message: str) -> None:
    from workload.errors import InputError

    prefix = _custom_ring_all_reduce(tmp_path)
    node = make_node(1, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0, "comm_size": 1 << 20})
    base = {"preferred-dataset-splits": 1, "local-mem-bw": 50, "all-reduce-implementation-custom": [prefix]}
    with pytest.raises(InputError, match=message.replace(".", r"\.")):
        simulate(tmp_path, [[node]] * 8, system={**base, **system})


def test_compare_runs_a_custom_algorithm_beside_the_native_ones(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    prefix = _custom_ring_all_reduce(tmp_path)
    network = tmp_path / "ring8.yml"
    network.write_text('{"topology": ["Ring"], "npus_count": [8], "bandwidth": [50], "latency": [500]}')
    done = run_cli("compare", "--network", str(network), "--collective", "all_reduce", "--sizes", "1MiB",
                   "--algorithms", f"ring,custom:{prefix}")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    custom_row = next(line for line in lines if f"custom:{prefix}" in line)
    assert "90.174 µs" in custom_row and any(" ring " in line for line in lines)
