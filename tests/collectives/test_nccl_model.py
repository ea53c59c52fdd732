"""The NCCL/RCCL-like collective model: selection, timing invariants, profiles, and accuracy on published tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.collectives.calibration import calibrate, predict, read_table, summarize
from simulator.collectives.hardware import load_profile, parse_profile, profile_names
from simulator.collectives.nccl import (
    ALL_REDUCE,
    COLLNET,
    NVLS,
    NVLS_TREE,
    RING,
    TREE,
    CollectiveModel,
    Communicator,
)
from tests.conftest import SHARED, run_cli
from workload.errors import ConfigError, InputError

TABLES = SHARED / "reference" / "hardware" / "nccl-tests"
REPO = Path(__file__).resolve().parents[2]
# Each shared table and the shipped profile of the same machine.
MATCHING = {
    "azure_ndv4_a100_1node_all_reduce.tsv": "azure-ndv4-a100",
    "azure_ndv4_a100_16_32gpu_all_reduce.tsv": "azure-ndv4-a100",
    "h200_nvlink4_8gpu_all_reduce_torchbench.tsv": "hgx-h200",
    "h200_nvlink4_8gpu_16GiB_ar_ag_rs.tsv": "hgx-h200",
    "b200_nvlink5_8gpu_all_reduce_torchbench.tsv": "aws-p6-b200",
    "mi300x_xgmi_8gpu_all_reduce_rccl.tsv": "mi300x",
    "mi325x_roce_1to8node_ring_all_reduce_rccl.tsv": "mi325x",
}
SHIPPED = ("dgx-a100", "azure-ndv4-a100", "hgx-h100", "gcp-a3-mega", "hgx-h200", "dgx-b200", "aws-p6-b200",
           "gb200-nvl72", "gb300-nvl72", "mi300x", "mi325x", "mi355x")
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def needs_tables() -> None:
    if not TABLES.is_dir():
        pytest.skip("needs ../shared/reference/hardware/nccl-tests (published measurements) beside this checkout")


def test_every_named_profile_ships_and_loads() -> None:
    assert set(SHIPPED) <= set(profile_names())
    for name in SHIPPED:
        profile = load_profile(name)
        assert profile.parameters(), f"{name} is not calibrated"
        assert profile.assumptions and profile.sources


def test_h200_selection_matches_the_nccl_log() -> None:
    """NCCL 2.27.7 on 8x H200 logged Ring/LL up to 1 MiB and NVLS/Simple from 2 MiB."""
    model = CollectiveModel(load_profile("hgx-h200"))
    comm = Communicator.packed(8, 1)
    for size in (32 << 10, 256 << 10, 1 << 20):
        chosen = model.plan(ALL_REDUCE, size, comm).chosen
        assert (chosen.algorithm, chosen.protocol) == (RING, "LL"), size
    for size in (2 << 20, 64 << 20, 16 << 30):
        chosen = model.plan(ALL_REDUCE, size, comm).chosen
        assert (chosen.algorithm, chosen.protocol) == (NVLS, "Simple"), size


def test_forced_rows_run_the_forced_algorithm() -> None:
    needs_tables()
    for table in ("h200_nvlink4_8gpu_16GiB_ar_ag_rs.tsv", "mi325x_roce_1to8node_ring_all_reduce_rccl.tsv"):
        model = CollectiveModel(load_profile(MATCHING[table]))
        for p in predict(model, read_table(str(TABLES / table))):
            if p.row.algo:
                assert p.algorithm == RING


def test_an_algorithm_the_machine_lacks_is_refused() -> None:
    model = CollectiveModel(load_profile("mi300x"))
    with pytest.raises(InputError, match="valid: msccl, ring, tree"):
        model.plan(ALL_REDUCE, 1 << 20, Communicator.packed(8, 1), "nvls")


def test_rccl_runs_its_msccl_programs_where_they_apply() -> None:
    """RCCL on an 8x MI300X node runs its all-pairs MSCCL programs inside their size windows, for element counts
    (4-byte elements) that split into their chunks; elsewhere, and across nodes, its own tuning model picks."""
    model = CollectiveModel(load_profile("mi300x"))
    node = Communicator.packed(8, 1)
    expect = {512: None, 1 << 10: ("LL", 4), 64 << 10: ("LL", 4), 256 << 10: ("LL", 8), 1 << 20: ("Simple", 8),
              11 << 20: ("Simple", 8), 12 << 20: None, 16 << 20: ("Simple", 8), 32 << 20: None, 1028: None}
    for size, program in expect.items():
        chosen = model.plan(ALL_REDUCE, size, node).chosen
        got = (chosen.protocol, chosen.channels) if chosen.algorithm == "msccl" else None
        assert got == program, size
    assert model.plan(ALL_REDUCE, 1 << 20, Communicator.packed(16, 2)).chosen.algorithm != "msccl"
    assert model.plan(ALL_REDUCE, 1 << 20, Communicator.packed(4, 1)).chosen.algorithm != "msccl"
    assert model.plan(ALL_REDUCE, 1 << 20, node, "ring").chosen.algorithm == RING
    assert CollectiveModel(load_profile("hgx-h200")).plan(ALL_REDUCE, 1 << 20, node).chosen.algorithm != "msccl"


# Accuracy on the shared tables, with the matching shipped profile. The targets are geomean |error| <= 5%
# for sizes >= 64 KiB, <= 15% below, and no size >= 1 MiB off by more than 20%.
BOUNDS: dict[str, dict[str, float]] = {}


@pytest.mark.parametrize("table", sorted(MATCHING))
def test_validation_error_on_published_tables(table: str) -> None:
    needs_tables()
    model = CollectiveModel(load_profile(MATCHING[table]))
    (summary,) = summarize(predict(model, read_table(str(TABLES / table))))
    bounds = {"ge_64KiB": 0.05, "lt_64KiB": 0.15, **BOUNDS.get(table, {})}
    assert (summary["geomean_abs_error_ge_64KiB"] or 0) <= bounds["ge_64KiB"], summary
    assert (summary["geomean_abs_error_lt_64KiB"] or 0) <= bounds["lt_64KiB"], summary
    assert (summary["max_abs_error_ge_1MiB"] or 0) <= 0.20, summary


def test_calibration_is_deterministic_and_reproduces_the_shipped_profile() -> None:
    needs_tables()
    rows = [m for t in ("h200_nvlink4_8gpu_all_reduce_torchbench.tsv", "h200_nvlink4_8gpu_16GiB_ar_ag_rs.tsv")
            for m in read_table(str(TABLES / t))]
    rows += read_table(str(REPO / "benchmarks" / "data" / "moe_dispatch" / "h100_all_to_all_ep8.tsv"))
    profile = load_profile("hgx-h200")
    first, second = calibrate(profile, rows), calibrate(profile, rows)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert first["parameters"] == profile.parameters()


# --- invariants (hypothesis) -------------------------------------------------------------------------------------
@st.composite
def situations(draw: st.DrawFn) -> tuple[CollectiveModel, str, Communicator]:
    model = CollectiveModel(load_profile(draw(st.sampled_from(SHIPPED))))
    kind = draw(st.sampled_from(KINDS))
    nodes = draw(st.sampled_from((1, 1, 2, 4, 16)))
    per_node = draw(st.integers(1, model.profile.gpus_per_node))
    ranks = 2 if kind == "send_recv" else max(2, nodes * per_node)
    if kind == "send_recv":
        nodes, per_node = (1, 2) if nodes == 1 else (2, 1)
    return model, kind, Communicator(ranks, nodes, per_node)


@settings(max_examples=60, deadline=None)
@given(situations(), st.integers(1, 1 << 34), st.integers(1, 1 << 34))
def test_time_grows_with_size_for_a_fixed_algorithm_and_protocol(s, a: int, b: int) -> None:
    model, kind, comm = s
    small, large = sorted((a, b))
    for pair in model.enabled(kind, comm):
        t_small = model.candidate(*pair, kind, small, comm).time_us
        t_large = model.candidate(*pair, kind, large, comm).time_us
        assert 0 < t_small <= t_large + 1e-9, pair


@settings(max_examples=60, deadline=None)
@given(situations(), st.integers(1, 1 << 36))
def test_rings_and_trees_never_beat_their_links(s, size: int) -> None:
    """Only NVLS and SHARP reduce in the switch and may show a bus bandwidth above the links'; a tree of two nodes
    may show up to twice the NICs' (each byte crosses them once each way, where a ring's crosses twice)."""
    model, kind, comm = s
    links = min(model.scale_up_GBps(comm.per_node), model.network_GBps(comm))
    for algorithm, protocol in model.enabled(kind, comm):
        c = model.candidate(algorithm, protocol, kind, size, comm)
        assert c.time_us > 0 and math.isfinite(c.time_us)
        if algorithm == RING or (algorithm == TREE and comm.nodes != 2):
            assert c.busbw_GBps <= links * (1 + 1e-9), (algorithm, protocol)
        elif algorithm == TREE:  # two nodes: each node's buffer crosses its NICs once each way, not twice as a ring's
            assert c.busbw_GBps <= min(model.scale_up_GBps(comm.per_node),
                                       links * 2 * (comm.ranks - 1) / comm.ranks) * (1 + 1e-9)
        elif algorithm not in (NVLS, NVLS_TREE, COLLNET):
            assert c.busbw_GBps <= model.raw_busbw(algorithm, kind, comm) * (1 + 1e-9)


# --- profiles and commands ---------------------------------------------------------------------------------------
def test_profile_errors_are_one_line() -> None:
    with pytest.raises(InputError, match="valid: aws-p4d-a100, aws-p5-h100, aws-p6-b200"):
        load_profile("no-such-box")
    good = {"name": "x", "gpu": "g", "gpus_per_node": 8, "library": "nccl", "library_version": "2", "arch": "hopper",
            "scale_up": {"fabric": "nvswitch", "links_per_gpu": 18, "link_bandwidth_GBps": 25, "latency_us": 1}}
    parse_profile(good, "p.yml")
    program = {"collective": "all_reduce", "gpus": 8, "protocol": "LL", "min_bytes": 0, "max_bytes": 65536,
               "chunks_per_loop": 256, "channels": 4}
    assert parse_profile({**good, "msccl": [program]}, "p.yml").msccl[0].max_bytes == 65536
    for bad in ({**good, "gpus_per_node": True}, {**good, "arch": "pascal"}, {**good, "msccl": program},
                {**good, "msccl": [{**program, "protocol": "ll"}]}, {**good, "msccl": [{**program, "max_bytes": -1}]},
                {**good, "scale_up": {**good["scale_up"], "link_bandwidth_GBps": float("nan")}},
                {**good, "extra": 1}, {**good, "calibration": {"parameters": {"ring/LL": {}}}}):
        with pytest.raises(ConfigError):
            parse_profile(bad, "p.yml")


def test_validate_and_calibrate_commands(tmp_path: Path) -> None:
    needs_tables()
    table = str(TABLES / "h200_nvlink4_8gpu_all_reduce_torchbench.tsv")
    out = tmp_path / "cal.yml"
    done = run_cli("calibrate", "--profile", "hgx-h200", "--tables", table, "-o", str(out))
    assert done.returncode == 0, done.stderr
    report = tmp_path / "v.json"
    done = run_cli("validate", "--profile", str(out), "--tables", table, "--json", str(report))
    assert done.returncode == 0, done.stderr
    assert "nvls" in done.stdout and "geomean" in done.stdout
    data = json.loads(report.read_text())
    row = data["rows"][0]
    for key in ("system", "collective", "gpus", "nodes", "bytes", "busbw_GBps", "predicted_busbw_GBps", "algorithm",
                "protocol", "error"):
        assert key in row
    assert math.isclose(row["error"], row["predicted_busbw_GBps"] / row["busbw_GBps"] - 1, abs_tol=1e-3)
    bad = tmp_path / "bad.tsv"
    bad.write_text("system\tcollective\tgpus\tnodes\tbytes\tbusbw_GBps\nx\tall_reduce\t8\t1\tmany\t3\n")
    done = run_cli("validate", "--profile", "hgx-h200", "--tables", str(bad))
    assert done.returncode == 1 and "line 2" in done.stderr and "Traceback" not in done.stderr


def test_validate_says_its_geomean_is_of_factors(tmp_path: Path) -> None:
    """A table the model under-predicts by a third on every row: the summary's geomean (of factors) is 50% while the
    largest |error| is 33%; the output says what each number is, so the pair does not read as a contradiction."""
    model = CollectiveModel(load_profile("hgx-h200"))
    sizes = [1 << 20, 1 << 24, 1 << 28]
    busbw = [model.plan("all_reduce", s, Communicator(8, 1, 8)).chosen.busbw_GBps * 1.5 for s in sizes]
    table = tmp_path / "low.tsv"
    table.write_text("system\tcollective\tgpus\tnodes\tbytes\tbusbw_GBps\n"
                     + "".join(f"x\tall_reduce\t8\t1\t{s}\t{b:.6f}\n" for s, b in zip(sizes, busbw, strict=True)))
    done = run_cli("validate", "--profile", "hgx-h200", "--tables", str(table))
    assert done.returncode == 0, done.stderr
    summary = done.stdout.splitlines()[-2].split()
    assert summary[0] == "low.tsv" and summary[2] == "50.0%" and summary[-1] == "33.3%"
    assert done.stdout.splitlines()[-1] == ("(geomean |error| = exp(mean |ln(predicted / published)|) - 1, a factor: "
                                            "33% too low counts as 49%, as 49% too high does; max = the largest "
                                            "|predicted / published - 1|)")


def test_rows_the_profiles_nodes_cannot_hold_are_refused(tmp_path: Path) -> None:
    """12 GPUs on one node of an 8-GPU profile: validate printed a 147% error and calibrate fitted to it; both
    now refuse the row on one line naming table and line."""
    table = tmp_path / "t.tsv"
    table.write_text("system\tcollective\tgpus\tnodes\tbytes\tbusbw_GBps\nx\tall_reduce\t8\t1\t1048576\t100\n"
                     "x\tall_reduce\t12\t1\t1048576\t100\n")
    for command in (("validate",), ("calibrate", "-o", str(tmp_path / "c.yml"))):
        done = run_cli(*command, "--profile", "hgx-h100", "--tables", str(table))
        assert done.returncode == 1 and done.stdout == "" and not (tmp_path / "c.yml").exists()
        assert done.stderr == ("astrasim-py: error: t.tsv: line 3: 12 GPUs on 1 node(s) is 12 per node, but profile "
                               "hgx-h100 has 8 GPUs per node\n")


def test_compare_explain_lists_every_candidate() -> None:
    done = run_cli("compare", "--network", "configs/network/hgx_h100_8.yml", "--hw-profile", "hgx-h200",
                   "--collective", "all_reduce", "--explain", "2MiB", cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    chosen = [line for line in lines if "<- chosen" in line]
    assert len(chosen) == 1 and chosen[0].split()[:2] == ["nvls", "Simple"]
    assert sum(line.split()[0] in ("ring", "tree", "nvls") for line in lines[2:] if line.split()) == 7
    done = run_cli("compare", "--network", "configs/network/hgx_h100_8.yml", "--collective", "all_reduce",
                   "--explain", "1MiB", cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1 and "needs --hw-profile" in done.stderr


def test_compare_explain_says_who_picked_when_it_was_not_the_lowest_estimate() -> None:
    """A tuner plugin or an MSCCL program goes before the library's estimates: the header said 'the library picks
    the lowest estimate' above p5's ring/LL128 (tuner) while tree/LL128's estimate was lower."""
    repo = Path(__file__).resolve().parents[2]
    done = run_cli("compare", "--network", "configs/network/hgx_h100_4x8.yml", "--hw-profile", "aws-p5-h100",
                   "--collective", "all_reduce", "--explain", "256MiB", cwd=repo)
    assert done.returncode == 0, done.stderr
    header, _, chosen, *rest = done.stdout.splitlines()
    estimates = {tuple(line.split()[:2]): line for line in rest if line.split()[:1] in (["ring"], ["tree"])}
    assert "<- chosen" in chosen and chosen.split()[:2] == ["ring", "LL128"] and ("tree", "LL128") in estimates
    assert "the tuner plugin aws-ofi-nccl/p5 picks ring/LL128 over the library's lowest estimate (tree/LL128)" in header
    done = run_cli("compare", "--network", "configs/network/hgx_h100_8.yml", "--hw-profile", "mi300x",
                   "--collective", "all_reduce", "--explain", "64KiB", cwd=repo)
    assert "the library runs its MSCCL program for this call before its estimates" in done.stdout.splitlines()[0]


