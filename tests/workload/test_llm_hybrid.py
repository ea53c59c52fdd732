"""Hybrid models (Megatron-Core's hybrid_layer_pattern): Mamba-2, attention, MLP and MoE layers of one block each."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compute import kernel_params
from compute.devices import device
from compute.kernels import KernelModel
from tests.conftest import REPO, run_cli
from tests.workload.test_llm import generate, load
from workload.errors import InputError
from workload.llm.build import build_programs
from workload.llm.mamba import MambaMixer
from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan
from workload.llm.presets import preset
from workload.llm.sizes import kind_tensors
from workload.schema import CollectiveType

HYBRID = ModelConfig(name="hybrid", num_layers=4, hidden_size=256, num_heads=8, num_kv_heads=2, head_dim=32,
                     ffn_hidden_size=128, vocab_size=1024, seq_len=512, position_embedding="none", num_experts=4,
                     top_k=2, shared_expert_ffn=256, layer_pattern="M*E-", mamba_heads=8, mamba_head_dim=32,
                     mamba_state_dim=64, mamba_groups=2, mamba_chunk=128)


def layer_names(prefix: str, rank: int, world: int, layer: int, phase: str) -> set[str]:
    trace = load(prefix, rank, world)
    pattern = re.compile(rf"^mb0\.{phase}\.layer{layer}\.(.+)$")
    return {m.group(1) for n in trace.nodes if (m := pattern.match(n.name))}


def test_the_nano_preset_has_its_published_parameters() -> None:
    nano = preset("nemotron-3-nano")
    assert [nano.layer_pattern.count(s) for s in "M*E-"] == [23, 6, 23, 0]
    assert nano.total_params() == pytest.approx(31.6e9, rel=0.005)
    assert nano.active_params() == pytest.approx(3.6e9, rel=0.01)


def test_a_mamba_layers_parameters() -> None:
    # h(2HP + 2GN + H) + (HP + 2GN)(K + 1) + 3H + HP + HP h, and its pre-norm's h
    m, h = HYBRID, HYBRID.hidden_size
    hp, gn, heads, k = 8 * 32, 2 * 64, 8, 4
    mixer = h * (2 * hp + 2 * gn + heads) + (hp + 2 * gn) * (k + 1) + 3 * heads + hp + hp * h
    assert m.kind_params("M").dense == mixer + h
    assert m.kind_params("M", tp=2).dense == mixer // 2 + h  # heads, groups and their channels split; norm whole


@pytest.mark.parametrize("symbol", ["M", "*", "E", "-"])
@pytest.mark.parametrize("tp", [1, 2])
def test_gradient_tensors_add_up_to_the_layers_parameters(symbol: str, tp: int) -> None:
    plan = ParallelPlan(tp=tp, ep=2, dp=2, sequence_parallel=tp > 1)
    layer = HYBRID.kind_params(symbol, plan.tp, plan.ep, plan.expert_tp)
    tensors = kind_tensors(HYBRID, plan, symbol)
    assert sum(n for buf, n in tensors.values() if buf == "dense") == layer.dense
    assert sum(n for buf, n in tensors.values() if buf == "expert") == layer.expert


def test_each_layer_runs_its_one_block(tmp_path: Path) -> None:
    prefix, plan = generate(tmp_path, HYBRID, tp=2, ep=2, dp=2, sequence_parallel=True, num_micro_batches=1)
    world = plan.world_size
    mamba, attention, moe, mlp = (layer_names(prefix, 0, world, i, "fwd") for i in range(4))
    assert {"mamba_norm", "mamba_in", "mamba_conv", "ssd_cumsum", "ssd_chunk_cb", "ssd_chunk_state",
            "ssd_state_passing", "ssd_chunk_scan", "mamba_gated_norm", "mamba_out"} <= mamba
    assert not any(n.startswith(("attn", "mlp", "expert", "router")) for n in mamba)
    assert "attention" in attention and not any(n.startswith(("mlp", "mamba", "ssd")) for n in attention)
    assert "router" in moe and not any(n.startswith(("attn", "mamba", "ssd")) for n in moe)
    assert "mlp_in" in mlp and "router" not in mlp and "attention" not in mlp
    # Mamba's backward reruns the scan's first kernels (mamba_ssm's memory-efficient path), then their gradients
    trace = load(prefix, 0, world)
    assert any(n.name == "mb0.recompute.layer0.ssd_chunk_state" for n in trace.nodes)
    backward = layer_names(prefix, 0, world, 0, "bwd")
    assert {"ssd_chunk_scan_dgrad", "ssd_chunk_state_wgrad", "mamba_in_dgrad", "mamba_conv_bwd"} <= backward
    # tensor parallelism: in_proj column- and out_proj row-parallel, as a dense layer's GEMMs (sequence parallel)
    gathers = trace.collectives(CollectiveType.ALL_GATHER, "mb0.fwd.layer0.")
    scatters = trace.collectives(CollectiveType.REDUCE_SCATTER, "mb0.fwd.layer0.")
    assert len(gathers) == 1 and len(scatters) == 1


def test_the_scan_is_timed_on_its_bytes_at_a_fraction_of_the_bandwidth() -> None:
    mixer = MambaMixer(preset("nemotron-3-nano"), 4, 8192, 1, ("", ""), 2)
    model = KernelModel(device("H100"))
    launch_us, elementwise = model.params.memory.of("elementwise")
    bandwidth = model.bandwidth * elementwise * kernel_params.SCAN_BANDWIDTH_FRACTION * model.params.scale("memory")
    for kernel in mixer.scan_forward:
        assert kernel.category == "scan" and kernel.shape is not None and kernel.shape.op_class == "scan"
        # its bytes at the fraction of the element-wise bandwidth (the products' FLOPs at the tensor cores' peak
        # would take less), one launch
        assert kernel.flops / model.device.peak_flops("bf16") < kernel.size_bytes / bandwidth
        assert model.seconds(kernel.shape, kernel.flops, kernel.size_bytes) == \
            pytest.approx(launch_us * 1e-6 + kernel.size_bytes / bandwidth)


def test_the_scan_fraction_is_the_fit_of_its_published_timings() -> None:
    spec = importlib.util.spec_from_file_location("ssd_kernels", REPO / "benchmarks" / "ssd_kernels.py")
    assert spec is not None and spec.loader is not None
    ssd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ssd)
    assert ssd.fit() == kernel_params.SCAN_BANDWIDTH_FRACTION
    errors = [ssd.predicted_us(r, kernel_params.SCAN_BANDWIDTH_FRACTION) / float(r["fwd_us"]) - 1 for r in ssd.rows()]
    assert sorted(errors)[len(errors) // 2] == pytest.approx(0, abs=0.05)  # the median row
    assert max(map(abs, errors)) < 0.75


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.sampled_from([64, 128, 256]), st.sampled_from([64, 128]))
def test_the_scan_takes_longer_with_more_heads_tokens_and_state(heads: int, seq_len: int, state: int) -> None:
    model = KernelModel(device("B200"))

    def scan_s(m: ModelConfig, seq: int) -> float:
        mixer = MambaMixer(m, 2, seq, 1, ("", ""), 2)
        return sum(model.seconds(k.shape, k.flops, k.size_bytes) for k in mixer.forward + mixer.backward)

    base = replace(HYBRID, mamba_heads=2 * heads, mamba_state_dim=state)
    assert scan_s(replace(base, mamba_heads=4 * heads), seq_len) >= scan_s(base, seq_len)
    assert scan_s(base, 2 * seq_len) >= scan_s(base, seq_len)
    assert scan_s(replace(base, mamba_state_dim=2 * state), seq_len) >= scan_s(base, seq_len)


def test_recompute_module_moe_reruns_the_whole_block_with_its_exchanges(tmp_path: Path) -> None:
    plan = ParallelPlan(ep=2, dp=2, num_micro_batches=1, recompute="selective", recompute_modules=("moe",))
    programs = build_programs(HYBRID, plan, TrainingOptions())
    names = [op.name for op in programs[0].ops]
    assert "mb0.recompute.layer2.dispatch_alltoall" in names and "mb0.recompute.layer2.expert_in" in names
    assert not any(n.startswith("mb0.recompute.layer3.") for n in names)  # the dense MLP layer is not a MoE block


@pytest.mark.parametrize(("change", "message"), [
    ({"layer_pattern": "M*E"}, "layer_pattern has 3 layers, num_layers is 4"),
    ({"layer_pattern": "M*EX"}, "unknown symbol(s) X"),
    ({"layer_pattern": "M*--"}, "has no mixture-of-experts layers (E) but the model has 4 expert(s)"),
    ({"mamba_heads": 7}, "need mamba_heads, a multiple of mamba_groups 2"),
    ({"dense_layers": 1}, "dense_layers does not apply to a hybrid model"),
    ({"layer_pattern": ""}, "mamba_heads describes the Mamba layers"),
])
def test_bad_hybrid_models_are_one_line_errors(change: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as e:
        replace(HYBRID, **change).validate()
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("plan", "message"), [
    ({"tp": 4, "dp": 2}, "8 Mamba heads in 2 groups are not divisible by tp=4"),
    ({"cp": 2, "dp": 2}, "context parallelism in Mamba layers"),
])
def test_plans_a_mamba_layer_cannot_run_are_one_line_errors(plan: dict[str, int], message: str) -> None:
    with pytest.raises(InputError) as e:
        ParallelPlan(**plan).validate(replace(HYBRID, num_kv_heads=8))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_cli_generates_and_simulates_a_hybrid_model(tmp_path: Path) -> None:
    out = run_cli("trace", "generate", "llm", "--preset", "nemotron-3-nano", "--layers", "4",
                  "--hybrid-layer-pattern", "M*EM", "--seq-len", "1024", "--ep", "2", "--dp", "2",
                  "--global-batch", "4", "--summary", "--device", "H100", "--out", str(tmp_path / "nano"))
    assert out.returncode == 0, out.stderr
    assert "Mamba-2 scans" in out.stdout and "predicted step" in out.stdout
    # the trace files carry the scan kernels' class: the kernel model times every node by its shape
    network = tmp_path / "n.yml"
    network.write_text('{"topology": ["Switch"], "npus_count": [2], "bandwidth": [400], "latency": [500]}')
    prefix = out.stdout.splitlines()[0]
    sim = run_cli("--workload", prefix, "--network", str(network), "--device", "H100", "--compute-model", "kernels",
                  "--quiet")
    assert sim.returncode == 0 and "no usable operator shape" not in sim.stderr, sim.stderr
    bad = run_cli("trace", "generate", "llm", "--preset", "nemotron-3-nano", "--layers", "4", "--out",
                  str(tmp_path / "bad"))
    assert bad.returncode != 0 and "layer_pattern has 52 layers, num_layers is 4" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
