"""GB200 / GB300 NVL72: a node of the collective model is the rack's 72-GPU NVLink domain (NVLS across all of it),
racks joined by one NIC per GPU; the device files carry the datasheet peaks and B200's kernel curves."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from compute.devices import device
from simulator.collectives.hardware import load_profile, parse_profile
from simulator.collectives.nccl import ALL_REDUCE, NVLS, NVLS_TREE, RING, CollectiveModel, Communicator
from tests.conftest import run_cli
from workload.errors import ConfigError

GIB = 1 << 30
PROFILES = {"gb200-nvl72": ("GB200", 400.0), "gb300-nvl72": ("GB300", 800.0)}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profiles_state_the_rack(name: str) -> None:
    gpu, nic_Gbps = PROFILES[name]
    p = load_profile(name)
    assert (p.gpu, p.gpus_per_node, p.arch, p.library) == (gpu, 72, "blackwell", "nccl")
    assert p.scale_up.nvls and p.scale_up.bandwidth_GBps == 900.0  # NVLink 5: 18 x 50 GB/s per direction
    assert p.scale_out is not None and (p.scale_out.nics_per_node, p.scale_out.nic_bandwidth_Gbps) == (72, nic_Gbps)
    # no all-reduce, all-gather or reduce-scatter table of this class: those keys are the 8x B200 NVLink5 fit, and the
    # profile says so; all-to-all is fitted on the rack's own measured exchanges (4-64 GPUs in one domain)
    b200 = load_profile("dgx-b200").parameters()
    mine = p.parameters()
    assert {k: v for k, v in mine.items() if not k.startswith("direct/")} == {
        k: v for k, v in b200.items() if not k.startswith("direct/")}
    assert p.calibration["priors_from"]["profile"] == "dgx-b200"
    assert sorted(p.calibration["tables"]) == ["gb200_nvl72_all_to_all_ep16to64.tsv", "gb200_nvl72_all_to_all_ep8.tsv",
                                               f"oci_{name[:5]}_nvl72_all_to_all.tsv"]
    assert 0.5 < mine["direct/Simple/intra"]["efficiency"] < 0.8
    assert any(a.startswith("calibration: no all-reduce, all-gather or reduce-scatter table of this class")
               for a in p.assumptions)


@pytest.mark.parametrize(("name", "fp4", "curves"), [("GB200", 10000.0, "H100"), ("GB300", 15000.0, "B300")])
def test_devices_have_datasheet_peaks_and_blackwell_curves(name: str, fp4: float, curves: str) -> None:
    """GB200 fits its own maximum-achievable-matmul rows on the Blackwell shape terms (as B200 does); GB300 has no
    kernel rows and takes B300's fit (the same Blackwell Ultra GPU)."""
    d, b200 = device(name), device("B200")
    assert d.peaks_tflops["bf16"] == 2500.0 and d.peaks_tflops["fp8"] == 5000.0 and d.memory_bw_GBps == 8000.0
    assert d.peaks_tflops["fp4"] == fp4 and d.calibration["derived_from"] == curves
    g = d.kernels.gemm
    assert (g.tiles, g.k_fill, g.wave_quantization, g.overlap) == (b200.kernels.gemm.tiles, b200.kernels.gemm.k_fill,
                                                                   b200.kernels.gemm.wave_quantization,
                                                                   b200.kernels.gemm.overlap)
    if curves == "B300":
        assert d.kernels == device("B300").kernels
    assert device(f"DGX-{name}").name == name