def _fit_and_predict(profile: str, tables: list[str], held: Any) -> dict[str, Any]:
    from dataclasses import replace

    rows = [m for t in tables for m in read_table(str(TABLES / t))]
    fit = [r for r in rows if not held(r)]
    section = calibrate(load_profile(profile), fit)
    model = CollectiveModel(replace(load_profile(profile), calibration={"parameters": section["parameters"]}))
    return summarize(predict(model, [replace(r, table="held") for r in rows if held(r)]))[0]


def test_a_fit_carries_to_node_counts_it_did_not_see() -> None:
    """Fitted on some node counts, the model predicts others (benchmarks/holdout_validation.py prints them all)."""
    needs_tables()
    a100 = ["azure_ndv4_a100_1node_all_reduce.tsv", "azure_ndv4_a100_16_32gpu_all_reduce.tsv"]
    for held in (lambda r: r.gpus == 32, lambda r: r.gpus == 16):
        summary = _fit_and_predict("dgx-a100", a100, held)
        assert summary["geomean_abs_error_ge_64KiB"] <= 0.06 and summary["max_abs_error_ge_1MiB"] <= 0.12, summary
    summary = _fit_and_predict("mi325x", ["mi325x_roce_1to8node_ring_all_reduce_rccl.tsv"], lambda r: r.nodes >= 4)
    assert summary["max_abs_error_ge_1MiB"] <= 0.05, summary
    # 2 and 4 GPUs from 8: the latency per ring step and Simple's start-up carry; LL's mid sizes less (README)
    small = _fit_and_predict("dgx-a100", a100, lambda r: r.gpus in (2, 4))
    assert small["geomean_abs_error_lt_64KiB"] <= 0.15 and small["geomean_abs_error_ge_64KiB"] <= 0.25, small
    assert small["max_abs_error_ge_1MiB"] <= 0.40, small


