"""--sm-sharing: a running NCCL collective holds one SM per channel, and a GEMM or attention kernel started
meanwhile spreads over the SMs left (its time x S / (S - c)); memory-bound kernels and kernels run alone keep
their time."""

from __future__ import annotations

from pathlib import Path

import pytest

from compute.devices import device
from compute.kernels import KernelModel
from compute.shapes import GemmShape, OpShape
from simulator.collectives.nccl import Communicator
from tests.conftest import simulation
from tests.simulator.test_nccl_run import AR, MODEL, MiB, coll, switch
from workload.errors import InputError
from workload.schema import NodeType
from workload.writer import make_node

RUN = {"collective_model": "nccl", "hw_profile": "hgx-h200", "compute_model": "kernels", "device": "H100"}
GEMM = {"op_class": "gemm", "gemm_m": 8192, "gemm_n": 8192, "gemm_k": 8192, "dtype": "bf16"}
NORM = {"op_class": "norm", "num_ops": 10**8, "tensor_size": 10**9, "dtype": "bf16"}


def kernel(node_id: int, attrs: dict[str, object], deps: list[int] | None = None) -> object:
    return make_node(node_id, f"k{node_id}", NodeType.COMP_NODE, data_deps=deps or [], attrs=attrs)


def gemm_ns() -> int:
    return KernelModel(device("H100")).time_ns(OpShape("gemm", "bf16", gemm=GemmShape(8192, 8192, 8192)), 0, 0)


def spans(sim: object, rank: int) -> dict[str, tuple[int, int]]:
    w = next(w for w in sim.workloads if w.rank == rank)  # type: ignore[attr-defined]
    return {w.graph.name(i): (s, e) for i, s, e in w.timeline.spans}


@pytest.mark.parametrize("attrs, slowed", [(GEMM, True), (NORM, False)])
def test_a_kernel_beside_a_collective(tmp_path: Path, attrs: dict[str, object], slowed: bool) -> None:
    """Both ranks start a large all-reduce and, at once, a kernel that ends long before it."""
    size = 1024 * MiB
    traces = [[coll(1, AR, size), kernel(2, attrs)]] * 2
    alone, _ = simulation(tmp_path, [[kernel(2, attrs)]] * 2, switch(2), timeline=True, **RUN)
    base = spans(alone, 0)["k2"][1]
    shared, _ = simulation(tmp_path, traces, switch(2), timeline=True, sm_sharing=True, **RUN)
    plain, _ = simulation(tmp_path, traces, switch(2), timeline=True, **RUN)
    blocks = MODEL.plan("all_reduce", size, Communicator.of((0, 1), 8)).chosen.channels
    assert spans(plain, 0)["k2"] == (0, base)
    assert spans(shared, 0)["c1"][1] > spans(shared, 0)["k2"][1]  # the kernel ran under the collective
    sms = device("H100").compute_units
    assert spans(shared, 0)["k2"] == (0, -(-base * sms // (sms - blocks)) if slowed else base)
    if slowed:
        assert base == gemm_ns() and 0 < blocks < sms


def test_a_collective_stating_its_sms_holds_those(tmp_path: Path) -> None:
    """A userbuffers collective (comm_sms 16, as Transformer Engine's) holds 16 SMs, not NCCL's channels."""
    size = 1024 * MiB
    traces = [[coll(1, AR, size, comm_sms=16), kernel(2, GEMM)]] * 2
    sim, _ = simulation(tmp_path, traces, switch(2), timeline=True, sm_sharing=True, **RUN)
    sms = device("H100").compute_units
    assert spans(sim, 0)["k2"] == (0, -(-gemm_ns() * sms // (sms - 16)))


def test_a_kernel_after_the_collective_runs_at_full_speed(tmp_path: Path) -> None:
    traces = [[coll(1, AR, 64 * MiB), kernel(2, GEMM, [1])]] * 2
    sim, _ = simulation(tmp_path, traces, switch(2), timeline=True, sm_sharing=True, **RUN)
    start, end = spans(sim, 0)["k2"]
    assert end - start == gemm_ns()


def test_needs_the_nccl_and_kernel_models(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"--sm-sharing\) needs --collective-model nccl"):
        simulation(tmp_path, [[kernel(1, GEMM)]] * 2, switch(2), sm_sharing=True, device="H100",
                   compute_model="kernels")


def test_cli_flag(tmp_path: Path) -> None:
    import json

    from tests.conftest import run_cli, write_trace_file

    folder = tmp_path / "w"
    folder.mkdir()
    for rank in range(2):
        write_trace_file(folder / f"trace.{rank}.et", [coll(1, AR, 1024 * MiB), kernel(2, GEMM)])
    (tmp_path / "n.json").write_text(json.dumps(switch(2)))
    common = ("--workload", str(folder / "trace"), "--network", str(tmp_path / "n.json"), "--collective-model",
              "nccl", "--hw-profile", "hgx-h200", "--compute-model", "kernels", "--device", "H100", "--quiet")
    compute = {}
    for flags in ((), ("--sm-sharing",)):
        out = tmp_path / f"r{len(flags)}.json"
        done = run_cli(*common, *flags, "--json", str(out))
        assert done.returncode == 0, done.stderr
        compute[flags] = json.loads(out.read_text())["ranks"][0]["compute_ns"]
    assert compute[("--sm-sharing",)] > compute[()]
    bad = run_cli(*common[:4], "--sm-sharing")
    assert bad.returncode != 0 and "needs --collective-model nccl" in bad.stderr and "Traceback" not in bad.stderr