def test_one_domain_of_72_runs_nvls_at_every_gpu_count() -> None:
    model = CollectiveModel(load_profile("gb200-nvl72"))
    rack = Communicator(72, 1, 72)
    plan = model.plan(ALL_REDUCE, GIB, rack)
    assert plan.chosen.algorithm == NVLS
    busbw = plan.chosen.bus_bytes / plan.chosen.time_us / 1e3
    ring = model.plan(ALL_REDUCE, GIB, rack, algorithm=RING).chosen
    assert busbw > ring.bus_bytes / ring.time_us / 1e3  # in-switch reduction beats the 142-step ring
    assert 700 < busbw < 900  # NVLS class: the B200 NVLS efficiency on 72 GPUs' 2(n-1)/n
    # each GPU pushes its buffer into the switch and pulls the result once: the time does not grow with the domain
    eight = model.plan(ALL_REDUCE, GIB, Communicator(8, 1, 8)).chosen
    assert plan.chosen.time_us == pytest.approx(eight.time_us, rel=1e-9)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_racks_are_joined_by_one_nic_per_gpu(name: str) -> None:
    model = CollectiveModel(load_profile(name))
    nic_GBps = PROFILES[name][1] / 8
    assert model.network_GBps(Communicator(144, 2, 72)) == pytest.approx(72 * nic_GBps)
    assert model.network_GBps(Communicator(72, 2, 36)) == pytest.approx(36 * nic_GBps)  # half a rack: its NICs
    assert model.network_GBps(Communicator(18, 18, 1)) == pytest.approx(nic_GBps)  # one GPU per rack: one NIC
    two_racks = model.plan(ALL_REDUCE, GIB, Communicator(144, 2, 72))
    assert two_racks.chosen.algorithm == NVLS_TREE
    # one GPU per rack (a data-parallel group across racks): bounded by its own NIC
    spread = model.plan(ALL_REDUCE, GIB, Communicator(4, 4, 1)).chosen
    assert spread.bus_bytes / spread.time_us / 1e3 <= nic_GBps
    assert all(math.isfinite(c.time_us) and c.time_us > 0 for c in two_racks.candidates)


def test_compare_on_an_nvl72_rack(tmp_path: Path) -> None:
    net = tmp_path / "nvl72.yml"
    net.write_text("topology: [ Switch ]\nnpus_count: [ 72 ]\nbandwidth: [ 838.2 ]\nlatency: [ 600.0 ]\n")
    done = run_cli("compare", "--network", str(net), "--collective", "all_reduce", "--sizes", "256MiB,1GiB",
                   "--collective-model", "nccl", "--hw-profile", "gb300-nvl72")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["256MiB"], ["1GiB"])]
    assert [r[-2] for r in rows] == ["nvls/Simple", "nvls/Simple"]
    busbw = [float(r[-4]) for r in rows]
    assert busbw[0] < busbw[1] and 700 < busbw[1] < 900


def test_a_job_beyond_one_rack_lies_in_equal_slices_of_whole_trays() -> None:
    """Megatron-Bridge asks Slurm for the largest number of 4-GPU trays per rack (at most 18) that divides the job's:
    a node of the job's profile is that slice, with the NICs of its GPUs."""
    rack = load_profile("gb200-nvl72")
    slices = {n: (rack.for_job(n).gpus_per_node, rack.for_job(n).scale_out.nics_per_node)  # type: ignore[union-attr]
              for n in (8, 64, 72, 128, 144, 256, 1024, 130)}
    assert slices == {8: (72, 72), 64: (72, 72), 72: (72, 72), 128: (64, 64), 144: (72, 72), 256: (64, 64),
                      1024: (64, 64), 130: (72, 72)}
    hgx = load_profile("dgx-b200")
    assert hgx.for_job(128) is hgx  # one host per node: nothing to place
    with pytest.raises(ConfigError, match="'gpus_per_host' \\(5\\) must divide 'gpus_per_node' \\(72\\)"):
        parse_profile({**_raw("gb200-nvl72"), "gpus_per_host": 5}, "x.yml")


def test_compare_explain_places_128_gpus_as_two_slices_of_64(tmp_path: Path) -> None:
    net = tmp_path / "two_racks.yml"
    net.write_text("topology: [ Switch, Switch ]\nnpus_count: [ 64, 2 ]\nbandwidth: [ 838.2, 46.6 ]\n"
                   "latency: [ 600.0, 2500.0 ]\n")
    done = run_cli("compare", "--network", str(net), "--hw-profile", "gb200-nvl72", "--collective", "all_reduce",
                   "--explain", "1GiB")
    assert done.returncode == 0, done.stderr
    assert "on 128 GPUs, 2 node(s) of gb200-nvl72" in done.stdout
    (chosen,) = [line.split() for line in done.stdout.splitlines() if "<- chosen" in line]
    plan = CollectiveModel(load_profile("gb200-nvl72").for_job(128)).plan(ALL_REDUCE, GIB, Communicator(128, 2, 64))
    assert chosen[:2] == [NVLS_TREE, "Simple"] and plan.chosen.algorithm == NVLS_TREE
    assert float(chosen[-3]) == pytest.approx(plan.chosen.bus_bytes / plan.chosen.time_us / 1e3, abs=0.01)


def _raw(name: str) -> dict[str, object]:
    import yaml

    from simulator.collectives.hardware import PROFILES_DIR

    return yaml.safe_load((PROFILES_DIR / f"{name}.yml").read_text())