def test_rows_that_only_see_latency_leave_the_size_terms_at_the_priors() -> None:
    """MI300X's table has ring/LL only at 8-512 B, where moving the bytes is under 0.1% of the time: its 16 -> 23 us
    step set the ring's efficiency to 0.0004, so a forced ring of 512 KiB took 5 ms (busbw 0.18 GB/s) and an
    all-gather of 512 KiB, which the library runs as ring/LL, 2.5 ms."""
    needs_tables()
    from simulator.collectives.calibration import BANDWIDTH_SHARE_MIN, SIZE_TERMS, _prior, bandwidth_share, fit_key

    rows = read_table(str(TABLES / "mi300x_xgmi_8gpu_all_reduce_rccl.tsv"))
    from dataclasses import replace

    bare = CollectiveModel(replace(load_profile("mi300x"), calibration={}))
    tiny = [(r, RING, "LL") for r in rows if r.size_bytes <= 512]
    prior = _prior(bare, *tiny[0])
    assert bandwidth_share(bare, tiny, prior) < BANDWIDTH_SHARE_MIN
    params, _ = fit_key(bare, tiny)
    for k in SIZE_TERMS:
        assert params[k] == pytest.approx(prior[k], rel=0.01), k
    node = Communicator.packed(8, 1)
    shipped = CollectiveModel(load_profile("mi300x"))
    assert shipped.plan(ALL_REDUCE, 512 << 10, node, "ring").chosen.busbw_GBps > 10
    assert shipped.plan("all_gather", 512 << 10, node).chosen.time_us < 100


@pytest.mark.parametrize("name", profile_names())
def test_calibrated_times_stay_near_the_librarys_estimates(name: str) -> None:
    """No candidate of a shipped profile is timed more than 10x from the library's own estimate at any size: a fit
    far off it took a key's size terms from rows that could not tell them (MI300X's ring/LL: 1,210x at 1 GiB).
    The largest measured gap is A100's LL at 2 GPUs, about 6x at 512 KiB (docs: LL's rise at 2 and 4 GPUs)."""
    model = CollectiveModel(load_profile(name))
    g = model.profile.gpus_per_node
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        for ranks, nodes in ((2, 1), (g, 1), (2 * g, 2), (4 * g, 4)):
            for size in (1 << 10, 1 << 16, 1 << 19, 1 << 22, 1 << 26, 1 << 30):
                for c in model.plan(kind, size, Communicator.packed(ranks, nodes)).candidates:
                    assert 0.1 < c.time_us / c.library_us < 10, (kind, ranks, nodes, size, c)


def test_a_fit_finds_the_efficiency_where_another_bound_hides_its_slope() -> None:
    """OCI B300's 2-node rows (8 and 16 GiB, NVLS-tree) are slower than the prior; at the prior efficiency the
    scale-up stage is the slower one, so the efficiency had no slope and the fit took a 4.5 ms start-up instead:
    4 MiB then took 4.5 ms, 63x the library's estimate. A start at the efficiency the rows ask for finds it."""
    from dataclasses import replace

    table = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "unseen" / \
        "oci_b300_1to2node_all_reduce_all_to_all.tsv"
    profile = load_profile("oci-b300")
    section = calibrate(profile, read_table(str(table)))
    fitted = section["parameters"]["nvls_tree/Simple/inter"]
    assert fitted["fill_us"] < 10 and fitted["efficiency"] < 0.8, fitted
    assert section["residuals"][0]["max_abs_error_ge_1MiB"] < 0.05, section["residuals"]
    model = CollectiveModel(replace(profile, calibration={"parameters": section["parameters"]}))
    chosen = model.plan(ALL_REDUCE, 4 << 20, Communicator.packed(16, 2), "nvls_tree").chosen
    assert chosen.time_us < 3 * chosen.library_us, chosen


# Repository tables (benchmarks/data/moe_dispatch/, benchmarks/data/blackwell_nccl/): Megatron-Core's measured NCCL
# all-to-all dispatch and NVLink 5 nccl-tests-style peaks the profiles were fitted on, and the H100 multi-node
# exchanges, which no profile was fitted to.
REPO_TABLES = {"moe_dispatch/gb200_nvl72_all_to_all_ep8.tsv": ("gb200-nvl72", 0.05),
               "moe_dispatch/gb200_nvl72_all_to_all_ep16to64.tsv": ("gb200-nvl72", 0.05),
               "moe_dispatch/h100_all_to_all_ep8.tsv": ("hgx-h100", 0.02),
               "moe_dispatch/h100_all_to_all_2to8node.tsv": ("hgx-h100", 0.10),
               "blackwell_nccl/b200_nvlink5_8gpu_16GiB_ag_rs_a2a.tsv": ("dgx-b200", 0.03),
               "blackwell_nccl/oci_gb200_nvl72_all_to_all.tsv": ("gb200-nvl72", 0.05),
               "blackwell_nccl/oci_gb300_nvl72_all_to_all.tsv": ("gb300-nvl72", 0.05)}


@pytest.mark.parametrize("table", sorted(REPO_TABLES))
def test_repository_tables_within_bounds(table: str) -> None:
    name, bound = REPO_TABLES[table]
    model = CollectiveModel(load_profile(name))
    (summary,) = summarize(predict(model, read_table(str(REPO / "benchmarks" / "data" / table))))
    assert summary["geomean_abs_error_ge_1MiB"] <= bound, summary
    assert summary["max_abs_error_ge_1MiB"] <= 0.15, summary
